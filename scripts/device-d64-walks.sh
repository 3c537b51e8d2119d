#!/usr/bin/env bash
# On the lent GPU machine: the open questions of d = 64's dK/dV walks for pattern blocks of 16
# (docs/attention.md, "Packing counts whole tiles", which has its forty-fifth session run). Runs the GPU
# tests of the d = 64 tile choice first (SJIT_BACKWARD_QUERY_TILES included), then each window on
# 64-query tiles packed (the rule's walk there) and contiguous (SJIT_BACKWARD_WALK=tiles), and on
# 128-query tiles, with 1, 2 and 4 query heads a K/V head. Logs in $OUT. Usage there (carrying .deps):
#   bash scripts/device-d64-walks.sh
set -uo pipefail
source scripts/device-build.sh
timeout 120 ./build-gpu/tests/sjit_gpu_tests "at d = 64 short windows*" >"$OUT/gpu-tests.log" 2>&1
echo "gpu tests exit $?"; grep -E "FAILED|failed|passed|with expansion|seed" "$OUT/gpu-tests.log" | head -10
shape="--d 64 --batch 4 --heads 32 --seq 4096 --queued --backward --iters 10 --block 16"
for heads_kv in 32 16 8; do
  for window in 4,3 5,4 6,5 8,7; do
    for way in "64 auto" "64 tiles" "128 auto"; do
      read -r cols walk <<<"$way"
      # shellcheck disable=SC2086
      SJIT_BACKWARD_QUERY_TILES=$cols SJIT_BACKWARD_WALK=$walk timeout 60 ./build-gpu/sjit bench attention $shape \
        --heads-kv "$heads_kv" --window "$window" 2>&1 | grep -E "^bsr" |
        awk -F'  +' -v w="hkv $heads_kv window $window cols $cols walk $walk" '{print w, "| bwd", $10, $11}'
    done
  done
done | tee "$OUT/walks.log"

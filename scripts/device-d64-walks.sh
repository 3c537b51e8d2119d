#!/usr/bin/env bash
# On the lent GPU machine: d = 64's dK/dV walks for windows of pattern blocks of 16, on 64- or
# 128-query tiles (docs/attention.md, "Packing counts whole tiles", which has its forty-fifth session
# run). Runs the GPU tests of the d = 64 tile choice first (SJIT_BACKWARD_QUERY_TILES included), then
# each window on 64-query tiles with the rule's walk and contiguous (SJIT_BACKWARD_WALK=tiles), and on
# 128-query tiles with the rule's walk, with 1, 2 and 4 query heads a K/V head; one round (ROUNDS).
# Logs in $OUT. Usage there (carrying .deps):
#   bash scripts/device-d64-walks.sh
set -uo pipefail
source scripts/device-build.sh
source scripts/device-forced.sh
timeout 120 ./build-gpu/tests/sjit_gpu_tests -w NoTests "at d = 64 short windows*" >"$OUT/gpu-tests.log" 2>&1
echo "gpu tests exit $?"; grep -E "FAILED|failed|passed|with expansion|seed" "$OUT/gpu-tests.log" | head -10
lines=()
for heads_kv in 32 16 8; do
  for window in 4,3 5,4 6,5 8,7; do
    lines+=("|--d 64 --batch 4 --heads 32 --seq 4096 --heads-kv $heads_kv --block 16 --window $window")
  done
done
ways=("SJIT_BACKWARD_QUERY_TILES=64" "SJIT_BACKWARD_QUERY_TILES=64 SJIT_BACKWARD_WALK=tiles"
      "SJIT_BACKWARD_QUERY_TILES=128")
ROUNDS=${ROUNDS:-1} bench_forced | tee "$OUT/walks.log"

#!/usr/bin/env bash
# On the lent GPU machine: every GPU test, then the attention forward + backward benchmarks of issues 6
# and 7 timed both ways (each run alone, and --queued). Logs in $OUT. Usage there (carrying .deps):
#   bash scripts/device-queued.sh
set -uo pipefail
source scripts/device-build.sh
timeout 330 ./build-gpu/tests/sjit_gpu_tests >"$OUT/gpu-tests.log" 2>&1
echo "gpu tests exit $?"; grep -E "FAILED|failed|passed|with expansion|seed" "$OUT/gpu-tests.log" | head -10
b="./build-gpu/sjit bench attention --iters 10 --backward"
{ for q in "" --queued; do
  timeout 60 $b $q --density 1,0.5,0.25,0.1,0.05,0.02
  timeout 40 $b $q --causal tl --density 1,0.1
  timeout 40 $b $q --d 64 --batch 4 --heads 32 --seq 4096 --density 1,0.1
done; } > "$OUT/bench.log" 2>&1
grep -E "^device|^dense|^bsr" "$OUT/bench.log"

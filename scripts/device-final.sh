#!/usr/bin/env bash
# On the lent GPU machine: every GPU test, the attention benchmarks of issues 6 and 7, and a refresh of
# the attention tuning results (docs/tuning.md). Logs in $OUT. Usage there (carrying .deps):
#   bash scripts/device-final.sh
set -uo pipefail
source scripts/device-build.sh
timeout 400 ./build-gpu/tests/sjit_gpu_tests >"$OUT/gpu-tests.log" 2>&1
echo "gpu tests exit $?"; grep -E "FAILED|failed|passed|with expansion|seed" "$OUT/gpu-tests.log" | head -30
bench="timeout 90 ./build-gpu/sjit bench attention --iters 10"
{
  $bench --density 1,0.5,0.25,0.1,0.05,0.02 --backward
  $bench --block 64 --density 0.1,0.02 --baked
} >"$OUT/bench-final.log" 2>&1
cat "$OUT/bench-final.log"
export SJIT_TUNE_DIR=$(mktemp -d)
tune=(timeout 70 ./build-gpu/sjit tune attention --budget-s 15 --iters 15)
{
  "${tune[@]}" 'attention:d=128,dtype=bf16,causal=none,sparsity=dense,pass=fwd' --shape 2,16,16,8192,8192
  "${tune[@]}" 'attention:d=128,dtype=bf16,causal=none,sparsity=bsr,block=128,pass=fwd' --shape 2,16,16,8192,8192 \
    --density 0.1
} >"$OUT/tune-attention.log" 2>"$OUT/tune-attention-progress.log"
echo "sjit tune exit $?"; grep -E "default|winner|^attention" "$OUT/tune-attention.log" | head -20

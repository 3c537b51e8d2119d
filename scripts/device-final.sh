#!/usr/bin/env bash
# On the lent GPU machine: every GPU test and the attention benchmarks of issues 6 and 7. Logs in $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/sjit-out}; mkdir -p "$OUT"
bash scripts/device-attention.sh tests >"$OUT/attention-run.log" 2>&1; tail -5 "$OUT/attention-run.log"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
timeout 200 ./build-gpu/tests/sjit_gpu_tests '~[attention]' >"$OUT/other-gpu-tests.log" 2>&1
echo "other gpu tests exit $?"; tail -3 "$OUT/other-gpu-tests.log"
{
  ./build-gpu/sjit bench attention --iters 10 --causal tl --density 1,0.5,0.1 --backward
  ./build-gpu/sjit bench attention --iters 10 --batch 4 --heads 32 --seq 4096 --d 64 --density 1,0.1 --backward
  ./build-gpu/sjit bench attention --iters 10 --block 64 --density 0.1,0.02 --baked
} >"$OUT/bench-final.log" 2>&1
cat "$OUT/bench-final.log"

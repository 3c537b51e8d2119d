#!/usr/bin/env bash
# The full GPU pass for a closing note (on the lent machine; carry .deps and .warm-cache):
# build, GPU tests, demo on a cache warmed elsewhere (must compile nothing), bench jit,
# bench rownorm, tuning sweeps. Logs in $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/sjit-out}; mkdir -p "$OUT"
bash scripts/device-check.sh tests >"$OUT/tests.log" 2>&1; grep -E "tests passed|tests failed|Failed|FAILED" "$OUT/tests.log" | head -20
sjit=./build-gpu/sjit
echo "== demo on the cache warmed without a GPU (read-only) =="
SJIT_CACHE_DIR=$PWD/.warm-cache SJIT_CACHE=ro $sjit demo 2>&1 | tail -2 | tee "$OUT/demo-warm.log"
echo "== bench jit =="; $sjit bench jit 2>&1 | tail -7 | tee "$OUT/bench-jit.log"
echo "== bench rownorm f32 =="; $sjit bench rownorm 2>&1 >"$OUT/bench-f32.log"; tail -n +3 "$OUT/bench-f32.log"
echo "== bench rownorm bf16 fwd =="; $sjit bench rownorm --dtype bf16 --pass fwd --kinds softmax,sparsemax,entmax15 2>&1 | tail -n +3 | tee "$OUT/bench-bf16.log"
echo "== tune =="
export SJIT_TUNE_DIR=$(mktemp -d)
for n in 8 64 1024; do
  $sjit tune rownorm rownorm:kind=entmax,alpha=1.5,n=$n rownorm:kind=sparsemax,n=$n rownorm:kind=entmax,alpha=1.3,n=$n rownorm:kind=softmax,n=$n,pass=bwd --budget-s 20 2>/dev/null
done >"$OUT/tune.log"
grep -E "^rownorm|^default" "$OUT/tune.log"
$sjit tune --show >"$OUT/tune-show.log" 2>&1

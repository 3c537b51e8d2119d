#!/usr/bin/env bash
# The full GPU pass for a closing note (on the lent machine; carry .deps and .warm-cache):
# build, GPU tests, demo on a cache warmed elsewhere (must compile nothing: warm .warm-cache here with
# `SJIT_CACHE_DIR=$PWD/.warm-cache ./build/sjit demo --compile-only`), bench jit,
# bench rownorm, tuning sweeps. Returns three logs in $OUT (the device tool brings back 8 files).
set -uo pipefail
OUT=${OUT:-/tmp/sjit-out}; mkdir -p "$OUT"
OUT=/tmp/sjit-check bash scripts/device-check.sh tests >/tmp/sjit-check.log 2>&1
cp /tmp/sjit-check/gpu-tests.log "$OUT/gpu-tests.log"
sjit=./build-gpu/sjit
{
  grep -E "tests passed|tests failed|Failed|FAILED" /tmp/sjit-check.log | head -20
  echo "== demo on the cache warmed without a GPU (read-only) =="
  SJIT_CACHE_DIR=$PWD/.warm-cache SJIT_CACHE=ro $sjit demo 2>&1 | tail -2
  echo "== bench jit =="; $sjit bench jit 2>&1 | tail -7
  echo "== bench rownorm f32 =="; $sjit bench rownorm 2>&1
  echo "== bench rownorm bf16 fwd =="; $sjit bench rownorm --dtype bf16 --pass fwd --kinds softmax,sparsemax,entmax15 2>&1
} >"$OUT/full.log" 2>&1
cat "$OUT/full.log"
export SJIT_TUNE_DIR=$(mktemp -d)
for n in ${TUNE_SIZES:-8 64 1024}; do
  $sjit tune rownorm rownorm:kind=entmax,alpha=1.5,n=$n rownorm:kind=sparsemax,n=$n rownorm:kind=entmax,alpha=1.3,n=$n rownorm:kind=softmax,n=$n,pass=bwd --budget-s 20 2>/dev/null
done >"$OUT/tune.log"
grep -E "^rownorm|^default" "$OUT/tune.log"

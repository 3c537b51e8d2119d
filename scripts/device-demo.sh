#!/usr/bin/env bash
# On the lent GPU machine: build the sjit tool alone (not the GPU tests, to save the call's time) and
# run `sjit demo` twice: on an empty cache (every check, and the cold time), then on the cache it
# filled (must compile nothing). Logs in $OUT. Usage there (carrying .deps): bash scripts/device-demo.sh
set -uo pipefail
OUT=${OUT:-/tmp/sjit-out}; mkdir -p "$OUT"
source .deps/unpack.sh
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
start=$(date +%s)
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release >"$OUT/cmake.log" 2>&1 &&
  cmake --build build-gpu -j16 --target sjit >"$OUT/build.log" 2>&1 ||
  { tail -n 40 "$OUT/cmake.log" "$OUT/build.log"; exit 1; }
echo "built in $(( $(date +%s) - start )) s"
export SJIT_CACHE_DIR=$(mktemp -d)
start=$(date +%s%N)
timeout 150 ./build-gpu/sjit demo >"$OUT/demo.log" 2>&1; rc=$?
echo "demo on an empty cache: exit $rc, $(( ($(date +%s%N) - start) / 1000000 )) ms"
grep -v "^  compiled \|^  cached " "$OUT/demo.log"
timeout 60 ./build-gpu/sjit demo >"$OUT/demo-warm.log" 2>&1
echo "demo on the filled cache: exit $?"; tail -1 "$OUT/demo-warm.log"

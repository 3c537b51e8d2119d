#!/usr/bin/env bash
# On the lent GPU machine: build the sjit tool alone (not the GPU tests, to save the call's time) and
# run `sjit demo` twice: on an empty cache (every check, and the cold time), then on the cache it
# filled (must compile nothing). Logs in $OUT. Usage there (carrying .deps): bash scripts/device-demo.sh
set -uo pipefail
BUILD_TARGETS=sjit source scripts/device-build.sh
export SJIT_CACHE_DIR=$(mktemp -d)
start=$(date +%s%N)
timeout 150 ./build-gpu/sjit demo >"$OUT/demo.log" 2>&1; rc=$?
echo "demo on an empty cache: exit $rc, $(( ($(date +%s%N) - start) / 1000000 )) ms"
grep -v "^  compiled \|^  cached " "$OUT/demo.log"
timeout 60 ./build-gpu/sjit demo >"$OUT/demo-warm.log" 2>&1
echo "demo on the filled cache: exit $?"; tail -1 "$OUT/demo-warm.log"

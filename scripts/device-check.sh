#!/usr/bin/env bash
# One call on the lent GPU machine: build, GPU tests, demo, benchmarks. Logs land in $OUT.
# Usage there (after ../shared/device/prepare-deps.sh .deps here, carrying .deps):
#   bash scripts/device-check.sh [tests|bench|all] [extra sjit bench args...]
set -uo pipefail
what=${1:-all}; shift || true
OUT=${OUT:-/tmp/sjit-out}; mkdir -p "$OUT"
source .deps/unpack.sh
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/gpu.txt"
start=$(date +%s)
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release >"$OUT/cmake.log" 2>&1 &&
  cmake --build build-gpu -j16 >"$OUT/build.log" 2>&1 || { tail -n 40 "$OUT/cmake.log" "$OUT/build.log"; exit 1; }
echo "built in $(( $(date +%s) - start )) s"
./build-gpu/sjit info | tee "$OUT/info.log"
if [[ $what == tests || $what == all ]]; then
  ctest --test-dir build-gpu -L gpu --output-on-failure -j1 >"$OUT/gpu-tests.log" 2>&1
  grep -E "tests passed|tests failed|Test +#|FAILED|got " "$OUT/gpu-tests.log" | head -60
  ./build-gpu/sjit demo >"$OUT/demo.log" 2>&1; tail -30 "$OUT/demo.log"
fi
if [[ $what == bench || $what == all ]]; then
  ./build-gpu/sjit bench rownorm "$@" >"$OUT/bench.log" 2>&1; cat "$OUT/bench.log"
fi

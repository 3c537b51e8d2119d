# Sourced by the device-*.sh scripts on the lent GPU machine: unpacks the carried .deps, builds
# build-gpu (the targets in BUILD_TARGETS, default sjit and sjit_gpu_tests; BUILD_TARGETS=sjit saves the
# tests' build where a script needs only the tool), sets OUT and LD_LIBRARY_PATH. Exits on a failed build.
OUT=${OUT:-/tmp/sjit-out}; mkdir -p "$OUT"
source .deps/unpack.sh
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
start=$(date +%s)
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release >"$OUT/cmake.log" 2>&1 &&
  cmake --build build-gpu -j16 --target ${BUILD_TARGETS:-sjit sjit_gpu_tests} >"$OUT/build.log" 2>&1 ||
  { tail -n 40 "$OUT/cmake.log" "$OUT/build.log"; exit 1; }
echo "built in $(( $(date +%s) - start )) s"

#!/usr/bin/env bash
# Installs the build in folder $1 into a temporary prefix, builds examples/ against it as a user's
# project would (find_package(sparsejit), README "Using it from C++"), and runs every example: with a
# GPU each checks its results against the float64 reference, without one it compiles its kernels.
# Fails at the first step that fails, showing that step's output.
set -euo pipefail
build=$(cd "${1:?usage: check-install.sh BUILD_DIR}" && pwd)
source_dir=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

step() {  # step NAME COMMAND...: runs COMMAND, its output shown only if it fails
  local name=$1; shift
  if ! "$@" >"$work/$name.log" 2>&1; then
    echo "check-install: $name failed:"; cat "$work/$name.log"; exit 1
  fi
}
# The examples take the compiler flags the library was built with (a sanitizer build's included).
cached() { sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt"; }
step install cmake --install "$build" --prefix "$work/prefix"
step configure cmake -S "$source_dir/examples" -B "$work/examples" -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER="$(cached CMAKE_CXX_COMPILER)" \
  -DCMAKE_CXX_FLAGS="$(cached CMAKE_CXX_FLAGS)" -DCMAKE_EXE_LINKER_FLAGS="$(cached CMAKE_EXE_LINKER_FLAGS)"
# sparsejit.h is "everything public in one include": each installed header must be in it.
include_dir="$work/prefix/include/sparsejit"
for header in "$include_dir"/*.h; do
  name=$(basename "$header")
  [ "$name" = sparsejit.h ] || grep -q "^#include \"sparsejit/$name\"" "$include_dir/sparsejit.h" ||
    { echo "check-install: sparsejit.h does not include sparsejit/$name"; exit 1; }
  # ... and compile on its own: a user may include just the one they need.
  echo "#include <sparsejit/$name>" >"$work/header.cpp"
  step "header-$name" "$(cached CMAKE_CXX_COMPILER)" -std=c++20 -fsyntax-only -I"$work/prefix/include" "$work/header.cpp"
done
step build cmake --build "$work/examples" -j"$(nproc)"
for example in entmax_rows attention_training_step; do
  echo "== $example"
  "$work/examples/$example"
done

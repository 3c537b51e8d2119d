#!/usr/bin/env bash
# Installs what the build needs (Debian packages; NVRTC and the CUDA headers come from the toolkit at
# /usr/local/cuda), builds sparsejit into build/, and runs `sjit demo`. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
packages="cmake g++ make pkg-config libfmt-dev catch2 libcli11-dev nlohmann-json3-dev libxxhash-dev libpng-dev"
missing=""
for p in $packages; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq $missing
fi
if [ ! -e /usr/local/cuda/include/nvrtc.h ] && [ -z "${CUDAToolkit_ROOT:-}" ]; then
  echo "setup: the CUDA toolkit (NVRTC and headers) was not found at /usr/local/cuda; set CUDAToolkit_ROOT" >&2
  exit 1
fi
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release ${CUDAToolkit_ROOT:+-DCUDAToolkit_ROOT=$CUDAToolkit_ROOT} >/dev/null
cmake --build build -j"$(nproc)"
# The main job: specialize and compile a set of kernels; with a GPU, check them against the reference.
./build/sjit demo

#!/usr/bin/env bash
# On the lent GPU machine: `sjit bench attention` for several tilings (after device-attention.sh built
# build-gpu). Usage: bash scripts/device-attention-sweep.sh "CONFIG1 CONFIG2 ..." [extra bench args...]
set -uo pipefail
configs=$1; shift
OUT=${OUT:-/tmp/sjit-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
for c in $configs; do
  timeout 120 ./build-gpu/sjit bench attention --config "$c" "$@" 2>&1 | grep -E "^(dense|bsr|baked)" | sed "s/^/$c  /"
done | tee "$OUT/sweep.log" | awk '{print $1, $2, $3, $5, $6, $7}'

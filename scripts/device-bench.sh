#!/usr/bin/env bash
# On the lent GPU machine: builds the working tree's sjit and runs each line of BENCH (newline-separated
# `sjit bench attention` arguments) ROUNDS times, lines alternating within a round; log in $OUT/bench.log.
# For figures of one tree, such as a crossover between two modes of the same build.
#   BENCH=$'--backward --density 0.1\n--backward --deterministic --density 0.1' bash scripts/device-bench.sh
set -uo pipefail
OUT=${OUT:-/tmp/sjit-out}; mkdir -p "$OUT"
source .deps/unpack.sh
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
start=$(date +%s)
{ cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release && cmake --build build-gpu -j16 --target sjit; } >"$OUT/build.log" 2>&1 ||
  { tail -n 30 "$OUT/build.log"; exit 1; }
echo "built in $(( $(date +%s) - start )) s"
for (( round = 1; round <= ${ROUNDS:-2}; ++round )); do
  while IFS= read -r line; do
    [[ -z $line ]] && continue
    echo "== round $round: sjit bench attention --iters 10 $line"
    # shellcheck disable=SC2086
    timeout 120 ./build-gpu/sjit bench attention --iters 10 $line 2>&1 | grep -vE "^\[|^$"
  done <<<"${BENCH:-}"
done | tee "$OUT/bench.log"

#!/usr/bin/env bash
# On the lent GPU machine: builds the working tree's sjit, runs the GPU tests named by TESTS (none if
# empty; TEST_TIMEOUT seconds, default 300), then each line of BENCH (newline-separated `sjit bench
# attention` arguments, optionally led by VAR=value environment settings) ROUNDS times, lines
# alternating within a round; logs in $OUT. For figures of one tree, such as a crossover between two
# modes of the same build.
#   BENCH=$'SJIT_BACKWARD_DQ=atomic --backward --density 0.1\nSJIT_BACKWARD_DQ=pass --backward --density 0.1' \
#     bash scripts/device-bench.sh
set -uo pipefail
OUT=${OUT:-/tmp/sjit-out}; mkdir -p "$OUT"
source .deps/unpack.sh
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
start=$(date +%s)
targets=sjit; [[ -n ${TESTS:-} ]] && targets="sjit sjit_gpu_tests"
# shellcheck disable=SC2086
{ cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release && cmake --build build-gpu -j16 --target $targets; } >"$OUT/build.log" 2>&1 ||
  { tail -n 30 "$OUT/build.log"; exit 1; }
echo "built in $(( $(date +%s) - start )) s"
if [[ -n ${TESTS:-} ]]; then
  timeout "${TEST_TIMEOUT:-300}" ./build-gpu/tests/sjit_gpu_tests -w NoTests "$TESTS" >"$OUT/tests.log" 2>&1
  status=$?
  echo "tests '$TESTS' exit $status"; grep -E "FAILED|failed|passed|with expansion|seed" "$OUT/tests.log" | head -30
  (( status == 0 )) || exit 1
fi
for (( round = 1; round <= ${ROUNDS:-2}; ++round )); do
  while IFS= read -r line; do
    [[ -z $line ]] && continue
    read -ra words <<<"$line"
    settings=()
    while (( ${#words[@]} )) && [[ ${words[0]} == *=* && ${words[0]} != -* ]]; do settings+=("${words[0]}"); words=("${words[@]:1}"); done
    echo "== round $round: ${settings[*]} sjit bench attention --iters 10 ${words[*]}"
    timeout 120 env "${settings[@]}" ./build-gpu/sjit bench attention --iters 10 "${words[@]}" 2>&1 | grep -vE "^\[|^$"
  done <<<"${BENCH:-}"
done | tee "$OUT/bench.log"

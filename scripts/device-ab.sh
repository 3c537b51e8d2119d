#!/usr/bin/env bash
# On the lent GPU machine: a same-run A/B of the working tree (B) against a snapshot of another commit
# (A), since H100s of the pool differ by 3-4% and only figures of one call compare. Builds both trees
# at once, runs the GPU tests named by TESTS on B (none if empty; a Catch2 test spec runs its tests in
# one process, one after another, so '[backward]' alone outlasts 280 s; 'ctest:REGEX' runs those CTest
# matches eight at a time), then each bench line of BENCH for
# A and B alternately, ROUNDS times (TEST_TIMEOUT: seconds for the tests, default 300). EXTRA names more snapshot folders (timing variants), benched
# after B. Logs in $OUT.
# Here:   mkdir .snap-a && git archive REV | tar -x -C .snap-a
# There (carrying .deps and .snap-a):
#   TESTS='ctest:gradients|packs' ROUNDS=2 BENCH=$'--backward --density 1,0.1\n--backward --d 64 --density 1' \
#     bash scripts/device-ab.sh
set -uo pipefail
OUT=${OUT:-/tmp/sjit-out}; mkdir -p "$OUT"
source .deps/unpack.sh
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
build() {  # $1: source tree; builds $1/build-gpu (the tests too for B), log in $OUT/build-NAME.log
  local name=${1//[.\/]/} targets=sjit
  [[ $1 == . ]] && name=b targets="sjit sjit_gpu_tests"
  # shellcheck disable=SC2086
  cmake -S "$1" -B "$1/build-gpu" -DCMAKE_BUILD_TYPE=Release >"$OUT/build-$name.log" 2>&1 &&
    cmake --build "$1/build-gpu" -j$(( 16 / (2 + $(wc -w <<<"${EXTRA:-}")) + 1 )) --target $targets >>"$OUT/build-$name.log" 2>&1
}
start=$(date +%s)
trees=(.snap-a . ${EXTRA:-})
pids=()
for tree in "${trees[@]}"; do build "$tree" & pids+=($!); done
failed=0
for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
echo "built ${trees[*]} in $(( $(date +%s) - start )) s"
if (( failed )); then tail -n 30 "$OUT"/build-*.log; exit 1; fi
if [[ -n ${TESTS:-} ]]; then
  if [[ $TESTS == ctest:* ]]; then  # a CTest regex: the matching GPU tests, eight at a time
    timeout "${TEST_TIMEOUT:-300}" ctest --test-dir build-gpu -L gpu -j8 -R "${TESTS#ctest:}" >"$OUT/tests-b.log" 2>&1
  else  # a Catch2 test spec: the matching tests one after another, in one process
    timeout "${TEST_TIMEOUT:-300}" ./build-gpu/tests/sjit_gpu_tests -w NoTests "$TESTS" >"$OUT/tests-b.log" 2>&1
  fi
  status=$?
  echo "B tests '$TESTS' exit $status"; grep -E "FAILED|Failed|failed|passed|with expansion|seed" "$OUT/tests-b.log" | head -30
  (( status == 0 )) || exit 1  # no figures for a tree that computes wrong (or hangs)
fi
for (( round = 1; round <= ${ROUNDS:-2}; ++round )); do
  while IFS= read -r line; do
    [[ -z $line ]] && continue
    for dir in "${trees[@]}"; do
      tree=$dir; [[ $dir == .snap-a ]] && tree=A; [[ $dir == . ]] && tree=B
      echo "== round $round, $tree: sjit bench attention --iters 10 $line"
      # shellcheck disable=SC2086
      timeout 120 "$dir/build-gpu/sjit" bench attention --iters 10 $line 2>&1 | grep -vE "^\[|^$"
    done
  done <<<"${BENCH:-}"
done >"$OUT/ab.log"
cat "$OUT/ab.log"

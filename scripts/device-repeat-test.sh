#!/usr/bin/env bash
# On the lent GPU machine, to chase a flaky GPU test: runs one test case (TEST, a Catch name pattern;
# commas escaped) ROUNDS times, PARALLEL processes at a time (contention changes scheduling, not the
# inputs: each run draws its own seed, printed on failure; SJIT_TEST_SEED replays one). Keeps the logs
# of failed runs in $OUT. Usage there (carrying .deps):
#   TEST='E23 backward: 1\, 5 and 64 steps*' ROUNDS=5 PARALLEL=5 bash scripts/device-repeat-test.sh
set -uo pipefail
source scripts/device-build.sh
export SJIT_CACHE_DIR=$OUT/cache
./build-gpu/tests/sjit_gpu_tests -w NoTests "${TEST}" >/dev/null 2>&1  # warms the cache
failed=0
for round in $(seq 1 "${ROUNDS:-5}"); do
  for p in $(seq 1 "${PARALLEL:-5}"); do
    log=$OUT/run-$round-$p.log
    { timeout 120 ./build-gpu/tests/sjit_gpu_tests -w NoTests "${TEST}" >"$log" 2>&1 && rm "$log"; } &
  done
  wait
done
rm -rf "$OUT/cache"
for log in "$OUT"/run-*.log; do [[ -e $log ]] && { failed=$((failed + 1)); echo "== $log"; grep -B5 -A40 "FAILED" "$log" | head -80; }; done
echo "$failed of $(( ${ROUNDS:-5} * ${PARALLEL:-5} )) runs failed"

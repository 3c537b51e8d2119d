#!/usr/bin/env bash
# On the lent H100: build, the wgmma-path GPU tests (test cases in parallel: each compiles its own
# kernels), the mma.sync path's attention tests, and `sjit bench attention` on both paths. Logs in $OUT.
# Usage there (carrying .deps): bash scripts/device-sm90.sh [tests|bench|all]
set -uo pipefail
what=${1:-all}
source scripts/device-build.sh
tests=./build-gpu/tests/sjit_gpu_tests
if [[ $what == tests || $what == all ]]; then
  start=$(date +%s)
  pids=()
  i=0
  while IFS= read -r name; do
    i=$((i + 1))
    SJIT_CACHE_DIR=/tmp/sjit-cache-$i timeout 300 $tests "${name//,/\\,}" >"/tmp/sm90-test-$i.log" 2>&1 &
    pids+=($!)
  done < <($tests '[sm90]' --list-test-names-only | grep -v '^$' | grep -v 'test cases')
  SJIT_CACHE_DIR=/tmp/sjit-cache-mma timeout 300 $tests '[attention]~[sm90]~[backward]' >/tmp/sm90-test-mma.log 2>&1 &
  pids+=($!)
  for p in "${pids[@]}"; do wait "$p"; done
  cat /tmp/sm90-test-*.log >"$OUT/tests.log"
  echo "tests done in $(( $(date +%s) - start )) s"
  grep -E "FAILED|failed|passed|with expansion|want|seed|error|warning" "$OUT/tests.log" | head -60
fi
if [[ $what == bench || $what == all ]]; then
  # One `sjit bench attention` per line of scripts/sm90-bench.txt (arguments; '#' lines skipped).
  sjit=./build-gpu/sjit
  export SJIT_CACHE_DIR=/tmp/sjit-cache-bench
  while IFS= read -r args; do
    [[ -z $args || $args == \#* ]] && continue
    echo "== $args"
    eval timeout 100 $sjit bench attention --iters 10 $args </dev/null
  done <scripts/sm90-bench.txt >"$OUT/bench.log" 2>&1
  grep -E "^==|^dense|^bsr|^baked|rror" "$OUT/bench.log"
fi

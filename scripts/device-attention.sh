#!/usr/bin/env bash
# On the lent GPU machine: build, the attention GPU tests, and `sjit bench attention`. Logs in $OUT.
# Usage there (carrying .deps): bash scripts/device-attention.sh [tests|bench|all] [extra bench args...]
set -uo pipefail
what=${1:-all}; shift || true
source scripts/device-build.sh
if [[ $what == tests || $what == all ]]; then
  timeout 400 ./build-gpu/tests/sjit_gpu_tests '[attention]' >"$OUT/attention-tests.log" 2>&1
  echo "attention tests exit $?"; grep -E "FAILED|failed|passed|with expansion|SKIPPED|seed|error" "$OUT/attention-tests.log" | head -40
fi
if [[ $what == bench || $what == all ]]; then
  timeout 150 ./build-gpu/sjit bench attention "$@" >"$OUT/bench-attention.log" 2>&1; cat "$OUT/bench-attention.log"
fi

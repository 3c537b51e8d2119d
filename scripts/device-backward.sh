#!/usr/bin/env bash
# On the lent GPU machine: build, the attention backward GPU tests, and `sjit bench attention --backward`
# at the shapes (atomic dQ; then the deterministic mode where its cost is quoted). Logs in $OUT.
# Usage there (carrying .deps): bash scripts/device-backward.sh [tests|bench|quick|all]
# quick: the tests and the atomic-dQ figures of issue 7 (densities 1 .. 0.02, causal at 0.1) only.
set -uo pipefail
what=${1:-all}
source scripts/device-build.sh
if [[ $what == tests || $what == quick || $what == all ]]; then
  timeout 300 ./build-gpu/tests/sjit_gpu_tests '[backward]' >"$OUT/backward-tests.log" 2>&1
  echo "backward tests exit $?"; grep -E "FAILED|failed|passed|with expansion|seed|want" "$OUT/backward-tests.log" | head -30
fi
if [[ $what == quick ]]; then
  bench="./build-gpu/sjit bench attention --backward --iters 10"
  {
    timeout 150 $bench --density 1,0.5,0.25,0.1,0.05,0.02
    timeout 60 $bench --causal tl --density 0.1
  } 2>&1 | tee "$OUT/bench-backward.log"
fi
if [[ $what == bench || $what == all ]]; then
  bench="./build-gpu/sjit bench attention --backward --iters 10"
  {
    timeout 150 $bench --density 1,0.95,0.5,0.25,0.1,0.05,0.02
    timeout 60 $bench --causal tl --density 0.1
    timeout 60 $bench --d 64 --batch 4 --heads 32 --seq 4096 --density 0.1
    timeout 90 $bench --deterministic --density 0.5,0.1,0.02
    timeout 60 $bench --causal tl --deterministic --density 0.1
    timeout 60 $bench --d 64 --batch 4 --heads 32 --seq 4096 --deterministic --density 0.1
  } 2>&1 | tee "$OUT/bench-backward.log"
fi

#!/usr/bin/env bash
# On the lent GPU machine: build, the E23 GPU tests (forward and backward), and `sjit bench e23` at the
# issue's goal shapes. Logs in $OUT. Usage there (carrying .deps):
#   bash scripts/device-e23.sh [tests|bench|backward|all]
set -uo pipefail
what=${1:-all}
source scripts/device-build.sh
if [[ $what == tests || $what == all ]]; then
  timeout 300 ./build-gpu/tests/sjit_gpu_tests '[e23]' --durations yes >"$OUT/e23-tests.log" 2>&1
  echo "e23 tests exit $?"; grep -E "FAILED|failed|passed|with expansion|SKIPPED|seed|error|want" "$OUT/e23-tests.log" | head -40
fi
if [[ $what == bench || $what == all ]]; then
  for shape in "--batch 4 --slots 8" "--batch 64 --slots 32"; do
    timeout 60 ./build-gpu/sjit bench e23 $shape --dim 512 --steps 64 --dtype bf16 --kind softmax,sparsemax,entmax15,entmax:1.25
  done 2>&1 | tee "$OUT/bench-e23.log"
  timeout 60 ./build-gpu/sjit bench e23 --batch 4 --slots 8 --dim 512 --steps 64 --dtype f32 --kind softmax,entmax15 2>&1 |
    tee -a "$OUT/bench-e23.log"
fi
if [[ $what == backward || $what == all ]]; then
  for shape in "--batch 4 --slots 8" "--batch 64 --slots 32"; do
    timeout 60 ./build-gpu/sjit bench e23 $shape --dim 512 --steps 64 --dtype bf16 --kind softmax,sparsemax,entmax15,entmax:1.25 --backward
  done 2>&1 | tee "$OUT/bench-e23-backward.log"
fi

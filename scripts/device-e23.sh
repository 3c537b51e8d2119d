#!/usr/bin/env bash
# On the lent GPU machine: build, the E23 GPU tests (forward and backward), and `sjit bench e23` at the
# issue's goal shapes. Logs in $OUT. Usage there (carrying .deps):
#   bash scripts/device-e23.sh [tests|tests-global|bench|backward|profile|profile-backward|global|all]...
# bench: the forward; backward: the forward and forward + backward tables; profile: the forward table
# with a per-phase timing of one instrumented launch (softmax, entmax15); profile-backward: the backward
# table and the per-phase timing of one instrumented backward launch (softmax, entmax15); global: the forward with
# SJIT_E23_TAPE=global (the tape in the workspace, to measure what keeping it on chip gains); tests-global:
# the tests with SJIT_E23_TAPE=global (the forward's tape and the backward's g_M in the workspace);
# all = tests backward.
set -uo pipefail
modes=${*:-all}
modes=${modes/all/tests backward}
source scripts/device-build.sh
shapes=("--batch 4 --slots 8" "--batch 64 --slots 32")
kinds=softmax,sparsemax,entmax15,entmax:1.25
for what in $modes; do
  case $what in
    tests)
      timeout 200 ./build-gpu/tests/sjit_gpu_tests '[e23]' --durations yes >"$OUT/e23-tests.log" 2>&1
      echo "e23 tests exit $?"; grep -E "FAILED|failed|passed|with expansion|SKIPPED|seed|error|want|warning" "$OUT/e23-tests.log" | head -40 ;;
    tests-global)  # the same suite with the state in the workspace wherever it would fit on chip
      SJIT_E23_TAPE=global timeout 200 ./build-gpu/tests/sjit_gpu_tests '[e23]' --durations yes >"$OUT/e23-tests-global.log" 2>&1
      echo "e23 tests (SJIT_E23_TAPE=global) exit $?"
      grep -E "FAILED|failed|passed|with expansion|SKIPPED|seed|error|want|warning" "$OUT/e23-tests-global.log" | head -40 ;;
    bench)
      for shape in "${shapes[@]}"; do
        timeout 60 ./build-gpu/sjit bench e23 $shape --dim 512 --steps 64 --dtype bf16 --kind $kinds
      done 2>&1 | tee "$OUT/bench-e23.log" ;;
    backward)
      for shape in "${shapes[@]}"; do
        timeout 60 ./build-gpu/sjit bench e23 $shape --dim 512 --steps 64 --dtype bf16 --kind $kinds --backward
      done 2>&1 | tee "$OUT/bench-e23-backward.log" ;;
    profile)
      for shape in "${shapes[@]}"; do
        timeout 60 ./build-gpu/sjit bench e23 $shape --dim 512 --steps 64 --dtype bf16 --kind softmax,entmax15 --profile
      done 2>&1 | tee "$OUT/bench-e23-profile.log" ;;
    profile-backward)
      for shape in "${shapes[@]}"; do
        timeout 60 ./build-gpu/sjit bench e23 $shape --dim 512 --steps 64 --dtype bf16 --kind softmax,entmax15 --backward --profile
      done 2>&1 | tee "$OUT/bench-e23-profile-backward.log" ;;
    global)
      for shape in "${shapes[@]}"; do
        SJIT_E23_TAPE=global timeout 60 ./build-gpu/sjit bench e23 $shape --dim 512 --steps 64 --dtype bf16 --kind $kinds
      done 2>&1 | tee "$OUT/bench-e23-global.log" ;;
    f32)
      timeout 60 ./build-gpu/sjit bench e23 --batch 4 --slots 8 --dim 512 --steps 64 --dtype f32 --kind softmax,entmax15 2>&1 |
        tee "$OUT/bench-e23-f32.log" ;;
    *) echo "unknown mode $what (tests, tests-global, bench, backward, profile, profile-backward, global, f32, all)"; exit 2 ;;
  esac
done

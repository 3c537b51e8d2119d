#!/usr/bin/env bash
# On the lent GPU machine: the dQ rule's one-head crossover at d = 128 on the H200, and short windows
# with two and four query heads a K/V head (docs/attention.md, "The dQ rule counts contiguous tiles").
# One head: windows whose rows see 2 and 2.5 key tiles (blocks of 128, 64, 32, 16) and random blocks of
# 128 at 1.6 to 2.6 tiles a row (0.025 to 0.04), where the threshold of 2.5 tiles (set from 2 tiles
# 0.361 / 0.370 ms and 3 tiles 0.437 / 0.476, atomic / pass) is unmeasured between. Then the windows of
# blocks of 16 and 32 that pack (3 tiles a row contiguous) with 2 and 4 heads a K/V head, below their
# thresholds of 4 and 8. Each line atomic, then by the pass. First the GPU
# tests of the packed walks' choices. ONLY=REGEX, ROUNDS (default 2); logs in $OUT. Usage there
# (carrying .deps):
#   bash scripts/device-dq-rule.sh
set -uo pipefail
source scripts/device-build.sh
ctest --test-dir build-gpu -L gpu -j4 --timeout 300 \
  -R "packed walks|take the gathered|short windows|packs narrow" >"$OUT/tests.log" 2>&1
grep -E "tests passed|Failed|\*\*\*" "$OUT/tests.log"
source scripts/device-forced.sh
lines=(
  "|--block 128 --window 1,0"
  "|--block 64 --window 2,1"
  "|--block 32 --window 2,1"
  "|--block 16 --window 4,3"
  "|--block 128 --density 0.025,0.03,0.035,0.04"
  "|--block 16 --window 6,5 --heads-kv 8"
  "|--block 32 --window 3,3 --heads-kv 8"
  "|--block 16 --window 6,5 --heads-kv 4"
  "|--block 32 --window 3,3 --heads-kv 4"
)
ways=("SJIT_BACKWARD_DQ=atomic" "SJIT_BACKWARD_DQ=pass")
bench_forced | tee "$OUT/dq-rule.log"

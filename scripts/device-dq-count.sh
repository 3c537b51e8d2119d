#!/usr/bin/env bash
# On the lent GPU machine: should the dQ rule count a row's key tiles on the contiguous tiles where the
# dK/dV pass packs its queries? (docs/attention.md, "Packing counts whole tiles": packed schedules
# count fewer, 2.2-2.5 a row for short windows at d = 128 against 2.97 contiguous, either side of the
# 2.5 below which one query head a K/V head takes the dQ pass; 6 + 1 + 5 blocks of 16 then ran 20%
# slower by the pass.) Times each line with dQ summed atomically, then by the pass: the windows whose
# choice that count would flip, one contiguous window beside them, and causal random blocks of 16 at
# 0.02 with four query heads a K/V head (9.4 tiles a row packed, 28 contiguous; threshold 20).
# ONLY=REGEX, ROUNDS (default 2); logs in $OUT. Usage there (carrying .deps):
#   bash scripts/device-dq-count.sh
set -uo pipefail
source scripts/device-build.sh
source scripts/device-forced.sh
lines=(
  "|--block 16 --window 5,5"
  "|--block 16 --window 6,5"
  "|--block 16 --window 6,6"
  "|--block 32 --window 3,3"
  "|--block 16 --window 5,4"
  "|--block 16 --causal tl --heads-kv 4 --density 0.02"
)
ways=("SJIT_BACKWARD_DQ=atomic" "SJIT_BACKWARD_DQ=pass")
bench_forced | tee "$OUT/dq-count.log"

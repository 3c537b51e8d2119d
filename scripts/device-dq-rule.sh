#!/usr/bin/env bash
# On the lent GPU machine: the dQ rule's counts and thresholds at d = 128 (B2 H16 S8192) on the H200
# (docs/attention.md, "The dQ rule counts contiguous tiles, and bands"). Lines: windows whose rows see
# 2, 2.5 and 3 key tiles (blocks of 128, 64, 32 and 16; those of 16 and 32 with 3 tiles pack; at d = 64,
# on its 64-query tiles, 2 + 1 + 1 of 64, 3 + 1 + 2 of 32 and 5 + 1 + 4 of 16 see 2.45) with one,
# two and four query heads a K/V head; a window of 6 tiles with four; random blocks of 128 at 2 and 3
# tiles a row (--density 0.03 and 0.05) with one, two and four; causal random blocks of 16 at 0.02 with
# four (packed: 9.4 tiles a row, 28 contiguous); and windows beyond the L2 (B1 H4 S65536, their label
# without the shape). Each line with dQ atomic, then by the pass (WAYS: other
# settings, e.g. WAYS=SJIT_BACKWARD_DQ=auto for the rule's own choice). First the GPU tests of those
# choices (TESTS=0 leaves them out). ONLY=REGEX, ROUNDS (default 2), D (the head dim, default 128:
# D=96 times the same lines at d = 96), SHAPE (other flags for the lines at B2 H16 S8192, e.g.
# SHAPE='--batch 4 --heads 32 --seq 4096' with D=64; --heads-kv 8 and 4 then make groups of four and
# eight); logs in $OUT. Usage there (carrying .deps):
#   bash scripts/device-dq-rule.sh
set -uo pipefail
source scripts/device-build.sh
if [[ "${TESTS:-1}" != 0 ]]; then
  ctest --test-dir build-gpu -L gpu -j4 --timeout 300 --output-on-failure \
    -R "packed walks and bands|take the gathered|short windows|packs narrow|how dQ is summed" >"$OUT/tests.log" 2>&1
  grep -E "tests passed|Failed|FAILED" "$OUT/tests.log"
fi
source scripts/device-forced.sh
d="--d ${D:-128}" shape=${SHAPE:-}
lines=(
  "|$d $shape --block 128 --window 1,0"
  "|$d $shape --block 64 --window 2,1"
  "|$d $shape --block 32 --window 2,1"
  "|$d $shape --block 16 --window 4,3"
  "|$d $shape --block 16 --window 5,4"
  "|$d $shape --block 16 --window 6,5"
  "|$d $shape --block 32 --window 3,3"
  "|$d $shape --block 32 --window 3,2"
  "|$d $shape --block 128 --density 0.03,0.05"
  "|$d $shape --block 128 --window 1,1 --heads-kv 8"
  "|$d $shape --block 16 --window 6,5 --heads-kv 8"
  "|$d $shape --block 32 --window 3,3 --heads-kv 8"
  "|$d $shape --block 128 --density 0.05 --heads-kv 8"
  "|$d $shape --block 128 --window 1,1 --heads-kv 4"
  "|$d $shape --block 128 --window 3,2 --heads-kv 4"
  "|$d $shape --block 16 --window 6,5 --heads-kv 4"
  "|$d $shape --block 32 --window 3,3 --heads-kv 4"
  "|$d $shape --block 128 --density 0.05,0.1 --heads-kv 4"
  "|$d $shape --block 16 --causal tl --heads-kv 4 --density 0.02"
  "|$d --batch 1 --heads 4 --seq 65536 --block 128 --window 4,3"
  "|$d --batch 1 --heads 4 --seq 65536 --block 128 --window 2,1"
)
read -ra ways <<<"${WAYS:-SJIT_BACKWARD_DQ=atomic SJIT_BACKWARD_DQ=pass}"
bench_forced | tee "$OUT/dq-rule.log"

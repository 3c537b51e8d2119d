#!/usr/bin/env bash
# On the lent GPU machine: does packing a dK/dV CTA's queries pay, and below what share of the
# contiguous tiles? (docs/attention.md, "Packing counts whole tiles".) Each line is forced onto 64- or
# 128-query tiles (SJIT_BACKWARD_QUERY_TILES) and walks them contiguous, then packed
# (SJIT_BACKWARD_WALK=tiles, packed): random blocks of 16 and 32 and sliding windows, at d = 64 (B4 H32
# S4096) with 1 and 4 query heads a K/V head (on 128-query tiles 2 too), and windows at d = 128 (B2
# H16 S8192, whose 64-query tiles are its only ones). ONLY=REGEX runs the lines it matches (e.g. ONLY='TILES=128' or
# ONLY='--d 128'); ROUNDS rounds (default 2); WAYS other settings (e.g. WAYS='SJIT_BACKWARD_WALK=auto
# SJIT_BACKWARD_WALK=tiles SJIT_BACKWARD_WALK=packed' adds the rule's own choice). Logs in $OUT.
# Usage there (carrying .deps):  ONLY='TILES=128' bash scripts/device-d64-packing.sh
set -uo pipefail
source scripts/device-build.sh
source scripts/device-forced.sh
d64="--d 64 --batch 4 --heads 32 --seq 4096"
d128="--d 128 --batch 2 --heads 16 --seq 8192"
q64="SJIT_BACKWARD_QUERY_TILES=64" q128="SJIT_BACKWARD_QUERY_TILES=128"
lines=(
  "$q64|$d64 --heads-kv 32 --block 16 --density 0.1,0.15,0.2"
  "$q64|$d64 --heads-kv 32 --block 32 --density 0.1,0.2,0.3"
  "$q64|$d64 --heads-kv 32 --block 32 --window 2,1"
  "$q64|$d64 --heads-kv 32 --block 32 --window 3,2"
  "$q64|$d64 --heads-kv 8 --block 32 --window 2,1"
  "$q64|$d64 --heads-kv 32 --block 16 --window 5,4"
  "$q64|$d64 --heads-kv 32 --block 16 --window 6,5"
  "$q64|$d64 --heads-kv 8 --block 16 --window 6,5"
  "$q64|$d128 --heads-kv 16 --block 16 --window 5,4"
  "$q64|$d128 --heads-kv 16 --block 16 --window 6,5"
  "$q64|$d128 --heads-kv 16 --block 32 --window 2,1"
  "$q64|$d128 --heads-kv 16 --block 32 --window 3,2"
  "$q64|$d128 --heads-kv 16 --block 32 --window 4,3"
  "$q128|$d64 --heads-kv 32 --block 16 --window 4,3"
  "$q128|$d64 --heads-kv 32 --block 16 --window 5,4"
  "$q128|$d64 --heads-kv 32 --block 16 --window 12,11"
  "$q128|$d64 --heads-kv 32 --block 32 --window 2,1"
  "$q128|$d64 --heads-kv 32 --block 32 --window 3,2"
  "$q128|$d64 --heads-kv 32 --block 32 --window 4,3"
  "$q128|$d64 --heads-kv 8 --block 16 --window 4,3"
  "$q128|$d64 --heads-kv 8 --block 16 --window 5,4"
  "$q128|$d64 --heads-kv 8 --block 16 --window 6,5"
  "$q128|$d64 --heads-kv 8 --block 16 --window 8,7"
  "$q128|$d64 --heads-kv 8 --block 32 --window 2,1"
  "$q128|$d64 --heads-kv 8 --block 32 --window 4,3"
  "$q128|$d64 --heads-kv 32 --block 32 --window 6,5"
  "$q128|$d64 --heads-kv 32 --block 32 --window 8,7"
  "$q128|$d64 --heads-kv 32 --block 32 --window 12,11"
  "$q128|$d64 --heads-kv 16 --block 16 --window 5,4"
  "$q128|$d64 --heads-kv 16 --block 16 --window 6,5"
  "$q128|$d64 --heads-kv 16 --block 16 --window 8,7"
  "$q128|$d64 --heads-kv 16 --block 16 --window 12,11"
  "$q128|$d64 --heads-kv 16 --block 32 --window 3,2"
  "$q128|$d64 --heads-kv 16 --block 32 --window 4,3"
  "$q128|$d64 --heads-kv 16 --block 32 --window 8,7"
  "$q128|$d64 --heads-kv 8 --block 16 --window 12,11"
  "$q128|$d64 --heads-kv 8 --block 32 --window 6,5"
  "$q128|$d64 --heads-kv 8 --block 32 --window 8,7"
  "$q128|$d64 --heads-kv 8 --block 32 --window 12,11"
  "$q128|$d64 --heads-kv 8 --block 16 --density 0.25,0.3,0.4"
  "$q128|$d64 --heads-kv 8 --block 32 --density 0.5,0.6,0.7"
)
read -ra ways <<<"${WAYS:-SJIT_BACKWARD_WALK=tiles SJIT_BACKWARD_WALK=packed}"
bench_forced | tee "$OUT/packing.log"

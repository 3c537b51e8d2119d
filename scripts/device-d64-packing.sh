#!/usr/bin/env bash
# On the lent GPU machine: does packing a dK/dV CTA's queries pay, and below what share of the
# contiguous tiles? (docs/attention.md, "Packing counts whole tiles".) Each line is forced onto 64- or
# 128-query tiles (SJIT_BACKWARD_QUERY_TILES) and walks them contiguous, then packed
# (SJIT_BACKWARD_WALK=tiles, packed): random blocks of 16 and 32 and sliding windows, at d = 64 (B4 H32
# S4096) with 1 and 4 query heads a K/V head, and windows at d = 128 (B2 H16 S8192, whose 64-query
# tiles are its only ones). COLS=64 or 128 runs only those lines (default both), ONLY=REGEX only the
# lines it matches (e.g. ONLY='--d 128'); ROUNDS rounds (default 2).
# Logs in $OUT. Usage there (carrying .deps):  COLS=128 bash scripts/device-d64-packing.sh
set -uo pipefail
source scripts/device-build.sh
d64="--d 64 --batch 4 --heads 32 --seq 4096"
d128="--d 128 --batch 2 --heads 16 --seq 8192"
# query tiles | heads a K/V head | shape and pattern
lines=(
  "64|32|$d64 --block 16 --density 0.1,0.15,0.2"
  "64|32|$d64 --block 32 --density 0.1,0.2,0.3"
  "64|32|$d64 --block 32 --window 2,1"
  "64|32|$d64 --block 32 --window 3,2"
  "64|8|$d64 --block 32 --window 2,1"
  "64|32|$d64 --block 16 --window 5,4"
  "64|32|$d64 --block 16 --window 6,5"
  "64|8|$d64 --block 16 --window 6,5"
  "64|16|$d128 --block 16 --window 5,4"
  "64|16|$d128 --block 16 --window 6,5"
  "64|16|$d128 --block 32 --window 2,1"
  "64|16|$d128 --block 32 --window 3,2"
  "64|16|$d128 --block 32 --window 4,3"
  "128|32|$d64 --block 16 --window 4,3"
  "128|32|$d64 --block 16 --window 5,4"
  "128|32|$d64 --block 16 --window 12,11"
  "128|32|$d64 --block 32 --window 2,1"
  "128|32|$d64 --block 32 --window 3,2"
  "128|32|$d64 --block 32 --window 4,3"
  "128|8|$d64 --block 16 --window 4,3"
  "128|8|$d64 --block 16 --window 5,4"
  "128|8|$d64 --block 16 --window 6,5"
  "128|8|$d64 --block 16 --window 8,7"
  "128|8|$d64 --block 32 --window 2,1"
  "128|8|$d64 --block 32 --window 4,3"
)
for round in $(seq "${ROUNDS:-2}"); do
  for line in "${lines[@]}"; do
    IFS='|' read -r cols heads_kv pattern <<<"$line"
    [[ -n "${COLS:-}" && "$COLS" != "$cols" ]] && continue
    [[ -n "${ONLY:-}" && ! "$line" =~ $ONLY ]] && continue
    for walk in tiles packed; do
      # shellcheck disable=SC2086
      SJIT_BACKWARD_QUERY_TILES=$cols SJIT_BACKWARD_WALK=$walk timeout 60 ./build-gpu/sjit bench attention \
        --queued --backward --iters 10 --heads-kv "$heads_kv" $pattern 2>&1 | grep -E "^bsr" |
        awk -F'  +' -v w="round $round cols $cols hkv $heads_kv ${pattern%% --batch*} ${pattern#*--seq * } walk $walk" \
          '{print w, "| density", $2, "| bwd", $10, $11}'
    done
  done
done | tee "$OUT/packing.log"

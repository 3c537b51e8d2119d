#!/usr/bin/env bash
# On the lent GPU machine: our attention and the peers' (PyTorch's FlashAttention-2 and cuDNN backends,
# FlexAttention: scripts/peers.py) on the same GPU in one call, at the attention issues' shape (B2 H16
# S8192 D128 bf16, random blocks of 128 a row plus the diagonal), on the same pattern files, so that
# the comparison holds on whatever GPU is lent; then the dense cases of ours and cuDNN alternately.
# Builds the sjit tool alone. About 3.5 minutes on an H200 once started. Logs in $OUT.
# Usage there (carrying .deps): bash scripts/device-peers.sh [DENSITIES, default 1,0.5,0.25,0.1,0.05,0.02]
set -uo pipefail
densities=${1:-1,0.5,0.25,0.1,0.05,0.02}
BUILD_TARGETS=sjit source scripts/device-build.sh
sjit=./build-gpu/sjit

# The pattern files: `sjit bench attention --density D` builds the same ones (seed 7, shared by every head).
patterns=()
for density in ${densities//,/ }; do
  [ "$density" = 1 ] && continue
  "$sjit" pattern build random --seq 8192 --density "$density" -o "$OUT/random-$density.bsr" >/dev/null || exit 1
  patterns+=(--pattern "$OUT/random-$density.bsr")
done

echo "== sparsejit, each call alone, then queued"
timeout 240 "$sjit" bench attention --iters 10 --density "$densities" --backward 2>&1 | tee "$OUT/ours.log"
timeout 240 "$sjit" bench attention --iters 10 --queued --density "$densities" --backward 2>&1 | tee "$OUT/ours-queued.log"
timeout 120 "$sjit" bench attention --iters 10 --queued --causal tl --density 1 --backward 2>&1 | tee "$OUT/ours-causal.log"
echo "== the peers"
timeout 400 python3 scripts/peers.py "${patterns[@]}" 2>&1 | tee "$OUT/peers.log"
timeout 200 python3 scripts/peers.py --causal 2>&1 | tee "$OUT/peers-causal.log"
# The H200's clocks drift by several percent over a run as it warms, more than the gap between the
# dense kernels: ours and cuDNN's dense forward and step, alternately, three rounds, causal twice.
for causal in "" tl; do
  rounds=$([ -z "$causal" ] && echo 3 || echo 2)
  for round in $(seq "$rounds"); do
    echo "== alternately, round $round${causal:+, causal $causal}"
    timeout 60 "$sjit" bench attention --iters 10 --queued ${causal:+--causal $causal} --density 1 --backward 2>&1 |
      grep "^dense" | tee -a "$OUT/alternately.log"
    timeout 60 python3 scripts/peers.py --peers cudnn ${causal:+--causal} 2>&1 | grep "cuDNN" | tee -a "$OUT/alternately.log"
  done
done

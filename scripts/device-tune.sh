#!/usr/bin/env bash
# On the lent GPU machine: build, the tuner's GPU tests, and `sjit tune attention` at the issue's shapes
# (docs/tuning.md, "Attention"). Logs in $OUT. Usage there (carrying .deps, and optionally a kernel cache
# warmed for sm_90a without a GPU, named by WARM_CACHE): bash scripts/device-tune.sh [tests|tune|all]
# BUDGET_S (default 15) bounds the timing of each tuning, ITERS (default 15) the timed runs of a candidate;
# compiling comes on top (about 0.6 s a kernel, on every core).
set -uo pipefail
what=${1:-all}
source scripts/device-build.sh
export SJIT_TUNE_DIR=$(mktemp -d)  # the results of this run only
if [[ -n ${WARM_CACHE:-} && -d $WARM_CACHE ]]; then
  export SJIT_CACHE_DIR=$(mktemp -d); cp -r "$WARM_CACHE"/. "$SJIT_CACHE_DIR"/
fi
if [[ $what == tests || $what == all ]]; then
  timeout 150 ./build-gpu/tests/sjit_gpu_tests '[tune]' >"$OUT/tune-tests.log" 2>&1
  echo "tune tests exit $?"; grep -E "FAILED|failed|passed|with expansion|SKIPPED|seed|error|winner" "$OUT/tune-tests.log" | head -40
fi
if [[ $what == tune || $what == all ]]; then
  tune=(timeout 60 ./build-gpu/sjit tune attention --budget-s "${BUDGET_S:-15}" --iters "${ITERS:-15}")
  {
    "${tune[@]}" 'attention:d=128,dtype=bf16,causal=none,sparsity=dense,pass=fwd' --shape 2,16,16,8192,8192
    "${tune[@]}" 'attention:d=128,dtype=bf16,causal=none,sparsity=bsr,block=128,pass=fwd' --shape 2,16,16,8192,8192 \
      --density 0.1
    "${tune[@]}" 'attention:d=64,dtype=bf16,causal=none,sparsity=dense,pass=fwd' --shape 4,32,32,4096,4096
    ./build-gpu/sjit tune --show
  } >"$OUT/tune-attention.log" 2>"$OUT/tune-attention-progress.log"
  echo "sjit tune exit $?"; cat "$OUT/tune-attention.log"; tail -3 "$OUT/tune-attention-progress.log"
fi

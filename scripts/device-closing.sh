#!/usr/bin/env bash
# On the lent GPU machine, for a closing note: every GPU test (CTest's gpu label, in parallel), the demo on an empty cache, the attention
# forward and backward benchmarks of issues 6 and 7 (atomic and deterministic dQ), and the E23 forward and forward + backward at the
# issue-5 shapes (left out with SKIP_E23=1). Logs in $OUT. Usage there (carrying .deps):
#   bash scripts/device-closing.sh
set -uo pipefail
source scripts/device-build.sh
# Each test case in a process of its own, six at a time: NVRTC's compiles, most of the suite's time,
# then use the machine's cores (one process ran past seven minutes of this script's ten).
timeout 420 ctest --test-dir build-gpu -L gpu -j6 --output-on-failure >"$OUT/gpu-tests.log" 2>&1
echo "gpu tests exit $?"; grep -E "Failed|tests passed|tests failed|Total Test time" "$OUT/gpu-tests.log" | head -30
SJIT_CACHE_DIR=$(mktemp -d) timeout 120 ./build-gpu/sjit demo >"$OUT/demo.log" 2>&1
echo "demo exit $?"; tail -n 16 "$OUT/demo.log"
timeout 120 ./build-gpu/sjit bench attention --iters 10 --density 1,0.5,0.25,0.1,0.05,0.02 --backward \
  >"$OUT/bench-attention.log" 2>&1
{
  # Long sequences: ANCHORS.md's FlexAttention rows at B1 H16 S32768 (blocks of 128), where a row holds
  # 4x the blocks of the table's at the same density.
  timeout 150 ./build-gpu/sjit bench attention --iters 10 --batch 1 --seq 32768 --density 1,0.1,0.05,0.02 --backward
  timeout 60 ./build-gpu/sjit bench attention --iters 10 --causal tl --density 1,0.1 --backward
  timeout 60 ./build-gpu/sjit bench attention --iters 10 --d 64 --batch 4 --heads 32 --seq 4096 --density 1,0.1 --backward
  # d = 64's crossovers between atomic dQ (128-query dK/dV tiles) and the dQ pass, measured on the H200
  # only (attention.md, "d = 64: atomic dQ on 128-query tiles"): one head at 1-3 tiles a row, four
  # heads a K/V head at 3 and 8, where the H100's d = 128 crossovers lie higher.
  for dq in atomic pass; do
    timeout 60 ./build-gpu/sjit bench attention --iters 10 --queued --d 64 --batch 4 --heads 32 --seq 4096 --density 0.02,0.05,0.1 --backward --dq $dq
    timeout 60 ./build-gpu/sjit bench attention --iters 10 --queued --d 64 --batch 4 --heads 32 --seq 4096 --heads-kv 8 --density 0.1,0.25 --backward --dq $dq
  done
  # What determinism costs: the deterministic backward at the densities its table quotes.
  timeout 90 ./build-gpu/sjit bench attention --iters 10 --deterministic --density 1,0.5,0.1,0.02 --backward
  timeout 60 ./build-gpu/sjit bench attention --iters 10 --causal tl --deterministic --density 0.1 --backward
  timeout 60 ./build-gpu/sjit bench attention --iters 10 --d 64 --batch 4 --heads 32 --seq 4096 --deterministic --density 1,0.1 --backward
  # Pattern blocks of 64 (the dK/dV pass skips a warpgroup's inactive keys), at d = 128 and 96.
  timeout 60 ./build-gpu/sjit bench attention --iters 10 --block 64 --density 0.5,0.1 --backward
  timeout 60 ./build-gpu/sjit bench attention --iters 10 --block 64 --d 96 --density 0.1 --backward
  # Blocks of 64 where the key-block backward runs: d = 64, deterministic, and the 128-key pass asked
  timeout 60 ./build-gpu/sjit bench attention --iters 10 --block 64 --d 64 --batch 4 --heads 32 --seq 4096 --density 0.25,0.1 --backward
  timeout 60 ./build-gpu/sjit bench attention --iters 10 --block 64 --deterministic --density 0.25,0.1 --backward
  timeout 60 ./build-gpu/sjit bench attention --iters 10 --block 64 --deterministic --density 0.25,0.1 --backward --walk tiles
  # Pattern blocks of 32 and 16: each pattern on the narrow or the wide tiles (the config column says
  # which), random blocks and a sliding window of 16 blocks.
  timeout 90 ./build-gpu/sjit bench attention --iters 10 --block 32 --density 0.5,0.25,0.1,0.02 --backward
  timeout 90 ./build-gpu/sjit bench attention --iters 10 --block 16 --density 0.5,0.25,0.1,0.05,0.02 --backward
  # Blocks of 16: sparse random patterns on the gathered-key kernel (chosen above) against the narrow
  # tiles (forced), and at d = 64.
  timeout 60 ./build-gpu/sjit bench attention --iters 10 --block 16 --density 0.1,0.05,0.02 --config warps=4,mt=1,bn=16,stages=2,qreg=0,path=wgmma
  timeout 60 ./build-gpu/sjit bench attention --iters 10 --block 16 --d 64 --batch 4 --heads 32 --seq 4096 --density 0.25,0.1,0.02 --backward
  timeout 60 ./build-gpu/sjit bench attention --iters 10 --block 32 --d 64 --batch 4 --heads 32 --seq 4096 --density 0.25,0.1,0.02 --backward
  # The gathered backward (chosen above for sparse random blocks of 16 and 32) against the 128-key
  # CTAs' walk (asked), at d = 128 and 64.
  timeout 60 ./build-gpu/sjit bench attention --iters 10 --block 16 --density 0.1,0.05 --backward --walk packed
  timeout 60 ./build-gpu/sjit bench attention --iters 10 --block 32 --density 0.1,0.05 --backward --walk packed
  timeout 60 ./build-gpu/sjit bench attention --iters 10 --block 16 --d 64 --batch 4 --heads 32 --seq 4096 --density 0.25,0.1 --backward --walk packed
  timeout 60 ./build-gpu/sjit bench attention --iters 10 --block 32 --d 64 --batch 4 --heads 32 --seq 4096 --density 0.25,0.1 --backward --walk packed
  timeout 60 ./build-gpu/sjit bench attention --iters 10 --block 16 --window 8,7 --backward
  timeout 60 ./build-gpu/sjit bench attention --iters 10 --block 16 --window 8,7 --config warps=4,mt=1,bn=16,stages=2,qreg=0,path=wgmma
  timeout 60 ./build-gpu/sjit bench attention --iters 10 --block 32 --window 4,3 --backward
  timeout 60 ./build-gpu/sjit bench attention --iters 10 --block 32 --window 4,3 --config warps=4,mt=1,bn=32,stages=2,qreg=0,path=wgmma
  # d = 64's dK/dV tiles for blocks of 16 and 32, chosen per pattern: 64 queries for short walks
  # (the first window of each block, and 4 + 1 + 3 blocks of 16 with four query heads a K/V head), 128
  # for long ones (the second, 6 + 1 + 5 with four heads, and random 0.5 and 0.6; blocks of 32 at 0.5
  # run the gathered backward).
  for w in "16 --window 8,7" "16 --window 16,15" "32 --window 2,1" "32 --window 4,3" "16 --density 0.5" "32 --density 0.6" \
    "16 --window 4,3 --heads-kv 8" "16 --window 6,5 --heads-kv 8"; do
    # shellcheck disable=SC2086
    timeout 60 ./build-gpu/sjit bench attention --iters 10 --queued --d 64 --batch 4 --heads 32 --seq 4096 --backward --block $w
  done
  # GQA, 4 query heads a K/V head: the backward chooses the dQ pass below 20 key tiles a query row.
  timeout 60 ./build-gpu/sjit bench attention --iters 10 --heads-kv 4 --density 1,0.25,0.1 --backward
  timeout 60 ./build-gpu/sjit bench attention --iters 10 --heads-kv 4 --block 16 --density 0.25,0.1,0.02 --backward
  timeout 60 ./build-gpu/sjit bench attention --iters 10 --heads-kv 4 --block 32 --density 0.25,0.1,0.02 --backward
  # A training step captured into a CUDA graph, timed alternately with the same calls made directly.
  timeout 90 ./build-gpu/sjit bench attention --iters 10 --backward --graph --density 1,0.1,0.02
  # d = 256 (the one-item wgmma forward; the Hopper backward with its warpgroups on half the dims
  # each) and d = 96 (the Hopper kernels forward and backward, tiles in whole swizzle blocks), each
  # against the mma.sync kernels.
  timeout 90 ./build-gpu/sjit bench attention --iters 10 --d 256 --seq 4096 --density 1,0.1 --backward
  timeout 90 ./build-gpu/sjit bench attention --iters 10 --d 256 --seq 4096 --density 1,0.1 --backward --config warps=4,mt=1,bn=32,stages=2,qreg=0,path=mma
  timeout 60 ./build-gpu/sjit bench attention --iters 10 --d 96 --density 1,0.1 --causal tl
  timeout 90 ./build-gpu/sjit bench attention --iters 10 --d 96 --density 1,0.1 --backward
  timeout 90 ./build-gpu/sjit bench attention --iters 10 --d 96 --density 1,0.1 --backward --config warps=4,mt=2,bn=32,stages=2,qreg=0,path=mma
  # Timed as a training loop would run them: every run enqueued before the first wait.
  timeout 60 ./build-gpu/sjit bench attention --iters 10 --queued --density 1,0.1,0.05 --backward
} >>"$OUT/bench-attention.log" 2>&1
cat "$OUT/bench-attention.log"
[[ -n ${SKIP_E23:-} ]] && exit 0
for shape in "--batch 4 --slots 8" "--batch 64 --slots 32"; do
  timeout 60 ./build-gpu/sjit bench e23 $shape --dim 512 --steps 64 --dtype bf16 \
    --kind softmax,sparsemax,entmax15,entmax:1.25 --backward
done >"$OUT/bench-e23.log" 2>&1
cat "$OUT/bench-e23.log"

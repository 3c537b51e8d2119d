#!/usr/bin/env bash
# On the lent GPU machine: the E23 forward's hand-overs between its tiles and tape items
# (docs/e23.md, "No grid barrier"). Builds the tree, runs the E23 forward GPU tests (the lag test
# "z tiles that read h_t late" among them) and the f32 ones under racecheck; then builds a copy whose
# tape items store h_{t+1} as the f32 build did until 2026-11-28 (the fix of 832994a undone) and runs
# the lag test there, which must fail: the test can tell the race. Usage there (carrying .deps):
#   bash scripts/device-e23-races.sh
set -uo pipefail
source scripts/device-build.sh
tests=./build-gpu/tests/sjit_gpu_tests
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
lag_test='E23 forward: z tiles that read h_t late still read h_t (SJIT_E23_TILE_LAG_NS)'
"$tests" -w NoTests "E23 forward*" >"$OUT/e23-forward.log" 2>&1
echo "E23 forward tests: exit $? ($(grep -E 'test cases|All tests passed' "$OUT/e23-forward.log" | tail -1))"
for t in 'E23 forward: dims 8 to 1024\, including dims that are not multiples of 16' "$lag_test"; do
  SJIT_LINEINFO=1 timeout 200 "$sanitizer" --tool racecheck --print-limit 4 "$tests" -w NoTests "$t" >"$OUT/racecheck.log" 2>&1
  echo "racecheck, $t: exit $? ($(grep -E 'RACECHECK SUMMARY' "$OUT/racecheck.log" | tail -1))"
done
# The fix undone in a copy of the tree: the lag test must fail there.
unfixed=/tmp/sjit-unfixed
rm -rf "$unfixed" && mkdir -p "$unfixed"
tar --exclude=./build-gpu --exclude=./build -cf - . | tar -xf - -C "$unfixed"
patch -s -R -p1 -d "$unfixed" <<'PATCH'
diff --git a/templates/sparsejit/e23_forward.cuh b/templates/sparsejit/e23_forward.cuh
index 4d2468e..2b2867b 100644
--- a/templates/sparsejit/e23_forward.cuh
+++ b/templates/sparsejit/e23_forward.cuh
@@ -171,7 +171,9 @@ __device__ void tape_step(const E23ForwardParams& p, int b, int t, float* smem)
   }
   // z_t and w_{t-1} arrive as tagged words (tag t + 1): polling them is the wait.
   // z_t waits in registers through the normalizer (its latency then overlaps w's); the f32 build has no
-  // registers to spare for it (it would spill) and polls it where it is used.
+  // registers to spare for it (it would spill) and polls it where it is used. Then a thread's words show
+  // only that the tiles of its own columns are done with h_t, while every z tile reads all of h_t, so
+  // that build stores h_{t+1} over it only after a barrier (below).
   constexpr bool early_z = Cfg::tensor_cores;
   const unsigned tag = unsigned(t) + 1;
   float4 z[per_thread];
@@ -216,11 +218,20 @@ __device__ void tape_step(const E23ForwardParams& p, int b, int t, float* smem)
     const float4 h = make_float4(fast_tanh(z[j].x + v.x), fast_tanh(z[j].y + v.y), fast_tanh(z[j].z + v.z),
                                  fast_tanh(z[j].w + v.w));
     *reinterpret_cast<float4*>(x + k) = h;
-    store_state4(p.h + b * D + k, h);
+    if constexpr (early_z) store_state4(p.h + b * D + k, h);  // every z word was polled before the barrier
     if (p.save_h != nullptr) store_state4(p.save_h + ((long long)(t + 1) * p.batch + b) * D + k, h);
     store_output4(y + k, h);
     if (h_final != nullptr) store_output4(h_final + k, h);
   }
+  if constexpr (!early_z) {
+    // Every thread has polled its z words, so every z tile of the group is done with h_t. (Storing
+    // each column of h_{t+1} right after its own words let a slower z tile read it in place of h_t:
+    // found by compute-sanitizer's racecheck, whose slow shared memory makes the tiles lag, and seen
+    // once in 36 f32 runs without it on a busy GPU.) Each thread stores the columns it computed.
+    __syncthreads();
+    for (int k = 4 * threadIdx.x; k < D; k += 4 * Cfg::threads)
+      store_state4(p.h + b * D + k, *reinterpret_cast<const float4*>(x + k));
+  }
   signal_counter(hs_counter(p, g));  // h_{t+1} is out: the group's tiles may start step t + 1
   profile_mark(p, t, kMarkTapeSignalled);
   // In the shadow of the next products: the write's scores q = s M_t h_{t+1} (and the checkpoint of M_t)
PATCH
(cd "$unfixed" && cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release >/dev/null 2>&1 &&
  cmake --build build-gpu -j16 --target sjit_gpu_tests >/dev/null 2>&1) || { echo "the unfixed copy did not build"; exit 1; }
"$unfixed/build-gpu/tests/sjit_gpu_tests" -w NoTests "$lag_test" >"$OUT/e23-unfixed.log" 2>&1
status=$?
echo "the lag test without the fix: exit $status (it must fail: $(grep -m1 -A1 'FAILED' "$OUT/e23-unfixed.log" | tail -1))"
grep -m3 -E "want" "$OUT/e23-unfixed.log"

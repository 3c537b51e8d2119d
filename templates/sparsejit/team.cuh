// Reductions over a "team": the TPR threads that share one row. A team of at most 32 threads lives in
// one warp and reduces with shuffles; a larger team is the whole block and adds one shared-memory
// round. Values are small structs with combine() and identity() so that one pass reduces several
// quantities at once.
#pragma once

namespace sjit_kernels {

struct MaxNan {  // the row maximum, and whether any entry is NaN (NaN rows give NaN rows)
  float max;
  float nan;  // 1 if a NaN was seen
  __device__ static MaxNan combine(MaxNan a, MaxNan b) { return {fmaxf(a.max, b.max), fmaxf(a.nan, b.nan)}; }
  __device__ static MaxNan identity() { return {-__int_as_float(0x7f800000), 0.0f}; }
};

struct Sum2 {
  float a, b;
  __device__ static Sum2 combine(Sum2 x, Sum2 y) { return {x.a + y.a, x.b + y.b}; }
  __device__ static Sum2 identity() { return {0.0f, 0.0f}; }
};

// Sums over the current support guess {x > tau}: size, sum of (x - tau), sum of (x - tau)^2 (or of the
// derivative term for general alpha), and the smallest member (for the consistency test).
struct SupportStats {
  float count, s1, s2, min_x;
  __device__ static SupportStats combine(SupportStats x, SupportStats y) {
    return {x.count + y.count, x.s1 + y.s1, x.s2 + y.s2, fminf(x.min_x, y.min_x)};
  }
  __device__ static SupportStats identity() { return {0.0f, 0.0f, 0.0f, __int_as_float(0x7f800000)}; }
};

template <class V>
__device__ __forceinline__ V shuffle_xor(V v, int offset, int width) {
  constexpr int words = sizeof(V) / sizeof(float);
  static_assert(sizeof(V) == words * sizeof(float), "team values are structs of floats");
  float* f = reinterpret_cast<float*>(&v);
#pragma unroll
  for (int i = 0; i < words; ++i) f[i] = __shfl_xor_sync(0xffffffffu, f[i], offset, width);
  return v;
}

// TPR: threads per row. BLOCK: threads per block (TPR > 32 requires TPR == BLOCK: one row per block).
template <int TPR, int BLOCK>
struct Team {
  static_assert(TPR >= 1 && (TPR & (TPR - 1)) == 0, "threads per row is a power of two");
  static_assert(TPR <= 32 || TPR == BLOCK, "a team wider than a warp is the whole block");
  static constexpr bool spans_warps = TPR > 32;
  static constexpr int warps = BLOCK / 32;

  // Shared scratch for block-wide teams: two buffers used in turn, so consecutive reductions need one
  // barrier each instead of two (a buffer is rewritten only after the next reduction's barrier, which
  // every thread reaches only once it has read the buffer).
  static constexpr int kScratchFloats = spans_warps ? 2 * warps * 4 : 1;

  // Every thread of the team receives the reduction of all the team's values. All threads of a warp
  // must call it together (shuffles use the full mask), which the kernels guarantee by keeping loop
  // trip counts warp-uniform.
  template <class V>
  __device__ __forceinline__ static V reduce(V v, float* scratch, int& turn) {
    constexpr int width = TPR < 32 ? TPR : 32;
#pragma unroll
    for (int offset = width / 2; offset > 0; offset /= 2) v = V::combine(v, shuffle_xor(v, offset, width));
    if constexpr (spans_warps) {
      static_assert(sizeof(V) <= 4 * sizeof(float), "scratch holds four floats a warp");
      // Buffer `turn` starts at the same float whatever V's size: reductions of different structs
      // share the buffers, and one indexed in V's would overlap the other buffer of a larger V.
      V* slot = reinterpret_cast<V*>(scratch + turn * warps * 4);
      turn ^= 1;
      const int lane = threadIdx.x % 32;
      if (lane == 0) slot[threadIdx.x / 32] = v;
      __syncthreads();
      // Every warp reduces the per-warp partials itself (no second barrier): lane w takes warp w's.
      v = lane < warps ? slot[lane] : V::identity();
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2) v = V::combine(v, shuffle_xor(v, offset, 32));
    }
    return v;
  }

  // Loop control that every lane of a warp agrees on: true while any team in the warp is still going.
  __device__ __forceinline__ static bool any(bool still_going) {
    if constexpr (TPR == 1) return still_going;  // one row per thread: divergence is harmless
    else if constexpr (spans_warps) return still_going;  // every thread holds the same reduced values
    else return __any_sync(0xffffffffu, still_going);
  }
};

}  // namespace sjit_kernels

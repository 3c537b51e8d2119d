// The tape side of an E23 step for one batch row, done by one CTA: scores against every slot, the
// attention weights (the row normalizers of rownorm.cuh, run by one warp), the read value, the write.
//
// Slots are spread over the warps (warp j scores slots j, j + warps, ...: a whole dot product per warp,
// no cross-warp reduction); the read value and the write are spread over the dimensions. Sparsity: a
// slot with read weight 0 is not read for v, and a slot with write weight 0 is neither read for the
// blend nor stored.
#pragma once

#include "sparsejit/element.cuh"
#include "sparsejit/rownorm.cuh"

namespace sjit_kernels {

__device__ __forceinline__ float4 load_state4(const float* p) { return __ldcg(reinterpret_cast<const float4*>(p)); }
__device__ __forceinline__ void store_state4(float* p, float4 v) { __stcg(reinterpret_cast<float4*>(p), v); }
__device__ __forceinline__ float dot4(float4 a, float4 b) { return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w; }
__device__ __forceinline__ float4 blend4(float4 m, float4 w, float b) {  // (1 - b) m + b w
  const float keep = 1.0f - b;
  return make_float4(keep * m.x + b * w.x, keep * m.y + b * w.y, keep * m.z + b * w.z, keep * m.w + b * w.w);
}

// The tape of a batch row is touched only by the CTA that owns its tape item, and it lives either in
// that CTA's shared memory (kShared) or in the workspace, read and written through L2 (docs/e23.md).
template <bool kShared>
__device__ __forceinline__ float4 load_tape4(const float* p) {
  if constexpr (kShared) return *reinterpret_cast<const float4*>(p);
  else return load_state4(p);
}
template <bool kShared>
__device__ __forceinline__ void store_tape4(float* p, float4 v) {
  if constexpr (kShared) *reinterpret_cast<float4*>(p) = v;
  else store_state4(p, v);
}

template <class T>
__device__ __forceinline__ float4 load_input4(const T* p) {
  float v[4];
  load_packet<T, 4>(p, v);
  return make_float4(v[0], v[1], v[2], v[3]);
}
template <class T>
__device__ __forceinline__ void store_output4(T* p, float4 v) {
  const float f[4] = {v.x, v.y, v.z, v.w};
  store_packet<T, 4>(p, f);
}

// tanh(x) = 1 - 2 / (exp(2x) + 1): five instructions, relative error about 1e-6 (absolute 1e-7 near 0).
// Every place that needs h_{t+1} computes it with this same function from the same fp32 inputs, so all
// of them see the same bits.
__device__ __forceinline__ float fast_tanh(float x) {
  return 1.0f - __fdividef(2.0f, __expf(2.0f * x) + 1.0f);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// The normalizer of the spec, as a rownorm config for a row of N scores: held by one warp, one score a
// lane (kThreadsPerRow = 32), or whole by every lane (1).
template <class Cfg, int kThreadsPerRow = 32>
struct SlotNormCfg {
  using T = float;
  static constexpr int kind = Cfg::kind;
  static constexpr float alpha = Cfg::alpha;
  static constexpr int n = Cfg::n_slots;
  static constexpr int threads_per_row = kThreadsPerRow, vec = 1, block_threads = 32;
  static constexpr bool row_in_smem = false, wrong_result_for_tests = false;
};

// Up to 32 slots (the goal shapes' N = 8 and 32) every lane reads all N scores (shared-memory broadcasts)
// and works on its own copy, so the normalizer needs a few warp-wide operations in all instead of a
// 5-level shuffle reduction per pass (the rownorm path: the census, then one reduction per Newton step of
// the threshold search, then the support count):
//   softmax      max lane by lane; the sum of exp over all N by each lane (N <= 8) or one warp sum.
//   sparsemax,   exact in one pass (sort-free): lane i tries the support S_i = {j : x_j >= x_i}, whose
//   1.5-entmax   threshold has a closed form (sparsemax: tau = (sum_S x - 1) / |S|; 1.5-entmax: the
//                smaller root of sum_S (x - tau)^2 = 1); S_i is consistent iff x_i > tau_i, and the
//                support is the largest consistent S_i (Peters, Niculae & Martins 2019, Alg. 2, without
//                the sort): one max, one ballot and one shuffle pick it.
//   other alpha  (N <= 8) the rownorm algorithm with the whole row in each lane (a team of one thread:
//                its reductions are no-ops).
// Every lane ends with the same threshold (or sum), so forward and backward see the same bits.
template <class Cfg>
inline constexpr bool kSlotsInLanes =
    Cfg::n_slots <= 32 && (Cfg::kind != kEntmax || Cfg::alpha == 1.5f || Cfg::n_slots <= 8);

template <class Cfg>
__device__ __forceinline__ int normalize_slots_in_lanes(float* scores) {
  constexpr int N = Cfg::n_slots, kind = Cfg::kind;
  constexpr unsigned all = 0xffffffffu;
  const int lane = threadIdx.x % 32;
  const bool inside = lane < N;
  if constexpr (kind == kEntmax && Cfg::alpha != 1.5f) {  // the rownorm search, lane by lane
    using LaneCfg = SlotNormCfg<Cfg, 1>;
    typename RowNormTraits<LaneCfg>::Slice row(nullptr, 0);
#pragma unroll
    for (int i = 0; i < N; ++i) row.v[i][0] = scores[i];
    float unused_scratch[1];
    int turn = 0;
    const int support = normalize_row<LaneCfg>(row, 1.0f, true, unused_scratch, turn);
    __syncwarp();  // every lane has read every score
#pragma unroll
    for (int i = 0; i < N; ++i)
      if (lane == i) scores[i] = row.v[i][0];
    return support;
  } else {
    float x[N];
#pragma unroll
    for (int i = 0; i < N; ++i) x[i] = scores[i];
    float mine = inside ? scores[lane] : -infinity();
    // The census of normalize_row (rownorm.cuh), lane by lane: max, NaN, +inf.
    float max = -infinity();
    bool nan = false, pos_inf = false;
#pragma unroll
    for (int i = 0; i < N; ++i) {
      max = fmaxf(max, x[i]);
      nan = nan || x[i] != x[i];
      pos_inf = pos_inf || x[i] == infinity();
    }
    const bool undefined = nan || max == -infinity();
    constexpr float scale = kind == kSoftmax ? 1.4426950408889634f : kind == kSparsemax ? 1.0f : Cfg::alpha - 1.0f;
    auto scaled = [&](float v) {
      return undefined ? 0.0f : pos_inf ? (v == infinity() ? 0.0f : -infinity()) : (v - max) * scale;
    };
#pragma unroll
    for (int i = 0; i < N; ++i) x[i] = scaled(x[i]);
    mine = inside ? scaled(mine) : -infinity();
    float y;
    if constexpr (kind == kSoftmax) {
      const float e = exp2f(mine);
      float total = 0.0f;
      if constexpr (N <= 8) {
#pragma unroll
        for (int i = 0; i < N; ++i) total += exp2f(x[i]);
      } else {
        total = warp_sum(e);
      }
      y = e * (1.0f / total);
    } else {
      float count = 0.0f, s1 = 0.0f, s2 = 0.0f;  // over S = {j : x_j >= mine}
#pragma unroll
      for (int i = 0; i < N; ++i)
        if (x[i] >= mine) count += 1.0f, s1 += x[i], s2 += x[i] * x[i];
      float tau;
      bool consistent;
      if constexpr (kind == kSparsemax) {
        tau = (s1 - 1.0f) / count;
        consistent = mine > tau;
      } else {  // sum_S (x - tau)^2 = 1: count tau^2 - 2 s1 tau + s2 - 1 = 0, the root below every x in S
        const float disc = s1 * s1 - count * (s2 - 1.0f);
        tau = (s1 - sqrtf(fmaxf(disc, 0.0f))) / count;
        consistent = disc >= 0.0f && mine > tau;
      }
      consistent = consistent && inside;  // the lane of the largest x always is
      const unsigned size = consistent ? unsigned(count) : 0u;
      const unsigned largest = __reduce_max_sync(all, size);
      const int from = __ffs(__ballot_sync(all, consistent && size == largest)) - 1;
      tau = __shfl_sync(all, tau, from);
      y = entmax_value<kind, RowNormTraits<SlotNormCfg<Cfg>>::p_twice>(mine, tau, Cfg::alpha);
    }
    if (undefined) y = quiet_nan();
    __syncwarp();  // every lane has read every score
    if (inside) scores[lane] = y;
    return __popc(__ballot_sync(all, inside && y > 0.0f));
  }
}

// Called by one whole warp: scores[0, N) in shared memory become the normalized weights. Returns the
// support size (the same in every lane).
template <class Cfg>
__device__ __forceinline__ int normalize_slots(float* scores) {
  if constexpr (kSlotsInLanes<Cfg>) {
    return normalize_slots_in_lanes<Cfg>(scores);
  } else {
    using NormCfg = SlotNormCfg<Cfg>;
    const int lane = threadIdx.x % 32;
    typename RowNormTraits<NormCfg>::Slice row(nullptr, lane);
    constexpr int sweeps = decltype(row)::sweeps;
#pragma unroll
    for (int s = 0; s < sweeps; ++s) {
      const int i = s * 32 + lane;
      row.v[s][0] = i < Cfg::n_slots ? scores[i] : -infinity();
    }
    float unused_scratch[1];
    int turn = 0;
    normalize_row<NormCfg>(row, 1.0f, false, unused_scratch, turn);
    __syncwarp();
    int support = 0;  // by ballots rather than a shuffle reduction
#pragma unroll
    for (int s = 0; s < sweeps; ++s) {
      const int i = s * 32 + lane;
      if (i < Cfg::n_slots) scores[i] = row.v[s][0];
      support += __popc(__ballot_sync(0xffffffffu, i < Cfg::n_slots && row.v[s][0] > 0.0f));
    }
    return support;
  }
}

// scores[i] = scale * <M_i, x> for every slot, x in shared memory, the tape in shared or global memory. With `apply_write`, each slot is first
// moved to (1 - b_i) M_i + b_i w (the pending write of the previous step) and stored back; with `from`
// set (the first step), slots come from m0 in T and are all stored to the fp32 tape. With `checkpoint`
// set, every slot (after the write) is also copied there: the tape saved for the backward.
// (kCheckpoint is a template flag so that the launches that save nothing run the loop without it.)
template <class Cfg, bool kShared, bool kCheckpoint = false>
__device__ __forceinline__ void score_slots(float* tape, const typename Cfg::T* from, const float* x,
                                            const float* write_weights, const float* write_value, float* scores,
                                            float* checkpoint = nullptr) {
  constexpr int D = Cfg::dim, warps = Cfg::threads / 32;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll 2
  for (int i = warp; i < Cfg::n_slots; i += warps) {
    float* slot = tape + i * D;
    const float bi = write_weights != nullptr ? write_weights[i] : 0.0f;
    float dot = 0.0f;
    for (int k = 4 * lane; k < D; k += 128) {
      float4 m = from != nullptr ? load_input4(from + i * D + k) : load_tape4<kShared>(slot + k);
      if (bi > 0.0f) m = blend4(m, *reinterpret_cast<const float4*>(write_value + k), bi);
      if (from != nullptr || bi > 0.0f) store_tape4<kShared>(slot + k, m);
      if constexpr (kCheckpoint) store_state4(checkpoint + i * D + k, m);
      dot += dot4(m, *reinterpret_cast<const float4*>(x + k));
    }
    dot = warp_sum(dot);
    if (lane == 0) scores[i] = Cfg::scale * dot;
  }
}

// One float4 column k of the tape, for the slots that matter: applies the pending write
// (M_i = (1 - b_i) M_i + b_i w where b_i > 0, stored back) and returns v = sum_i a_i M_i of the written
// tape (a in `read`, b in `write`, w in shared memory). Slots with a_i = b_i = 0 are not touched; slots go
// four at a time with their loads issued together.
template <class Cfg, bool kShared>
__device__ __forceinline__ float4 write_and_read(float* tape, const float* read, const float* write, const float* w,
                                                 int k) {
  constexpr int D = Cfg::dim, kGroup = 4;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int i0 = 0; i0 < Cfg::n_slots; i0 += kGroup) {
    float4 m[kGroup];
    float a[kGroup], b[kGroup];
#pragma unroll
    for (int j = 0; j < kGroup; ++j) {
      const int i = i0 + j;
      a[j] = i < Cfg::n_slots ? read[i] : 0.0f;
      b[j] = i < Cfg::n_slots ? write[i] : 0.0f;
      m[j] = a[j] > 0.0f || b[j] > 0.0f ? load_tape4<kShared>(tape + i * D + k) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int j = 0; j < kGroup; ++j) {
      if (b[j] > 0.0f) {
        m[j] = blend4(m[j], *reinterpret_cast<const float4*>(w + k), b[j]);
        store_tape4<kShared>(tape + (i0 + j) * D + k, m[j]);
      }
      acc.x += a[j] * m[j].x, acc.y += a[j] * m[j].y, acc.z += a[j] * m[j].z, acc.w += a[j] * m[j].w;
    }
  }
  return acc;
}

}  // namespace sjit_kernels

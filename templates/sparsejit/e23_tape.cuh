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

// The normalizer of the spec, as a rownorm config for a row of N scores held by one warp.
template <class Cfg>
struct SlotNormCfg {
  using T = float;
  static constexpr int kind = Cfg::kind;
  static constexpr float alpha = Cfg::alpha;
  static constexpr int n = Cfg::n_slots;
  static constexpr int threads_per_row = 32, vec = 1, block_threads = 32;
  static constexpr bool row_in_smem = false, wrong_result_for_tests = false;
};

// Called by one whole warp: scores[0, N) in shared memory become the normalized weights. Returns the
// support size (the same in every lane).
template <class Cfg>
__device__ __forceinline__ int normalize_slots(float* scores) {
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
  const int support = normalize_row<NormCfg>(row, 1.0f, true, unused_scratch, turn);
  __syncwarp();
#pragma unroll
  for (int s = 0; s < sweeps; ++s) {
    const int i = s * 32 + lane;
    if (i < Cfg::n_slots) scores[i] = row.v[s][0];
  }
  return support;
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

// E23 forward over a sequence (docs/e23.md): one persistent launch computes every step for every
// batch row.
//
// A step per batch row b, with s the score scale and f the normalizer:
//   read   a = f(s M h),  v = sum_i a_i M_i          update  h' = tanh(W_h h + u_t + v)
//   write  w = W_w h',  b = f(s M h'),  M'_i = (1 - b_i) M_i + b_i w
//
// Work items. A tape item is one batch row: its scores, normalizers, read value and write (one CTA,
// e23_tape.cuh). A product tile is 16 rows of a weight matrix times a group of 32 batch rows
// (e23_gemv.cuh). CTA c takes items c, c + grid, ...; the grid is never larger than what can be
// resident at once, and two grid barriers per step order the phases:
//
//   phase A (step t)  tape items: apply the pending write of step t-1 (M_t = (1 - b) M_{t-1} + b w),
//                     score M_t against h_t, a = f(.), v = sum a_i M_i
//                     tiles:      z = W_h h_t + u_t
//   -- barrier --
//   phase B (step t)  tape items: h_{t+1} = tanh(z + v) -> state and y_t; b = f(s M_t h_{t+1})
//                     tiles:      w = W_w tanh(z + v)   (each tile computes its operand itself)
//   -- barrier --
//   final             tape items: apply the last write, store M_T; h_T was stored in the last phase B.
//
// The write of step t is applied in phase A of step t+1 rather than in phase B, because w only exists
// once every tile of phase B is done; folding it into the next read costs no extra pass over the tape.
// State lives in fp32 in the workspace (L2-resident for moderate sizes); only inputs and outputs are T.
// Each batch row's tape is touched only by the CTA that owns its tape item, so when the launch has a
// CTA per batch row and the row's tape fits, it stays in that CTA's shared memory for the whole launch
// (p.tape_in_shared; the front end decides and asks for the room).
// With save_h / save_w / save_m set, the launch also keeps what the backward needs (e23_backward.cuh):
// every h_t and w_t in fp32, and the tape every checkpoint_every steps.
#pragma once

#include "sparsejit/e23_gemv.cuh"
#include "sparsejit/e23_grid_sync.cuh"
#include "sparsejit/e23_params.cuh"
#include "sparsejit/e23_tape.cuh"

namespace sjit_kernels {

// Cfg: T, kind (NormKindId), alpha, n_slots, dim, scale, threads, tensor_cores.
template <class Cfg>
struct E23Traits {
  using T = typename Cfg::T;
  static constexpr int D = Cfg::dim, N = Cfg::n_slots;
  static constexpr int warps = Cfg::threads / 32;
  static constexpr int row_tiles = (D + kGemvTileRows - 1) / kGemvTileRows;
  static constexpr int slots_padded = (N + 3) / 4 * 4;  // keeps the float4 views of shared memory aligned
  // Shared memory, floats: a tape item holds x, w, the write weights and the scores; a tile holds the
  // per-warp partial sums (and the FMA path's operand staging). When the launch keeps the tape on chip
  // (p.tape_in_shared), the batch row's N x D tape follows, at shared_floats: the front end then asks
  // for 4 (shared_floats + N D) bytes.
  static constexpr int tape_floats = 2 * D + 2 * slots_padded;
  static constexpr int tile_floats = (Cfg::tensor_cores ? 1 : 2) * warps * kGemvTileOutputs;
  static constexpr int shared_floats = tape_floats > tile_floats ? tape_floats : tile_floats;

  static_assert(D % 8 == 0, "dim is a multiple of 8: tape rows move as float4 and T packets");
  static_assert(Cfg::threads % 32 == 0 && Cfg::threads <= 1024, "whole warps");
  static_assert(N >= 1 && N <= 256, "1 to 256 slots: one warp normalizes at most 8 scores a lane");
  static_assert(Cfg::kind != kEntmax || Cfg::alpha > 1.0f, "entmax needs alpha > 1");
};

// The tape M of batch row b: in the owning CTA's shared memory when the launch keeps it there (every
// tape item then has a CTA of its own, and CTA b owns row b for the whole launch), else in the workspace.
// The tape functions below are instantiated for both (kShared), and the kernel picks one per launch:
// a pointer that may point into either space costs 40 registers more at N = 32 (generic addressing).
template <class Cfg, bool kShared>
__device__ __forceinline__ float* tape_of(const E23ForwardParams& p, int b, float* smem) {
  if constexpr (kShared) return smem + E23Traits<Cfg>::shared_floats;
  else return p.m + (long long)b * Cfg::n_slots * Cfg::dim;
}

// Operands of the products: x_b[k], x_b[k + 1] in fp32.
template <class T, int D>
struct InitialState {  // h_0 as given, in T
  const T* x;
  __device__ __forceinline__ float2 operator()(int b, int k) const {
    return make_float2(to_float(x[b * D + k]), to_float(x[b * D + k + 1]));
  }
};

template <int D>
struct State {  // h_t from the workspace
  const float* h;
  __device__ __forceinline__ float2 operator()(int b, int k) const {
    return __ldcg(reinterpret_cast<const float2*>(h + b * D + k));
  }
};

template <int D>
struct NextState {  // h_{t+1} = tanh(z + v), made where it is needed
  const float* z;
  const float* v;
  __device__ __forceinline__ float2 operator()(int b, int k) const {
    const float2 zz = __ldcg(reinterpret_cast<const float2*>(z + b * D + k));
    const float2 vv = __ldcg(reinterpret_cast<const float2*>(v + b * D + k));
    return make_float2(fast_tanh(zz.x + vv.x), fast_tanh(zz.y + vv.y));
  }
};

// Phase A, tape item of batch row b.
template <class Cfg, bool kShared>
__device__ void tape_read(const E23ForwardParams& p, int b, int t, float* smem) {
  using Tr = E23Traits<Cfg>;
  using T = typename Tr::T;
  constexpr int D = Tr::D, N = Tr::N;
  float* x = smem;                          // h_t
  float* w = smem + D;                      // w_{t-1}
  float* write_weights = smem + 2 * D;      // b_{t-1}
  float* scores = write_weights + Tr::slots_padded;
  const bool first = t == 0;
  for (int k = 4 * threadIdx.x; k < D; k += 4 * Cfg::threads) {
    const float4 h = first ? load_input4(static_cast<const T*>(p.h0) + b * D + k) : load_state4(p.h + b * D + k);
    *reinterpret_cast<float4*>(x + k) = h;
    if (first && p.save_h != nullptr) store_state4(p.save_h + b * D + k, h);
    if (!first) *reinterpret_cast<float4*>(w + k) = load_state4(p.w + b * D + k);
  }
  for (int i = threadIdx.x; i < N; i += Cfg::threads) write_weights[i] = first ? 0.0f : __ldcg(p.b + b * N + i);
  __syncthreads();
  float* tape = tape_of<Cfg, kShared>(p, b, smem);
  float* checkpoint = p.save_m != nullptr && t % p.checkpoint_every == 0
                          ? p.save_m + ((long long)(t / p.checkpoint_every) * p.batch + b) * N * D
                          : nullptr;
  const T* from = first ? static_cast<const T*>(p.m0) + (long long)b * N * D : nullptr;
  if (checkpoint != nullptr)
    score_slots<Cfg, kShared, true>(tape, from, x, first ? nullptr : write_weights, w, scores, checkpoint);
  else
    score_slots<Cfg, kShared>(tape, from, x, first ? nullptr : write_weights, w, scores);
  __syncthreads();
  if (threadIdx.x < 32) {
    const int support = normalize_slots<Cfg>(scores);
    if (threadIdx.x == 0 && p.read_support != nullptr) atomicAdd(p.read_support + t, float(support));
  }
  __syncthreads();
  read_value<Cfg, kShared>(tape, scores, p.v + b * D);
  __syncthreads();  // shared memory is reused by the next item
}

// Phase B, tape item of batch row b.
template <class Cfg, bool kShared>
__device__ void tape_write_weights(const E23ForwardParams& p, int b, int t, float* smem) {
  using Tr = E23Traits<Cfg>;
  using T = typename Tr::T;
  constexpr int D = Tr::D, N = Tr::N;
  float* x = smem;  // h_{t+1}
  float* scores = smem + 2 * D + Tr::slots_padded;
  const NextState<D> next{p.z, p.v};
  T* y = static_cast<T*>(p.y) + ((long long)t * p.batch + b) * D;
  T* h_final = t == p.steps - 1 && p.h_final != nullptr ? static_cast<T*>(p.h_final) + b * D : nullptr;
  for (int k = 4 * threadIdx.x; k < D; k += 4 * Cfg::threads) {
    const float2 lo = next(b, k), hi = next(b, k + 2);
    const float4 h = make_float4(lo.x, lo.y, hi.x, hi.y);
    *reinterpret_cast<float4*>(x + k) = h;
    store_state4(p.h + b * D + k, h);
    if (p.save_h != nullptr) store_state4(p.save_h + ((long long)(t + 1) * p.batch + b) * D + k, h);
    store_output4(y + k, h);
    if (h_final != nullptr) store_output4(h_final + k, h);
  }
  __syncthreads();
  score_slots<Cfg, kShared>(tape_of<Cfg, kShared>(p, b, smem), nullptr, x, nullptr, nullptr, scores);
  __syncthreads();
  if (threadIdx.x < 32) {
    const int support = normalize_slots<Cfg>(scores);
    for (int i = threadIdx.x; i < N; i += 32) __stcg(p.b + b * N + i, scores[i]);
    if (threadIdx.x == 0 && p.write_support != nullptr) atomicAdd(p.write_support + t, float(support));
  }
  __syncthreads();
}

// After the last step: apply the last write and store the tape.
template <class Cfg, bool kShared>
__device__ void tape_final(const E23ForwardParams& p, int b, float* smem) {
  using Tr = E23Traits<Cfg>;
  using T = typename Tr::T;
  constexpr int D = Tr::D, N = Tr::N;
  float* w = smem + D;
  float* write_weights = smem + 2 * D;
  for (int k = 4 * threadIdx.x; k < D; k += 4 * Cfg::threads)
    *reinterpret_cast<float4*>(w + k) = load_state4(p.w + b * D + k);
  for (int i = threadIdx.x; i < N; i += Cfg::threads) write_weights[i] = __ldcg(p.b + b * N + i);
  __syncthreads();
  const float* tape = tape_of<Cfg, kShared>(p, b, smem);
  T* out = static_cast<T*>(p.m_final) + (long long)b * N * D;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int i = warp; i < N; i += Tr::warps) {
    const float bi = write_weights[i];
    for (int k = 4 * lane; k < D; k += 128) {
      float4 m = load_tape4<kShared>(tape + i * D + k);
      if (bi > 0.0f) m = blend4(m, *reinterpret_cast<const float4*>(w + k), bi);
      store_output4(out + i * D + k, m);
    }
  }
  __syncthreads();
}

template <class Cfg>
__global__ void __launch_bounds__(Cfg::threads) e23_forward(const E23ForwardParams p) {
  using Tr = E23Traits<Cfg>;
  using T = typename Tr::T;
  constexpr int D = Tr::D;
  extern __shared__ float4 shared4[];
  float* smem = reinterpret_cast<float*>(shared4);
  float* red = smem;
  float* stage = smem + Tr::warps * kGemvTileOutputs;

  const int batch = p.batch;
  const int items = batch + Tr::row_tiles * ((batch + kGemvTileBatches - 1) / kGemvTileBatches);
  const T* w_h = static_cast<const T*>(p.w_h);
  const T* w_w = static_cast<const T*>(p.w_w);
  GridBarrier barrier{p.barrier};
  for (int t = 0; t < p.steps; ++t) {
    const T* u_t = static_cast<const T*>(p.u) + (long long)t * batch * D;
    auto load_u = [&](int b, int r) { return to_float(u_t[b * D + r]); };  // loaded before the products
    auto store_z = [&](int b, int r, float sum) { __stcg(p.z + b * D + r, sum); };
    for (int item = blockIdx.x; item < items; item += gridDim.x) {
      if (item < batch) {
        if (p.tape_in_shared) tape_read<Cfg, true>(p, item, t, smem);
        else tape_read<Cfg, false>(p, item, t, smem);
      } else {
        const int tile = item - batch;
        const int row0 = (tile % Tr::row_tiles) * kGemvTileRows, batch0 = (tile / Tr::row_tiles) * kGemvTileBatches;
        if (t == 0)
          gemv_tile<Cfg>(w_h, InitialState<T, D>{static_cast<const T*>(p.h0)}, row0, batch0, batch, red, stage, store_z,
                         load_u);
        else gemv_tile<Cfg>(w_h, State<D>{p.h}, row0, batch0, batch, red, stage, store_z, load_u);
      }
    }
    barrier.sync();
    float* save_w = p.save_w != nullptr ? p.save_w + (long long)t * batch * D : nullptr;
    auto store_w = [&](int b, int r, float sum) {
      __stcg(p.w + b * D + r, sum);
      if (save_w != nullptr) __stcg(save_w + b * D + r, sum);
    };
    for (int item = blockIdx.x; item < items; item += gridDim.x) {
      if (item < batch) {
        if (p.tape_in_shared) tape_write_weights<Cfg, true>(p, item, t, smem);
        else tape_write_weights<Cfg, false>(p, item, t, smem);
      } else {
        const int tile = item - batch;
        const int row0 = (tile % Tr::row_tiles) * kGemvTileRows, batch0 = (tile / Tr::row_tiles) * kGemvTileBatches;
        gemv_tile<Cfg>(w_w, NextState<D>{p.z, p.v}, row0, batch0, batch, red, stage, store_w);
      }
    }
    barrier.sync();
  }
  if (p.m_final != nullptr)
    for (int item = blockIdx.x; item < batch; item += gridDim.x) {
      if (p.tape_in_shared) tape_final<Cfg, true>(p, item, smem);
      else tape_final<Cfg, false>(p, item, smem);
    }
  // Every support count was added before the last barrier: turn the sums into means.
  if (blockIdx.x == 0)
    for (int t = threadIdx.x; t < p.steps; t += Cfg::threads) {
      if (p.read_support != nullptr) p.read_support[t] /= float(batch);
      if (p.write_support != nullptr) p.write_support[t] /= float(batch);
    }
}

}  // namespace sjit_kernels

// E23 forward over a sequence (docs/e23.md): one persistent launch computes every step for every
// batch row.
//
// A step per batch row b, with s the score scale and f the normalizer:
//   read   a = f(s M h),  v = sum_i a_i M_i          update  h' = tanh(W_h h + u_t + v)
//   write  w = W_w h',  b = f(s M h'),  M'_i = (1 - b_i) M_i + b_i w
//
// Two facts shape the schedule. (1) Both products of a step take the same operand: W_h h_{t+1} (for the
// next step) and W_w h_{t+1} (this step's write) are made together. (2) The read of step t+1 scores the
// written tape M' against the same h' the write scored M with, so its scores need no pass over the tape:
//   r'_i = s <M'_i, h'> = (1 - b_i) q_i + b_i s <w, h'>,   q_i = s <M_i, h'> (the write's own scores).
// A step is then one pass of product tiles and one pass of tape items, in turn:
//
//   tiles, phase t    (matrix, 16 rows, 32 batch rows): z_t = W_h h_t + u_t  and  w_{t-1} = W_w h_t
//   tape,  phase t    (one batch row): r = (1 - b) q + b s <w_{t-1}, h_t>, a = f(r); one pass over the slots
//                     applies the pending write (M_t = (1 - b) M_{t-1} + b w_{t-1}) and sums v = sum a_i M_i;
//                     h_{t+1} = tanh(z_t + v) -> y_t; **signal**; then q = s M_t h_{t+1}, b = f(q) for the
//                     next phase, while the tiles already work on h_{t+1}.
//
// Only the first half of a tape item (from z_t to h_{t+1}) and the tiles lie on the step's critical path;
// the write's score pass and normalizer run in the shadow of the next products. There is no grid
// barrier: each side waits only for what it reads. The tiles hand z and w to the tape items as tagged
// words (value and phase in one 64-bit word, e23_grid_sync.cuh): the tape item polls the words of its
// row, with no counter or fence in between. The tape items signal h_{t+1} on a counter per batch group
// (the 32 rows a tile covers), which the group's tiles wait on (h is read by 64 tiles at once: tagged
// words would double its bytes). The scheme is deadlock-free whenever every CTA is resident (the front
// end sizes the grid so): a CTA does its tiles of phase t, then its tape items of phase t, and each
// waits only on the other kind of the same or the previous phase. The tiles of phase t + 1 overwrite z
// and w only after every tape item of the group has signalled phase t, i.e. has read them.
//
// CTA c takes items c, c + grid, ... (tape items first), the same ones every phase, so a batch row's tape
// is only ever touched by one CTA: with a CTA per row and room for it, the tape stays in that CTA's
// shared memory for the whole launch (p.tape_in_shared). With as many CTAs as items and D <= 512, each
// tile CTA keeps its 16 rows of W in registers for the whole launch (HeldWeights).
// State between phases lives in fp32 in the workspace (L2-resident at moderate sizes); only inputs and
// outputs are T. With save_h / save_w / save_m set, the launch also keeps what the backward needs
// (e23_backward.cuh): every h_t and w_t in fp32, and the tape every checkpoint_every steps.
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

// The opt-in profile (E23ForwardParams::profile): thread 0 stores clock64 and the global nanosecond timer
// at point `mark` of step t. Stores only (no round trip); nothing at all when not profiling.
// The backward's marks (E23BackwardParams::profile) use the same store with their own layout.
__device__ __forceinline__ void profile_store(unsigned long long* profile, int slots, int marks, int slot, int mark) {
  if (profile == nullptr || threadIdx.x != 0 || slot < 0 || slot >= slots) return;
  unsigned long long ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  const unsigned long long cycles = clock64();
  unsigned long long* at = profile + ((((long long)blockIdx.x * slots + slot) * marks + mark) * 2);
  asm volatile("st.global.v2.u64 [%0], {%1, %2};" ::"l"(at), "l"(cycles), "l"(ns) : "memory");
}
__device__ __forceinline__ void profile_mark(const E23ForwardParams& p, int t, int mark) {
  profile_store(p.profile, p.steps, kE23Marks, t, mark);
}

// E23ForwardParams::tile_lag_ns: thread 0 waits `ns` nanoseconds by the global timer, then the CTA.
__device__ __forceinline__ void lag_for_tests(unsigned ns) {
  if (threadIdx.x == 0) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
      __nanosleep(100);
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
  }
  __syncthreads();
}

// Operands of the products (e23_gemv.cuh): x_b[k], x_b[k + 1] in fp32 for the FMA path; data() and
// four(p) = p[0 .. 3] in fp32 for the tensor-core path.
template <class T, int D>
struct InitialState {  // h_0 as given, in T
  using Element = T;
  const T* x;
  __device__ __forceinline__ float2 operator()(int b, int k) const {
    return make_float2(to_float(x[b * D + k]), to_float(x[b * D + k + 1]));
  }
  __device__ __forceinline__ const T* data() const { return x; }
  __device__ __forceinline__ float4 four(const T* at) const {
    float v[4];
    load_packet<T, 4>(at, v);
    return make_float4(v[0], v[1], v[2], v[3]);
  }
};

template <int D>
struct State {  // h_t from the workspace
  using Element = float;
  const float* h;
  __device__ __forceinline__ float2 operator()(int b, int k) const {
    return __ldcg(reinterpret_cast<const float2*>(h + b * D + k));
  }
  __device__ __forceinline__ const float* data() const { return h; }
  __device__ __forceinline__ float4 four(const float* at) const { return __ldcg(reinterpret_cast<const float4*>(at)); }
};

// The counter of batch group g (E23ForwardParams::barrier, a 128-byte line): tape items done; it only
// grows during a launch.
__device__ __forceinline__ unsigned* hs_counter(const E23ForwardParams& p, int g) { return p.barrier + 32 * (1 + g); }

// Prologue of a tape item: the tape from m0 (in fp32, where it will stay), h_0, and the scores q = s M_0 h_0
// that phase 0 reads with no pending write (b = 0).
template <class Cfg, bool kShared>
__device__ void tape_prologue(const E23ForwardParams& p, int b, float* smem) {
  using Tr = E23Traits<Cfg>;
  using T = typename Tr::T;
  constexpr int D = Tr::D, N = Tr::N;
  float* x = smem;
  float* scores = smem + 2 * D;
  for (int k = 4 * threadIdx.x; k < D; k += 4 * Cfg::threads) {
    const float4 h = load_input4(static_cast<const T*>(p.h0) + b * D + k);
    *reinterpret_cast<float4*>(x + k) = h;
    store_state4(p.h + b * D + k, h);
    if (p.save_h != nullptr) store_state4(p.save_h + b * D + k, h);
  }
  __syncthreads();
  score_slots<Cfg, kShared>(tape_of<Cfg, kShared>(p, b, smem), static_cast<const T*>(p.m0) + (long long)b * N * D, x,
                            nullptr, nullptr, scores);
  __syncthreads();
  for (int i = threadIdx.x; i < N; i += Cfg::threads) {
    __stcg(p.q + b * N + i, scores[i]);
    __stcg(p.b + b * N + i, 0.0f);
  }
  __syncthreads();
}

// Tape item of batch row b, phase t (see the top of the file).
template <class Cfg, bool kShared>
__device__ void tape_step(const E23ForwardParams& p, int b, int t, float* smem) {
  using Tr = E23Traits<Cfg>;
  using T = typename Tr::T;
  constexpr int D = Tr::D, N = Tr::N;
  constexpr int per_thread = (D + 4 * Cfg::threads - 1) / (4 * Cfg::threads);  // float4 columns a thread
  float* x = smem;                        // h_t, then h_{t+1}
  float* w = smem + D;                    // w_{t-1}
  float* scores = smem + 2 * D;           // q, then r, then a; then the next q
  float* weights = scores + Tr::slots_padded;  // b of step t-1, then of step t
  const int g = b / kGemvTileBatches;
  profile_mark(p, t, kMarkTapeStart);
  // The row's own state first (written by this CTA): its latency overlaps the wait.
  for (int k = 4 * threadIdx.x; k < D; k += 4 * Cfg::threads)
    *reinterpret_cast<float4*>(x + k) = load_state4(p.h + b * D + k);
  for (int i = threadIdx.x; i < N; i += Cfg::threads) {
    scores[i] = __ldcg(p.q + b * N + i);
    weights[i] = __ldcg(p.b + b * N + i);
  }
  // z_t and w_{t-1} arrive as tagged words (tag t + 1): polling them is the wait.
  // z_t waits in registers through the normalizer (its latency then overlaps w's); the f32 build has no
  // registers to spare for it (it would spill) and polls it where it is used. Then a thread's words show
  // only that the tiles of its own columns are done with h_t, while every z tile reads all of h_t, so
  // that build stores h_{t+1} over it only after a barrier (below).
  constexpr bool early_z = Cfg::tensor_cores;
  const unsigned tag = unsigned(t) + 1;
  float4 z[per_thread];
#pragma unroll
  for (int j = 0; j < per_thread; ++j) {
    const int k = 4 * (threadIdx.x + j * Cfg::threads);
    if (k < D) {
      if constexpr (early_z) z[j] = poll_tagged4(p.z + b * D + k, tag);
      if (t > 0) *reinterpret_cast<float4*>(w + k) = poll_tagged4(p.w + b * D + k, tag);
    }
  }
  __syncthreads();
  profile_mark(p, t, kMarkTapeGo);
  // The read weights, by one warp: r_i = (1 - b_i) q_i + b_i s <w, h_t>.
  if (threadIdx.x < 32) {
    float wh = 0.0f;
    if (t > 0) {
      for (int k = 4 * threadIdx.x; k < D; k += 128)
        wh += dot4(*reinterpret_cast<const float4*>(w + k), *reinterpret_cast<const float4*>(x + k));
      wh = Cfg::scale * warp_sum(wh);
    }
    for (int i = threadIdx.x; i < N; i += 32) {
      const float bi = weights[i];
      if (bi > 0.0f) scores[i] = (1.0f - bi) * scores[i] + bi * wh;
    }
    __syncwarp();
    const int support = normalize_slots<Cfg>(scores);
    if (threadIdx.x == 0 && p.read_support != nullptr) atomicAdd(p.read_support + t, float(support));
  }
  __syncthreads();
  profile_mark(p, t, kMarkTapeNormed);
  // One pass over the slots: the pending write, the read value, h_{t+1}.
  float* tape = tape_of<Cfg, kShared>(p, b, smem);
  T* y = static_cast<T*>(p.y) + ((long long)t * p.batch + b) * D;
  T* h_final = t == p.steps - 1 && p.h_final != nullptr ? static_cast<T*>(p.h_final) + b * D : nullptr;
#pragma unroll
  for (int j = 0; j < per_thread; ++j) {
    const int k = 4 * (threadIdx.x + j * Cfg::threads);
    if (k >= D) break;
    if constexpr (!early_z) z[j] = poll_tagged4(p.z + b * D + k, tag);
    const float4 v = write_and_read<Cfg, kShared>(tape, scores, weights, w, k);
    const float4 h = make_float4(fast_tanh(z[j].x + v.x), fast_tanh(z[j].y + v.y), fast_tanh(z[j].z + v.z),
                                 fast_tanh(z[j].w + v.w));
    *reinterpret_cast<float4*>(x + k) = h;
    if constexpr (early_z) store_state4(p.h + b * D + k, h);  // every z word was polled before the barrier
    if (p.save_h != nullptr) store_state4(p.save_h + ((long long)(t + 1) * p.batch + b) * D + k, h);
    store_output4(y + k, h);
    if (h_final != nullptr) store_output4(h_final + k, h);
  }
  if constexpr (!early_z) {
    // Every thread has polled its z words, so every z tile of the group is done with h_t. (Storing
    // each column of h_{t+1} right after its own words let a slower z tile read it in place of h_t:
    // found by compute-sanitizer's racecheck, whose slow shared memory makes the tiles lag, and seen
    // once in 36 f32 runs without it on a busy GPU.) Each thread stores the columns it computed.
    __syncthreads();
    for (int k = 4 * threadIdx.x; k < D; k += 4 * Cfg::threads)
      store_state4(p.h + b * D + k, *reinterpret_cast<const float4*>(x + k));
  }
  signal_counter(hs_counter(p, g));  // h_{t+1} is out: the group's tiles may start step t + 1
  profile_mark(p, t, kMarkTapeSignalled);
  // In the shadow of the next products: the write's scores q = s M_t h_{t+1} (and the checkpoint of M_t)
  // and its weights b = f(q), both kept for the next phase.
  float* checkpoint = p.save_m != nullptr && t % p.checkpoint_every == 0
                          ? p.save_m + ((long long)(t / p.checkpoint_every) * p.batch + b) * N * D
                          : nullptr;
  if (checkpoint != nullptr) score_slots<Cfg, kShared, true>(tape, nullptr, x, nullptr, nullptr, scores, checkpoint);
  else score_slots<Cfg, kShared>(tape, nullptr, x, nullptr, nullptr, scores);
  __syncthreads();
  if (threadIdx.x < 32) {
    for (int i = threadIdx.x; i < N; i += 32) {
      __stcg(p.q + b * N + i, scores[i]);
      weights[i] = scores[i];
    }
    __syncwarp();
    const int support = normalize_slots<Cfg>(weights);
    for (int i = threadIdx.x; i < N; i += 32) __stcg(p.b + b * N + i, weights[i]);
    if (threadIdx.x == 0 && p.write_support != nullptr) atomicAdd(p.write_support + t, float(support));
  }
  __syncthreads();  // shared memory is reused by the next item
  profile_mark(p, t, kMarkTapeDone);
}

// After the last step: apply the last write and store the tape.
template <class Cfg, bool kShared>
__device__ void tape_final(const E23ForwardParams& p, int b, float* smem) {
  using Tr = E23Traits<Cfg>;
  using T = typename Tr::T;
  constexpr int D = Tr::D, N = Tr::N;
  float* w = smem + D;
  float* write_weights = smem + 2 * D;
  for (int i = threadIdx.x; i < N; i += Cfg::threads) write_weights[i] = __ldcg(p.b + b * N + i);
  for (int k = 4 * threadIdx.x; k < D; k += 4 * Cfg::threads)  // w_{steps-1}, from the last tile phase
    *reinterpret_cast<float4*>(w + k) = poll_tagged4(p.w + b * D + k, unsigned(p.steps) + 1);
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

// Tile item `tile` of phase t (0 .. steps): 16 rows of W_h (z_t = W_h h_t + u_t, for t < steps) or of W_w
// (w_{t-1} = W_w h_t, for t > 0) for one batch group. Weights: W's pointer or the tile's HeldWeights.
template <class Cfg, class WeightsH, class WeightsW>
__device__ void tile_step(const E23ForwardParams& p, int tile, int t, const WeightsH& w_h, const WeightsW& w_w,
                          float* smem) {
  using Tr = E23Traits<Cfg>;
  using T = typename Tr::T;
  constexpr int D = Tr::D;
  const int batch = p.batch;
  const int row0 = (tile % Tr::row_tiles) * kGemvTileRows;
  const bool write_side = (tile / Tr::row_tiles) % 2 == 1;
  const int g = tile / (2 * Tr::row_tiles), batch0 = g * kGemvTileBatches;
  const int rows_in_group = min(kGemvTileBatches, batch - batch0);
  float* red = smem;
  float* stage = smem + Tr::warps * kGemvTileOutputs;
  profile_mark(p, t, kMarkTileStart);
  // The wait for h_t comes after the u_t addends are requested (gemv_tile's wait_for_operand), so their
  // latency hides under it.
  auto wait_h = [&] {
    if (t > 0) wait_counter(hs_counter(p, g), unsigned(rows_in_group) * unsigned(t));
    if (p.tile_lag_ns != 0 && t > 0 && !write_side) lag_for_tests(p.tile_lag_ns * unsigned(tile % Tr::row_tiles));
    profile_mark(p, t, kMarkTileGo);
  };
  auto mark_products = [&] { profile_mark(p, t, kMarkTileProducts); };
  if (!write_side && t < p.steps) {
    const T* u_t = static_cast<const T*>(p.u) + (long long)t * batch * D;
    auto load_u = [&](int b, int r) { return to_float(u_t[b * D + r]); };  // loaded before the products
    auto store_z = [&](int b, int r, float sum, int) { store_tagged(p.z + b * D + r, sum, unsigned(t) + 1); };
    if (t == 0)
      gemv_tile<Cfg>(w_h, InitialState<T, D>{static_cast<const T*>(p.h0)}, row0, batch0, batch, red, stage, store_z,
                     load_u, mark_products, wait_h);
    else gemv_tile<Cfg>(w_h, State<D>{p.h}, row0, batch0, batch, red, stage, store_z, load_u, mark_products, wait_h);
  } else if (write_side && t > 0) {
    float* save_w = p.save_w != nullptr ? p.save_w + (long long)(t - 1) * batch * D : nullptr;
    auto store_w = [&](int b, int r, float sum, int) {
      store_tagged(p.w + b * D + r, sum, unsigned(t) + 1);
      if (save_w != nullptr) __stcg(save_w + b * D + r, sum);
    };
    gemv_tile<Cfg>(w_w, State<D>{p.h}, row0, batch0, batch, red, stage, store_w, NoAddend{}, mark_products, wait_h);
  } else {
    wait_h();  // nothing to do this phase; still keeps the phases in order
  }
  profile_mark(p, t, kMarkTileDone);
}

template <class Cfg, class WeightsH, class WeightsW>
__device__ void forward_steps(const E23ForwardParams& p, const WeightsH& w_h, const WeightsW& w_w, float* smem) {
  using Tr = E23Traits<Cfg>;
  const int batch = p.batch, groups = (batch + kGemvTileBatches - 1) / kGemvTileBatches;
  const int items = batch + 2 * Tr::row_tiles * groups;
  for (int item = blockIdx.x; item < batch; item += gridDim.x) {
    if (p.tape_in_shared) tape_prologue<Cfg, true>(p, item, smem);
    else tape_prologue<Cfg, false>(p, item, smem);
  }
  for (int t = 0; t <= p.steps; ++t) {
    for (int item = blockIdx.x; item < items; item += gridDim.x)
      if (item >= batch) tile_step<Cfg>(p, item - batch, t, w_h, w_w, smem);
    if (t == p.steps) break;
    for (int item = blockIdx.x; item < batch; item += gridDim.x) {
      if (p.tape_in_shared) tape_step<Cfg, true>(p, item, t, smem);
      else tape_step<Cfg, false>(p, item, t, smem);
    }
  }
  if (p.m_final != nullptr)
    for (int item = blockIdx.x; item < batch; item += gridDim.x) {
      if (p.tape_in_shared) tape_final<Cfg, true>(p, item, smem);
      else tape_final<Cfg, false>(p, item, smem);
    }
}

template <class Cfg>
__global__ void __launch_bounds__(Cfg::threads, 2) e23_forward(const E23ForwardParams p) {
  using Tr = E23Traits<Cfg>;
  using T = typename Tr::T;
  extern __shared__ float4 shared4[];
  float* smem = reinterpret_cast<float*>(shared4);
  const T* w_h = static_cast<const T*>(p.w_h);
  const T* w_w = static_cast<const T*>(p.w_w);
  using Held = HeldWeights<T, Tr::D, Tr::warps>;
  const int groups = (p.batch + kGemvTileBatches - 1) / kGemvTileBatches;
  const int items = p.batch + 2 * Tr::row_tiles * groups;
  if constexpr (Cfg::tensor_cores && Held::possible) {
    // A CTA with exactly one tile item (and no tape item) keeps that tile's weights in registers.
    if (items <= int(gridDim.x) && int(blockIdx.x) >= p.batch && int(blockIdx.x) < items) {
      const int tile = blockIdx.x - p.batch;
      Held held;
      held.load((tile / Tr::row_tiles) % 2 == 1 ? w_w : w_h, (tile % Tr::row_tiles) * kGemvTileRows);
      for (int t = 0; t <= p.steps; ++t) tile_step<Cfg>(p, tile, t, held, held, smem);
    } else {
      forward_steps<Cfg>(p, w_h, w_w, smem);
    }
  } else {
    forward_steps<Cfg>(p, w_h, w_w, smem);
  }
  // Means of the support counts, once every CTA has added its own.
  if (p.read_support != nullptr || p.write_support != nullptr) {
    GridBarrier barrier{p.barrier};
    barrier.sync();
    if (blockIdx.x == 0)
      for (int t = threadIdx.x; t < p.steps; t += Cfg::threads) {
        if (p.read_support != nullptr) p.read_support[t] /= float(p.batch);
        if (p.write_support != nullptr) p.write_support[t] /= float(p.batch);
      }
  }
}

}  // namespace sjit_kernels

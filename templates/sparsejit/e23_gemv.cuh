// The two D x D products of an E23 step for a group of batch rows: out[b][r] = sum_k W[r][k] x_b[k],
// for the 16 rows r of one row tile and the up to 32 batch rows b of one batch group. For B rows this
// is the GEMM [B, D] x [D, D]^T cut into (row tile, batch group) tiles; each tile belongs to one CTA.
//
// Inside the CTA the K dimension (D) is split over the warps in 16-wide k-steps; the partial sums meet
// in shared memory. Every warp loads its whole share of W straight into registers, so a tile costs one
// round of L2 latency rather than one per k-chunk: a step is latency-bound, not bandwidth-bound.
//
// bf16/f16 (Cfg::tensor_cores): mma.sync m16n8k16 with A = 16 rows of W and B = x, 8 batch rows per
// n-tile. The fp32 operand x is split into hi + lo, both in T, and both are multiplied: the product
// then sees x to about 16 significant bits instead of 8, so the state is effectively fp32 and only W
// itself is rounded (as given). f32: plain FMAs, x staged through shared memory per k-step.
#pragma once

#include "sparsejit/element.cuh"
#include "sparsejit/mma.cuh"

namespace sjit_kernels {

inline constexpr int kGemvTileRows = 16;
inline constexpr int kGemvTileBatches = 32;
inline constexpr int kGemvTileOutputs = kGemvTileRows * kGemvTileBatches;

// Which k a lane holds. In the mma's k-step of 16, lane t (= lane % 4) supplies k positions 2t, 2t + 1
// (fragment registers 0 and 1 of A, b0 of B) and 8 + 2t, 9 + 2t (registers 2 and 3, b1). The sum over k
// does not care which position a k sits at as long as A and B agree, so positions 2t + j and 8 + 2t + j
// take the four consecutive columns k0 + 4t + j and k0 + 4t + 2 + j: a lane's operand is one 16-byte
// load of fp32 x (and its weights one 8-byte load a row). With D % 16 == 8 the last k-step holds only
// columns k0 .. k0 + 7: lanes t = 0, 1 have them, lanes 2 and 3 supply zeros.
template <int D>
__device__ __forceinline__ bool lane_columns_valid(int k0, int t) {
  return D % 16 == 0 || k0 + 4 * t < D;
}

// Loads for kGemvChunk k-steps are issued before any of their products: one L2 round trip per chunk
// instead of one per k-step (the mma asm statements would otherwise pin each step's loads in place).
inline constexpr int kGemvChunk = 4;

// The A fragments (16 rows of W) of one warp's chunk of k-steps first, first + WARPS, ...
template <class T, int D, int WARPS>
__device__ __forceinline__ void load_weight_chunk(const T* __restrict__ w, int row0, int first,
                                                  unsigned (&a)[kGemvChunk][4]) {
  constexpr int k_steps = (D + 15) / 16;
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int row_a = row0 + g, row_b = row0 + g + 8;
#pragma unroll
  for (int c = 0; c < kGemvChunk; ++c) {
    const int ks = first + c * WARPS, k0 = ks * 16;
    const bool valid = ks < k_steps && lane_columns_valid<D>(k0, t);
    const uint2 pa = valid && row_a < D ? __ldg(reinterpret_cast<const uint2*>(w + row_a * D + k0 + 4 * t)) : make_uint2(0u, 0u);
    const uint2 pb = valid && row_b < D ? __ldg(reinterpret_cast<const uint2*>(w + row_b * D + k0 + 4 * t)) : make_uint2(0u, 0u);
    a[c][0] = pa.x, a[c][2] = pa.y, a[c][1] = pb.x, a[c][3] = pb.y;
  }
}

// A tile's 16 rows of W held in registers for a whole launch (the persistent-RNN trick): when every
// warp's share of the k-steps is one chunk (D <= 16 * WARPS * kGemvChunk: 512 with 8 warps), a CTA that
// owns one tile for all steps loads its weights once instead of once a step (16 registers a thread).
template <class T, int D, int WARPS>
struct HeldWeights {
  static constexpr bool possible = (D + 15) / 16 <= WARPS * kGemvChunk;
  unsigned a[kGemvChunk][4];
  __device__ __forceinline__ void load(const T* __restrict__ w, int row0) {
    load_weight_chunk<T, D, WARPS>(w, row0, threadIdx.x / 32, a);
  }
};
template <class W> struct IsHeldWeights { static constexpr bool value = false; };
template <class T, int D, int WARPS> struct IsHeldWeights<HeldWeights<T, D, WARPS>> { static constexpr bool value = true; };

// Tensor cores. Each warp accumulates 16 rows x 32 batches for its k-steps into red[warp][row * 32 + batch].
// Operand x: x.data() points at x_0[0] (element type x.Element, row stride D), and x.four(p) returns
// p[0 .. 3] in fp32. Every operand load of a warp is then one base pointer plus a constant offset (no
// per-load address arithmetic after the wait for h_t). Weights: a pointer to W (loaded here, chunk by
// chunk) or HeldWeights (already in registers).
template <class T, int D, int WARPS, class Weights, class Operand>
__device__ __forceinline__ void gemv_tile_partial_mma(const Weights& w, const Operand& x, int row0, int batch0,
                                                     int batch, float* red) {
  constexpr int k_steps = (D + 15) / 16, kChunk = kGemvChunk;
  // Every k-step of every chunk exists (no per-chunk bound check), e.g. D = 512 with 8 warps.
  constexpr bool whole_chunks = k_steps % (WARPS * kChunk) == 0;
  constexpr bool held = IsHeldWeights<Weights>::value;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  float acc[4][4] = {};
  const int tiles_used = min(4, (batch - batch0 + 7) / 8);  // warp-uniform
  bool row_used[4];  // batch0 + nt * 8 + g exists
#pragma unroll
  for (int nt = 0; nt < 4; ++nt) row_used[nt] = nt < tiles_used && batch0 + nt * 8 + g < batch;
  const auto* x_lane = x.data() + (long long)(batch0 + g) * D + 4 * t;
  for (int first = warp; first < k_steps; first += WARPS * kChunk) {
    unsigned a[kChunk][4];
    if constexpr (held) {
#pragma unroll
      for (int c = 0; c < kChunk; ++c)
#pragma unroll
        for (int i = 0; i < 4; ++i) a[c][i] = w.a[c][i];
    } else {
      load_weight_chunk<T, D, WARPS>(w, row0, first, a);
    }
    const auto* x_first = x_lane + first * 16;
    float4 xv[kChunk][4];
#pragma unroll
    for (int c = 0; c < kChunk; ++c) {
      const int ks = first + c * WARPS;
      const bool valid = (whole_chunks || ks < k_steps) && lane_columns_valid<D>(ks * 16, t);
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
        xv[c][nt] = row_used[nt] && valid ? x.four(x_first + nt * 8 * D + c * WARPS * 16) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int c = 0; c < kChunk; ++c) {
      if (!whole_chunks && first + c * WARPS >= k_steps) break;  // warp-uniform
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        if (nt >= tiles_used) break;
        const float4 v = xv[c][nt];
        const unsigned b0 = pack2<T>(v.x, v.y), b1 = pack2<T>(v.z, v.w);
        const float2 r0 = unpack2<T>(b0), r1 = unpack2<T>(b1);
        const unsigned b0_rest = pack2<T>(v.x - r0.x, v.y - r0.y);
        const unsigned b1_rest = pack2<T>(v.z - r1.x, v.w - r1.y);
        mma_16x8x16<T>(acc[nt], a[c], b0, b1);
        mma_16x8x16<T>(acc[nt], a[c], b0_rest, b1_rest);
      }
    }
    if constexpr (held) break;  // one chunk covers every k-step (HeldWeights::possible)
  }
  // In fragment order (partial_slot): one float4 a lane and n-tile, so the stores and the reduction's
  // loads are free of bank conflicts.
  float4* mine = reinterpret_cast<float4*>(red + warp * kGemvTileOutputs);
#pragma unroll
  for (int nt = 0; nt < 4; ++nt) mine[nt * 32 + lane] = make_float4(acc[nt][0], acc[nt][1], acc[nt][2], acc[nt][3]);
}

// The output (row rl, batch bl) of a tile that slot o of each warp's partial sums holds. Tensor cores:
// the accumulator fragments of m16n8k16 (n-tile o / 128, lane (o / 4) % 32, register o % 4: rows g and
// g + 8, batches 2 t and 2 t + 1 of the n-tile); FMAs: row-major [16][32]. The reduction reads slot o
// with thread o, so consecutive threads read consecutive floats (no bank conflicts: with the row-major
// order read row-first, the 16 rows of a batch sat in one bank, and the reduction cost ~1 us a tile).
template <bool kTensorCores>
__device__ __forceinline__ int2 partial_slot(int o) {
  if constexpr (kTensorCores) {
    const unsigned u = unsigned(o), lane = (u >> 2) & 31u, i = u & 3u;  // n-tile u >> 7
    return make_int2(int((lane >> 2) + 8 * (i >> 1)), int(((u >> 7) << 3) + 2 * (lane & 3u) + (i & 1u)));
  } else {
    return make_int2(o / kGemvTileBatches, o % kGemvTileBatches);
  }
}

// FMAs. Lane l owns row l % 16 and the batch half l / 16 (16 accumulators). Per k-step the warp stages
// x for 16 k and 32 batches in `stage` (512 floats of its own), each value computed once.
template <class T, int D, int WARPS, class Operand>
__device__ __forceinline__ void gemv_tile_partial_fma(const T* __restrict__ w, const Operand& x, int row0, int batch0,
                                                     int batch, float* red, float* stage) {
  constexpr int k_steps = (D + 15) / 16;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = row0 + lane % 16, half = lane / 16;
  float* my_stage = stage + warp * kGemvTileOutputs;  // [k 16][batch 32]
  float acc[16] = {};
  for (int ks = warp; ks < k_steps; ks += WARPS) {
    const int k0 = ks * 16;
    // Lane l stages k pair l % 8 of batches l / 8 + 4 j: each load covers 64 contiguous bytes of 4 rows.
    const int kp = 2 * (lane % 8);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int bl = lane / 8 + 4 * j, b = batch0 + bl;
      const float2 v = b < batch && k0 + kp < D ? x(b, k0 + kp) : make_float2(0.f, 0.f);
      my_stage[kp * kGemvTileBatches + bl] = v.x;
      my_stage[(kp + 1) * kGemvTileBatches + bl] = v.y;
    }
    __syncwarp();
    constexpr int wvec = 16 / int(sizeof(T));  // one 16-byte packet of W at a time
    float wk[16];
#pragma unroll
    for (int kk = 0; kk < 16; kk += wvec) {
      float packet[wvec];
      if (row < D && k0 + kk < D) load_packet<T, wvec>(w + row * D + k0 + kk, packet);
      else
#pragma unroll
        for (int e = 0; e < wvec; ++e) packet[e] = 0.f;
#pragma unroll
      for (int e = 0; e < wvec; ++e) wk[kk + e] = packet[e];
    }
#pragma unroll
    for (int kk = 0; kk < 16; ++kk)
#pragma unroll
      for (int j = 0; j < 16; ++j) acc[j] += wk[kk] * my_stage[kk * kGemvTileBatches + half * 16 + j];
    __syncwarp();
  }
  float* mine = red + warp * kGemvTileOutputs;
#pragma unroll
  for (int j = 0; j < 16; ++j) mine[(lane % 16) * kGemvTileBatches + half * 16 + j] = acc[j];
}

// No addend: the epilogue gets the bare product.
struct NoAddend {
  __device__ __forceinline__ float operator()(int, int) const { return 0.f; }
};
template <class A> struct IsNoAddend { static constexpr bool value = false; };
template <> struct IsNoAddend<NoAddend> { static constexpr bool value = true; };

// Hooks of gemv_tile, called by every thread: once the warps' partial sums are in shared memory (the
// forward's profile marks the point), and before the operand is read (the forward waits there for h_t,
// after the addends are requested); by default nothing.
struct NoHook {
  __device__ __forceinline__ void operator()() const {}
};

// Output j (0 .. kGemvTileOutputs / threads - 1) of this thread in gemv_tile: {row, batch} within the tile
// (slot threadIdx.x + j * threads of the partial sums, partial_slot). A caller can load values of its
// outputs ahead (e.g. before a wait) and find them again by j in the epilogue.
template <class Cfg>
__device__ __forceinline__ int2 gemv_output(int j) {
  return partial_slot<Cfg::tensor_cores>(threadIdx.x + j * Cfg::threads);
}

// The whole tile: partial products per warp, then their sum handed to epilogue(b, r, value, j) for every
// row r < D and batch b < batch of the tile, value = the product + addend(b, r), j as in gemv_output. On the tensor-core path
// the addends are loaded before the products start, even before wait_for_operand(), so their memory
// latency hides under the wait instead of following the reduction (the FMA path has no registers to spare
// for them: it would spill). Shared memory: WARPS * 512 floats at red (and as many at stage for the FMA path). Starts and
// ends with the CTA in step (it holds __syncthreads).
template <class Cfg, class Weights, class Operand, class Epilogue, class Addend = NoAddend, class Hook = NoHook,
          class Wait = NoHook>
__device__ __forceinline__ void gemv_tile(const Weights& w, const Operand& x, int row0, int batch0,
                                          int batch, float* red, float* stage, Epilogue epilogue,
                                          Addend addend = {}, Hook after_products = {}, Wait wait_for_operand = {}) {
  constexpr int warps = Cfg::threads / 32;
  static_assert(kGemvTileOutputs % Cfg::threads == 0, "whole outputs a thread");
  constexpr int per_thread = kGemvTileOutputs / Cfg::threads;
  constexpr bool has_addend = !IsNoAddend<Addend>::value, early = has_addend && Cfg::tensor_cores;
  // Output j of this thread: slot o = threadIdx.x + j * threads of the partial sums (partial_slot).
  auto coords = [&](int j) { return gemv_output<Cfg>(j); };
  auto in_tile = [&](int2 c) { return row0 + c.x < Cfg::dim && batch0 + c.y < batch; };
  auto addend_of = [&](int2 c) { return in_tile(c) ? addend(batch0 + c.y, row0 + c.x) : 0.f; };
  float add[per_thread];
  if constexpr (early)
#pragma unroll
    for (int j = 0; j < per_thread; ++j) add[j] = addend_of(coords(j));
  wait_for_operand();
  if constexpr (Cfg::tensor_cores) gemv_tile_partial_mma<typename Cfg::T, Cfg::dim, warps>(w, x, row0, batch0, batch, red);
  else gemv_tile_partial_fma<typename Cfg::T, Cfg::dim, warps>(static_cast<const typename Cfg::T*>(w), x, row0, batch0,
                                                               batch, red, stage);
  __syncthreads();
  after_products();
#pragma unroll
  for (int j = 0; j < per_thread; ++j) {
    const int2 c = coords(j);
    if (in_tile(c)) {
      float sum = 0.f;
#pragma unroll
      for (int wi = 0; wi < warps; ++wi) sum += red[wi * kGemvTileOutputs + threadIdx.x + j * Cfg::threads];
      if constexpr (early) sum += add[j];
      else if constexpr (has_addend) sum += addend_of(c);
      epilogue(batch0 + c.y, row0 + c.x, sum, j);
    }
  }
  __syncthreads();
}

}  // namespace sjit_kernels

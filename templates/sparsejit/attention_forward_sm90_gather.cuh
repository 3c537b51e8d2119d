// Attention forward on Hopper (sm_90a) for pattern blocks of 16 and 32 (path=wgmma_gather): one
// warpgroup computes one query block, with the keys of its active blocks gathered into 64-key tiles.
//
// Why transposed. A wgmma product has 64 rows, and the rows of a product share its columns. With the
// queries as rows (S = Q K^T) a 64-row tile spans 2 or 4 pattern rows, and every key block any of
// them sees is computed for all of them: with random blocks at density 0.1 about half (blocks of 32)
// or two thirds (16) of the work is masked. Here the keys are the rows: S^T = K Q^T, 64 keys (the next
// 2 or 4 active key blocks of the item, wherever they lie, by one bulk copy each) against the block's
// 16 or 32 queries as the columns, so every key of a tile is one the queries see. Then
// O^T += V^T P^T: the head dims as rows (64 a product), the keys as the reduction, P^T from shared
// memory. The softmax runs down the columns: a query's maximum over a tile is reduced across the
// warpgroup's four warps through shared memory; the running sums stay per thread until the end. The
// price: each query block reads its own key blocks (the 64-row tiles read a block once for all their
// rows), so the kernel is bound by the L2's bandwidth (docs/attention.md, "Blocks of 16: the
// gathered-key kernel").
//
// Query heads of a K/V group that share the pattern (GQA) may share the reads too: with Cfg::m_tiles
// = H > 1 a CTA takes the same query block of H consecutive query heads, side by side as the columns
// (N = H x block, at most 64), and reads each key block once for all of them.
//
// One warpgroup a CTA, one item (pattern head, query block; H query heads) a CTA; thread 0 issues
// every copy. K and V have two ring slots each with a barrier apiece: K of step j + 2 loads once every
// warp's S^T of step j is done, V of step j + 1 once O^T of step j - 1 is (in step j). Within a step,
// the softmax of step j runs under O^T += V^T P^T of step j - 1 (FlashAttention-3's pipelining, as in
// attention_forward_sm90.cuh). Rows: the product's accumulator layout (wgmma.cuh) gives warp w the
// keys 16w .. 16w + 15 of a tile, all in one key block, and each thread its columns 8c + 2t,
// 8c + 2t + 1 of every 8-column chunk c.
#pragma once

#include "sparsejit/attention_forward.cuh"
#include "sparsejit/tma.cuh"
#include "sparsejit/wgmma.cuh"

namespace sjit_kernels {

template <class Cfg>
struct GatherLayout {
  using Tr = AttentionForwardTraits<Cfg>;
  static constexpr int block = Tr::block_n;  // one pattern block of keys, and of each head's queries
  static constexpr int heads = Cfg::m_tiles;   // query heads of the CTA, their blocks side by side
  static constexpr int queries = heads * block;  // the products' columns
  static_assert(Tr::block_m == block && (block == 16 || block == 32),
                "path=wgmma_gather: one pattern block of 16 or 32 a side");
  static_assert(Cfg::warps == 4, "path=wgmma_gather: one warpgroup");
  static_assert(queries <= 64, "path=wgmma_gather: at most 64 columns (registers: O^T is d x columns a warpgroup)");
  static constexpr int step_keys = 64;  // the rows of a wgmma product
  static constexpr int blocks_per_step = step_keys / block;
  static constexpr int tile_dim = swizzled_tile_cols(Tr::head_dim);
  static constexpr int dim_blocks = tile_dim / 64;  // O^T's 64-row products
  static constexpr int q_bytes = queries * tile_dim * 2;  // Q of every head, a block of rows each
  static constexpr int kv_bytes = step_keys * tile_dim * 2;
  static constexpr int p_bytes = queries * 128;  // P^T of a step: a row of 64 keys a query (K-major B)
  // Offsets from the aligned base: Q (later the output's staging tile), two K slots, two V slots, two
  // P^T tiles, the column exchange (floats [2][4 warps][queries]), then the copy barriers: Q's, K's
  // two, V's two.
  static constexpr int k_ring = q_bytes;
  static constexpr int v_ring = k_ring + 2 * kv_bytes;
  static constexpr int p_tiles = v_ring + 2 * kv_bytes;
  static constexpr int exchange = p_tiles + 2 * p_bytes;
  static constexpr int barriers = exchange + 2 * 4 * queries * 4;
  static constexpr int q_full = 0, k_full = 1, v_full = 3;
  static constexpr int used_bytes = barriers + 8 * 5;
  // CTAs an SM as shared memory allows, at most 4: one CTA's softmax and copies then run under
  // another's products.
  static constexpr int ctas_per_sm = ctas_per_sm_by_shared(used_bytes, 4);
};

// A column's value over the warp's 16 keys, from each thread's value over its two: lanes 4, 8 and 16
// apart hold the same columns of the other keys.
template <class Op>
__device__ __forceinline__ float over_warp_keys(float v, Op op) {
  v = op(v, __shfl_xor_sync(0xffffffffu, v, 4));
  v = op(v, __shfl_xor_sync(0xffffffffu, v, 8));
  return op(v, __shfl_xor_sync(0xffffffffu, v, 16));
}

template <class Cfg>
__global__ void __launch_bounds__(128, GatherLayout<Cfg>::ctas_per_sm)
    attention_forward_sm90_gather(const AttentionForwardParams p,
                                  const __grid_constant__ AttentionForwardTensorMaps maps) {
  using Tr = AttentionForwardTraits<Cfg>;
  using L = GatherLayout<Cfg>;
  using T = typename Tr::T;
  constexpr int N = L::queries;  // the products' columns: L::heads query blocks of L::block
  constexpr int chunks = N / 8;  // 8-column accumulator chunks
  extern __shared__ __align__(1024) unsigned char shared_gather[];
  unsigned char* smem = swizzle_aligned_shared(shared_gather, L::used_bytes);
  const unsigned base = smem_address(smem);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  // With several heads a CTA (the host checked that the pattern is shared and that they divide a K/V
  // group), CTA i takes rank i % ranks of the group of heads i / ranks, from its first head on.
  const int ranks = ranks_per_group<Cfg>(p);
  const WorkItem w = work_item<Cfg>(p, blockIdx.x % ranks, blockIdx.x / ranks * L::heads);
  const int q_row0 = w.q_tile * L::block;
  if (q_row0 >= p.seq_q) return;  // a schedule item past the end of a short sequence: nothing to do
  const int kv_head = w.head_q / (p.heads_q / p.heads_kv);
  const int count = w.tiles.count;  // the item's active key blocks
  const int steps = (count + L::blocks_per_step - 1) / L::blocks_per_step;
  auto barrier = [&](int i) { return base + L::barriers + 8 * i; };

  // Step s gathers the item's key blocks s * blocks_per_step .. + blocks_per_step - 1 into one tile. Past
  // the last block the tile repeats it: finite values (never uninitialized memory, which V^T P^T would
  // multiply by the zero probabilities of their masked scores).
  auto gathered_key0 = [&](int step, int i) {
    return w.tiles.tile(min(step * L::blocks_per_step + i, count - 1)) * L::block;
  };
  auto load_step = [&](const TensorMap& map, int ring, int full, int step) {
    const int slot = step % 2;
    const unsigned tile = base + ring + slot * L::kv_bytes;
    mbarrier_expect_bytes(barrier(full + slot), L::kv_bytes);
#pragma unroll
    for (int i = 0; i < L::blocks_per_step; ++i)
      tma_load_rows<Tr::head_dim, L::block, L::step_keys>(tile, i * L::block, map, barrier(full + slot), w.batch,
                                                          kv_head, gathered_key0(step, i));
  };
  if (threadIdx.x == 0) {
    init_copy_barriers(barrier(0), 5);
    if (count > 0) {
      mbarrier_expect_bytes(barrier(L::q_full), L::q_bytes);
#pragma unroll
      for (int h = 0; h < L::heads; ++h)
        tma_load_rows<Tr::head_dim, L::block, N>(base, h * L::block, maps.q, barrier(L::q_full), w.batch, w.head_q + h,
                                                 q_row0);
      for (int step = 0; step < 2 && step < steps; ++step) {
        load_step(maps.k, L::k_ring, L::k_full, step);
        load_step(maps.v, L::v_ring, L::v_full, step);
      }
    }
  }
  __syncthreads();  // the barriers are initialized before anyone waits on them

  float o[L::dim_blocks][chunks][4];  // O^T: dims 64b + 16 warp + g (+ 8) x this thread's queries
  float col_max[chunks][2], col_sum[chunks][2];  // the running maximum (exp2 domain), this thread's sums
#pragma unroll
  for (int b = 0; b < L::dim_blocks; ++b)
#pragma unroll
    for (int c = 0; c < chunks; ++c) o[b][c][0] = o[b][c][1] = o[b][c][2] = o[b][c][3] = 0.f;
#pragma unroll
  for (int c = 0; c < chunks; ++c) {
    col_max[c][0] = col_max[c][1] = -infinity();
    col_sum[c][0] = col_sum[c][1] = 0.f;
  }
  float* exchange = reinterpret_cast<float*>(smem + L::exchange);  // [2][4][N], by step parity
  const int causal_offset = Cfg::causal == kCausalBottomRight ? p.seq_k - p.seq_q : 0;

  // O^T += V^T P^T of step s: A = V (stored by key: M-major), one 64-dim product per swizzle block;
  // B = the step's P^T (stored by query: K-major).
  auto issue_values = [&](int step) {
    const int slot = step % 2;
    mbarrier_wait(barrier(L::v_full + slot), (step / 2) & 1);
    const unsigned v_tile = base + L::v_ring + slot * L::kv_bytes;
    const unsigned p_tile = base + L::p_tiles + slot * L::p_bytes;
    wgmma_fence();  // o rescaled by ordinary instructions
#pragma unroll
    for (int b = 0; b < L::dim_blocks; ++b)
#pragma unroll
      for (int kk = 0; kk < L::step_keys / 16; ++kk)
        wgmma_ss_a_transposed<T, N>(o[b], nmajor_descriptor(v_tile + b * L::step_keys * 128, L::step_keys, kk),
                                    kmajor_descriptor(p_tile, N, kk), 1);
    wgmma_commit();
  };

  if (count > 0) mbarrier_wait(barrier(L::q_full), 0);
  for (int step = 0; step < steps; ++step) {
    const int slot = step % 2;
    float s[chunks][4];
    mbarrier_wait(barrier(L::k_full + slot), (step / 2) & 1);
    wgmma_fence();  // o rescaled by ordinary instructions
#pragma unroll
    for (int b = 0; b < L::dim_blocks; ++b) wgmma_fence_operands(o[b]);
    // S^T = K Q^T: the step's 64 keys as rows (A), the queries as columns (B), both K-major.
    wgmma_ss_steps<T, N, Tr::k_steps>(s, base + L::k_ring + slot * L::kv_bytes, L::step_keys, base);
    wgmma_commit();
    if (step > 0) {
      issue_values(step - 1);
      wgmma_wait<1>();  // S^T of this step is ready; O^T of the step before still runs
    } else {
      wgmma_wait<0>();
    }
    wgmma_fence_operands(s);

    // This warp's 16 keys: one key block's (all of it, or a half of one of 32), or padding.
    const int position = step * L::blocks_per_step + 16 * warp / L::block;
    const int first_key = w.tiles.tile(min(position, count - 1)) * L::block + 16 * warp % L::block;
    const bool padding = position >= count;
    const bool whole = !padding && first_key + 16 <= p.seq_k &&
                       (Cfg::causal == kNotCausal || first_key + 15 <= q_row0 + causal_offset);
    if (!whole)
      mask_gathered_scores<Cfg::causal>(
          s, padding, p.seq_q, p.seq_k, [&](int, int e) { return first_key + lane / 4 + 8 * (e / 2); },
          [&](int c, int e) { return q_row0 + (8 * c + 2 * (lane % 4) + e % 2) % L::block; });

    // Each query's maximum over the tile: the thread's two keys, the warp's 16 (lanes 4 apart), then
    // the four warps' through shared memory.
    float* exchange_step = exchange + slot * 4 * N;
#pragma unroll
    for (int c = 0; c < chunks; ++c)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float m = over_warp_keys(fmaxf(s[c][e], s[c][e + 2]), [](float a, float b) { return fmaxf(a, b); });
        if (lane < 4) exchange_step[warp * N + 8 * c + 2 * lane + e] = m;
      }
    named_barrier_sync<1, 128>();
    // Every warp's S^T of this step is done: its K slot takes the K of the step after next.
    if (threadIdx.x == 0 && step + 2 < steps) load_step(maps.k, L::k_ring, L::k_full, step + 2);
    float correction[chunks][2];
#pragma unroll
    for (int c = 0; c < chunks; ++c) {
      const int col = 8 * c + 2 * (lane % 4);
      float2 m = *reinterpret_cast<const float2*>(exchange_step + col);
#pragma unroll
      for (int other = 1; other < 4; ++other) {
        const float2 n = *reinterpret_cast<const float2*>(exchange_step + other * N + col);
        m.x = fmaxf(m.x, n.x), m.y = fmaxf(m.y, n.y);
      }
      const float tile_max[2] = {m.x, m.y};
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float next_max = fmaxf(col_max[c][e], tile_max[e] * p.scale_log2);
        const float base_e = exponent_base(next_max);
        correction[c][e] = fast_exp2(col_max[c][e] - base_e);
        col_max[c][e] = next_max;
        s[c][e] = fast_exp2(fmaf(s[c][e], p.scale_log2, -base_e));
        s[c][e + 2] = fast_exp2(fmaf(s[c][e + 2], p.scale_log2, -base_e));
        col_sum[c][e] = col_sum[c][e] * correction[c][e] + s[c][e] + s[c][e + 2];
      }
    }

    // P^T of this step into its tile, a row of 64 keys a query (the K-major B of O^T += V^T P^T). The
    // tile of step - 1 is still read by O^T of that step.
    stmatrix_transposed<T, N>(base + L::p_tiles + slot * L::p_bytes, N, 0, s);
    fence_proxy_async();  // the stores, before the products read the tile

    // O^T of the step before (unconditional: a wait that ptxas cannot see on every path makes it
    // serialize every wgmma, C7514).
    wgmma_wait<0>();
#pragma unroll
    for (int b = 0; b < L::dim_blocks; ++b) wgmma_fence_operands(o[b]);
#pragma unroll
    for (int b = 0; b < L::dim_blocks; ++b)
#pragma unroll
      for (int c = 0; c < chunks; ++c)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[b][c][e] *= correction[c][e % 2];
    named_barrier_sync<1, 128>();  // every warp's P^T stored; every warp's O^T of the step before done
    if (threadIdx.x == 0 && step >= 1 && step + 1 < steps) load_step(maps.v, L::v_ring, L::v_full, step + 1);
  }
  if (steps > 0) {
#pragma unroll
    for (int b = 0; b < L::dim_blocks; ++b) wgmma_fence_operands(o[b]);
    issue_values(steps - 1);
    wgmma_wait<0>();
#pragma unroll
    for (int b = 0; b < L::dim_blocks; ++b) wgmma_fence_operands(o[b]);
  }

  // Each query's sum: the thread's, the warp's, then the four warps' (the exchange half of the parity no
  // step left pending).
  float* exchange_sums = exchange + (steps % 2) * 4 * N;
#pragma unroll
  for (int c = 0; c < chunks; ++c)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float sum = over_warp_keys(col_sum[c][e], [](float a, float b) { return a + b; });
      if (lane < 4) exchange_sums[warp * N + 8 * c + 2 * lane + e] = sum;
    }
  named_barrier_sync<1, 128>();
  constexpr float ln2 = 0.6931471805599453f;
  float* lse_row0 =
      p.lse ? p.lse + (static_cast<long long>(w.batch) * p.heads_q + w.head_q) * p.seq_q + q_row0 : nullptr;
  auto lse_at = [&](int col) { return lse_row0 + (col / L::block) * static_cast<long long>(p.seq_q) + col % L::block; };
  float inverse[chunks][2];
#pragma unroll
  for (int c = 0; c < chunks; ++c)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int col = 8 * c + 2 * (lane % 4) + e;
      const float sum =
          exchange_sums[col] + exchange_sums[N + col] + exchange_sums[2 * N + col] + exchange_sums[3 * N + col];
      // A query that saw no key: output 0 and log-sum-exp -inf, never NaN.
      inverse[c][e] = sum > 0.f ? 1.f / sum : 0.f;
      if (lse_row0 != nullptr && warp == 0 && lane < 4 && q_row0 + col % L::block < p.seq_q)
        *lse_at(col) = sum > 0.f ? (col_max[c][e] + __log2f(sum)) * ln2 : -infinity();
    }

  // O = (O^T)^T normalized, staged over Q (which no product reads any more) in the copy's swizzled
  // layout: each 8 x 8 matrix of dims x queries stored transposed, a row per query; then one bulk copy.
#pragma unroll
  for (int b = 0; b < L::dim_blocks; ++b)
    stmatrix_transposed<T, N>(base, N, 64 * b, o[b], [&](int c, int e) { return inverse[c][e]; });
  fence_proxy_async();
  named_barrier_sync<1, 128>();
  if (threadIdx.x == 0) {
#pragma unroll
    for (int h = 0; h < L::heads; ++h)
      tma_store_rows<Tr::head_dim, L::block, N>(maps.o, base, h * L::block, w.batch, w.head_q + h, q_row0);
    bulk_commit();
    bulk_wait_read();  // the CTA's shared memory stays until the copy has read it
  }
}

}  // namespace sjit_kernels

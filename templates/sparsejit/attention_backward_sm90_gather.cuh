// Attention backward on Hopper (sm_90a), the dK/dV pass for pattern blocks of 16 and 32
// (path=wgmma_gather): one warpgroup computes dK and dV of one key block, with the query blocks that
// see it gathered 64 queries a step.
//
// Why. The dK/dV pass of attention_backward_sm90.cuh gives a CTA 128 keys, 8 blocks of 16 or 4 of 32,
// and each product covers all of them: a tile of queries costs 128 keys' work wherever any of those
// blocks sees one of its runs. With random blocks at density 0.1 most of that work is masked. Here a
// CTA owns one key block and walks only the query blocks of its pattern column, 64 queries a step (the
// rows of a wgmma product: the next 4 blocks of 16 or 2 of 32, wherever they lie and from any query
// head of the K/V group, one bulk copy each), so every score it computes is one the pattern keeps.
// With N = the block's 16 or 32 keys, a step is:
//   S = Q K^T, dP = dO V^T           queries as rows (A: the gathered Q and dO), keys as columns (B);
//   P = exp2(S scale log2 e - lse2)  in registers, a thread's two query rows (masks where needed),
//   dS = P (dP - delta);
//   dV^T += dO^T P, dK^T += Q^T dS   the head dims as rows, 64 a product (A: dO and Q read transposed,
//                                     M-major), the queries as the reduction, P^T and dS^T from shared
//                                     memory (stmatrix.trans: K-major B);
//   dQ = dS K (atomic dQ)            A = dS from registers, B = K read transposed (N-major), 64 dims at
//                                     a time; each fp32 tile goes to shared memory and into the
//                                     accumulator by bulk reductions, a query block at a time.
// The price: each key block reads its own query blocks (a 128-key CTA reads a tile once for all its
// keys), so the pass is bound by the L2's bandwidth, as the gathered-key forward is
// (docs/attention.md, "Small pattern blocks in the backward: the gathered-query pass").
//
// One warpgroup a CTA; thread 0 issues every copy and reduction. Q and dO have two ring slots, each
// with one barrier for both: step j + 2 loads into step j's slot once every warp's products of step j
// are done. K and V stay for the whole walk. Rows: the accumulator layout (wgmma.cuh) gives warp w the
// queries 16w .. 16w + 15 of a step, all in one query block, and each thread rows g and g + 8 of them.
#pragma once

#include "sparsejit/attention_backward.cuh"
#include "sparsejit/tma.cuh"
#include "sparsejit/wgmma.cuh"

namespace sjit_kernels {

template <class Cfg>
struct BackwardGatherLayout {
  using Tr = BackwardTraits<Cfg>;
  static constexpr int block = Cfg::pattern_block;  // the CTA's keys, and each run's queries
  static_assert(Cfg::sparsity != kDense && (block == 16 || block == 32),
                "path=wgmma_gather (dK/dV): one pattern block of 16 or 32 keys a CTA");
  static_assert(Cfg::warps == 4 && Cfg::block_cols == 64 && Cfg::stages == 2,
                "path=wgmma_gather (dK/dV): one warpgroup, 64 queries a step, two ring slots");
  static constexpr int step_queries = 64;  // the rows of a wgmma product
  static constexpr int runs = step_queries / block;
  static_assert(Cfg::query_runs == runs, "path=wgmma_gather (dK/dV): a query block a run");
  static constexpr int tile_dim = swizzled_tile_cols(Tr::head_dim);
  static constexpr int dim_blocks = tile_dim / 64;  // dV^T's and dK^T's 64-row products, dQ's 64-dim ones
  static constexpr int kv_bytes = block * tile_dim * 2;
  static constexpr int step_bytes = step_queries * tile_dim * 2;  // one Q or dO slot
  static constexpr int transposed_bytes = block * 128;            // P^T or dS^T: a row of 64 queries a key
  // One 64-dim block of a step's fp32 dQ: two boxes of 32 columns x 64 rows (128-byte swizzled rows).
  static constexpr int dq_box_bytes = 64 * 128;
  static constexpr int dq_bytes = Cfg::atomic_dq ? 2 * dq_box_bytes : 0;
  // Offsets from the aligned base (each a multiple of 1 KB: swizzle atoms), then the barriers (K and
  // V's; each slot's Q and dO) and the walk.
  static constexpr int k_tile = 0, v_tile = kv_bytes;
  static constexpr int q_ring = 2 * kv_bytes;
  static constexpr int do_ring = q_ring + 2 * step_bytes;
  static constexpr int p_tile = do_ring + 2 * step_bytes;
  static constexpr int ds_tile = p_tile + transposed_bytes;
  static constexpr int dq_tile = ds_tile + transposed_bytes;
  static constexpr int barriers = dq_tile + dq_bytes;
  static constexpr int kv_full = 0, slot_full = 1;
  static constexpr int walk = barriers + 8 * 3;
  static constexpr int used_bytes = walk + int(sizeof(QueryTileWalk<Cfg, step_queries>));
  static_assert(sizeof(QueryTileWalk<Cfg, step_queries>) <= 1024, "codegen's attention_backward_shared_bytes allows 1 KB for the walk");
  // dK and dV are staged over the Q and dO rings once the walk is done.
  static_assert(kv_bytes <= 2 * step_bytes, "the output staging tiles fit a ring");
  // CTAs an SM as shared memory allows (228 KB, 1 KB reserved a CTA, 1 KB for alignment), at most 4:
  // one CTA's element-wise steps and barriers then run under another's products.
  static constexpr int fit = 228 * 1024 / (used_bytes + 2048);
  static constexpr int ctas_per_sm = fit > 4 ? 4 : fit < 1 ? 1 : fit;
};

template <class Cfg>
__global__ void __launch_bounds__(128, BackwardGatherLayout<Cfg>::ctas_per_sm)
    attention_backward_dkdv_sm90_gather(const AttentionBackwardParams p,
                                        const __grid_constant__ AttentionBackwardTensorMaps maps) {
  using Tr = BackwardTraits<Cfg>;
  using L = BackwardGatherLayout<Cfg>;
  using T = typename Tr::T;
  constexpr int N = L::block, D = Tr::head_dim, runs = L::runs;
  extern __shared__ __align__(1024) unsigned char shared_bwd_gather[];
  unsigned char* smem = swizzle_aligned_shared(shared_bwd_gather, L::used_bytes);
  const unsigned base = smem_address(smem);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  QueryTileWalk<Cfg, L::step_queries>& walk = *reinterpret_cast<QueryTileWalk<Cfg, L::step_queries>*>(smem + L::walk);
  auto barrier = [&](int i) { return base + L::barriers + 8 * i; };

  const KeyTileOwner own = key_tile_owner<Cfg>(p, N);
  if (own.key0 >= p.seq_k) return;  // a schedule item past the end of a short key sequence
  // K and V load before the walk is built (a chain of dependent loads of the schedule), wherever a
  // query may see the block under causality; a pattern column found empty later waits for them anyway.
  const bool loads_kv = QueryTileWalk<Cfg, L::step_queries>::first_query_tile(p, own, N) < (p.seq_q + N - 1) / N;
  if (threadIdx.x == 0) {
    init_copy_barriers(barrier(0), 3);
    if (loads_kv) {
      mbarrier_expect_bytes(barrier(L::kv_full), 2 * L::kv_bytes);
      tma_load_tile<D, N>(base + L::k_tile, maps.k, barrier(L::kv_full), own.batch, own.kv_head, own.key0);
      tma_load_tile<D, N>(base + L::v_tile, maps.v, barrier(L::kv_full), own.batch, own.kv_head, own.key0);
    }
  }
  // The query blocks of the pattern column, of every query head of the group (ends with a
  // __syncthreads, which also publishes the barriers).
  const int entries = walk.build(p, own, N);
  const int steps = (entries + runs - 1) / runs;
  // Step j's query blocks: the next `runs` of the walk; a last step's missing ones repeat its last
  // block (real rows, finite scores), masked to P = dS = 0.
  auto step_runs = [&](int j) { return locate_packed<N, runs, 1>(walk, p, own, j, entries, true); };
  auto load_step = [&](int j) {
    const PackedQueries<N, runs> t = step_runs(j);
    const int slot = j % 2;
    const unsigned full = barrier(L::slot_full + slot);
    mbarrier_expect_bytes(full, 2 * L::step_bytes);
#pragma unroll
    for (int i = 0; i < runs; ++i) {
      tma_load_rows<D, N, L::step_queries>(base + L::q_ring + slot * L::step_bytes, i * N, maps.q_runs, full, own.batch,
                                           t.head_q[i], t.q0[i]);
      tma_load_rows<D, N, L::step_queries>(base + L::do_ring + slot * L::step_bytes, i * N, maps.d_o_runs, full,
                                           own.batch, t.head_q[i], t.q0[i]);
    }
  };
  if (threadIdx.x == 0)
    for (int j = 0; j < 2 && j < steps; ++j) load_step(j);

  float dk[L::dim_blocks][N / 8][4], dv[L::dim_blocks][N / 8][4];  // dK^T, dV^T: dims 64b + 16 warp + g (+ 8) x keys
#pragma unroll
  for (int b = 0; b < L::dim_blocks; ++b)
#pragma unroll
    for (int c = 0; c < N / 8; ++c)
#pragma unroll
      for (int e = 0; e < 4; ++e) dk[b][c][e] = dv[b][c][e] = 0.f;
  const int causal_offset = Cfg::causal == kCausalBottomRight ? p.seq_k - p.seq_q : 0;
  // This warp's query block of a step (its place among the step's runs), and its first row in it.
  const int run = 16 * warp / N, run_row0 = 16 * warp % N;
  if (loads_kv) mbarrier_wait(barrier(L::kv_full), 0);  // (a CTA must not end with its copies in flight)

  for (int j = 0; j < steps; ++j) {
    const int slot = j % 2;
    const PackedQueries<N, runs> t = step_runs(j);
    const bool padding = run >= t.runs;
    int head_q = t.head_q[0], q0 = t.q0[0] + run_row0;  // this warp's first query
#pragma unroll
    for (int i = 1; i < runs; ++i)  // (a constant index each: t stays in registers)
      if (run == i) head_q = t.head_q[i], q0 = t.q0[i] + run_row0;
    // The statistics of this thread's two rows, loaded while the products run (past Sq: lse2 = inf,
    // so P = 0).
    const RowStats stats[2] = {row_stats(p, own.batch, head_q, q0 + lane / 4),
                               row_stats(p, own.batch, head_q, q0 + lane / 4 + 8)};
    const unsigned q_slot = base + L::q_ring + slot * L::step_bytes;
    const unsigned do_slot = base + L::do_ring + slot * L::step_bytes;
    mbarrier_wait(barrier(L::slot_full + slot), (j / 2) & 1);

    // S = Q K^T and dP = dO V^T: the step's 64 queries as rows, the block's keys as columns.
    float s[N / 8][4], dp[N / 8][4];
    wgmma_fence();
    wgmma_ss_steps<T, N, Tr::k_steps>(s, q_slot, L::step_queries, base + L::k_tile);
    wgmma_commit();
    wgmma_ss_steps<T, N, Tr::k_steps>(dp, do_slot, L::step_queries, base + L::v_tile);
    wgmma_commit();
    wgmma_wait<1>();
    wgmma_fence_operands(s);

    // Masks: a padding run; keys past Sk (the copy's zeros); the causal edge.
    const bool whole = !padding && own.key0 + N <= p.seq_k &&
                       (Cfg::causal == kNotCausal || own.key0 + N - 1 <= q0 + causal_offset);
    if (!whole) {
#pragma unroll
      for (int c = 0; c < N / 8; ++c)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = own.key0 + 8 * c + 2 * (lane % 4) + e % 2;
          const int query = q0 + lane / 4 + 8 * (e / 2);
          bool allowed = !padding && key < p.seq_k;
          if constexpr (Cfg::causal != kNotCausal) allowed = allowed && key <= query + causal_offset;
          if (!allowed) s[c][e] = -infinity();
        }
    }
#pragma unroll
    for (int c = 0; c < N / 8; ++c)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[c][e] = fast_exp2(fmaf(s[c][e], p.scale_log2, -stats[e / 2].lse2));
    wgmma_wait<0>();
    wgmma_fence_operands(dp);
#pragma unroll
    for (int c = 0; c < N / 8; ++c)
#pragma unroll
      for (int e = 0; e < 4; ++e) dp[c][e] = s[c][e] * (dp[c][e] - stats[e / 2].delta);  // dS

    // P^T and dS^T into their tiles (the previous step's products that read them are done: every
    // warp waited for them before the last barrier), dS as the A fragments of dQ = dS K.
    stmatrix_transposed<T, N>(base + L::p_tile, N, 0, s);
    stmatrix_transposed<T, N>(base + L::ds_tile, N, 0, dp);
    unsigned dsa[N / 16][4];
#pragma unroll
    for (int kk = 0; kk < N / 16; ++kk) pack_a_fragment<T>(dp, kk, dsa[kk]);
    fence_proxy_async();  // the stores, before the products read the tiles
    named_barrier_sync<1, 128>();

    // dV^T += dO^T P and dK^T += Q^T dS (scaled at the end): A = dO and Q read transposed, a 64-dim
    // block a product; B = P^T and dS^T, K-major.
    wgmma_fence();
#pragma unroll
    for (int b = 0; b < L::dim_blocks; ++b) {
      wgmma_fence_operands(dv[b]);
      wgmma_fence_operands(dk[b]);
#pragma unroll
      for (int kk = 0; kk < L::step_queries / 16; ++kk) {
        wgmma_ss_a_transposed<T, N>(dv[b], nmajor_descriptor(do_slot + b * L::step_queries * 128, L::step_queries, kk),
                                    kmajor_descriptor(base + L::p_tile, N, kk), 1);
        wgmma_ss_a_transposed<T, N>(dk[b], nmajor_descriptor(q_slot + b * L::step_queries * 128, L::step_queries, kk),
                                    kmajor_descriptor(base + L::ds_tile, N, kk), 1);
      }
    }
    wgmma_commit();

    if constexpr (Cfg::atomic_dq) {
      // dQ = dS K, 64 dims at a time: each block's fp32 tile into shared memory once the last
      // reductions have read it, then added to the accumulator a query block (run) at a time.
#pragma unroll
      for (int b = 0; b < L::dim_blocks; ++b) {
        float dq[8][4];
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < N / 16; ++kk)
          wgmma_rs<T, 64>(dq, dsa[kk], nmajor_descriptor(base + L::k_tile + b * N * 128, N, kk), kk > 0);
        wgmma_commit();
        wgmma_wait<0>();
        wgmma_fence_operands(dq);
        if (b == 0) {
#pragma unroll
          for (int bb = 0; bb < L::dim_blocks; ++bb) {
            wgmma_fence_operands(dv[bb]);
            wgmma_fence_operands(dk[bb]);
          }
        }
        if (threadIdx.x == 0) bulk_wait_read();
        named_barrier_sync<1, 128>();  // the tile is free; at b = 0 also every warp's products of the step are done
        if (b == 0 && threadIdx.x == 0 && j + 2 < steps) load_step(j + 2);
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int row = 16 * warp + lane / 4 + 8 * h, col = 8 * nt + 2 * (lane % 4);
            *reinterpret_cast<float2*>(smem + L::dq_tile + swizzled_offset<4>(64, row, col)) =
                make_float2(dq[nt][2 * h], dq[nt][2 * h + 1]);
          }
        fence_proxy_async();
        named_barrier_sync<1, 128>();
        if (threadIdx.x == 0) {
#pragma unroll
          for (int i = 0; i < runs; ++i)
            if (i < t.runs)
#pragma unroll
              for (int box = 0; box < 2; ++box)
                if (64 * b + 32 * box < D)  // d = 96: the second block's dims 96 .. 127 are K's zero padding
                  tma_reduce_add_4d(maps.dq_accum_runs, base + L::dq_tile + box * L::dq_box_bytes + i * N * 128,
                                    64 * b + 32 * box, t.q0[i], t.head_q[i], own.batch);
          bulk_commit();
        }
      }
    } else {
      wgmma_wait<0>();
#pragma unroll
      for (int b = 0; b < L::dim_blocks; ++b) {
        wgmma_fence_operands(dv[b]);
        wgmma_fence_operands(dk[b]);
      }
      named_barrier_sync<1, 128>();  // every warp's products of the step are done: its slot is free
      if (threadIdx.x == 0 && j + 2 < steps) load_step(j + 2);
    }
  }

  // dK (scaled) and dV: staged transposed over the Q and dO rings (no copy or product uses them any
  // more), then written a 16-byte chunk a thread at a time.
  if (threadIdx.x == 0) bulk_wait_done();  // (the reductions' reads of shared memory too)
  named_barrier_sync<1, 128>();
#pragma unroll
  for (int b = 0; b < L::dim_blocks; ++b) {
    stmatrix_transposed<T, N>(base + L::q_ring, N, 64 * b, dk[b], [&](int, int) { return p.scale; });
    stmatrix_transposed<T, N>(base + L::do_ring, N, 64 * b, dv[b]);
  }
  named_barrier_sync<1, 128>();
  T* dk_out = static_cast<T*>(p.dk) + own.batch * p.dk_batch_stride + own.kv_head * p.dk_head_stride;
  T* dv_out = static_cast<T*>(p.dv) + own.batch * p.dv_batch_stride + own.kv_head * p.dv_head_stride;
  constexpr int chunks = D / 8;
  for (int i = threadIdx.x; i < N * chunks; i += 128) {
    const int r = i / chunks, c = i % chunks, key = own.key0 + r;
    if (key >= p.seq_k) continue;
    const int at = swizzled_offset(N, r, 8 * c);
    *reinterpret_cast<uint4*>(dk_out + key * p.dk_row_stride + 8 * c) = *reinterpret_cast<const uint4*>(smem + L::q_ring + at);
    *reinterpret_cast<uint4*>(dv_out + key * p.dv_row_stride + 8 * c) = *reinterpret_cast<const uint4*>(smem + L::do_ring + at);
  }
}

}  // namespace sjit_kernels

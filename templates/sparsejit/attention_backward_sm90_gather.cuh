// Attention backward on Hopper (sm_90a) for pattern blocks of 16 and 32 (path=wgmma_gather): a dK/dV
// pass in which one warpgroup computes dK and dV of one key block, with the query blocks that see it
// gathered 64 queries a step, and a dQ pass in which one warpgroup computes dQ of one query block, with
// the key blocks it sees gathered 64 keys a step (below, attention_backward_dq_sm90_gather).
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
// One warpgroup a CTA; thread 0 issues every copy and reduction. A ring slot holds a step's Q and dO
// (one barrier for both), then its fp32 dQ once every warp's products are done with them; step j + 1
// loads into step j - 1's slot at the top of step j, once that step's reductions have read it. K and V
// stay for the whole walk. Rows: the accumulator layout (wgmma.cuh) gives warp w the queries
// 16w .. 16w + 15 of a step, all in one query block, and each thread rows g and g + 8 of them.
#pragma once

#include "sparsejit/attention_backward.cuh"
#include "sparsejit/tma.cuh"
#include "sparsejit/wgmma.cuh"

namespace sjit_kernels {

// What the layouts of both passes share: a CTA owns one pattern block of 16 or 32 rows (keys or
// queries; the dQ pass also 64) and walks the other side's blocks 64 rows a step with one warpgroup.
template <class Cfg>
struct BackwardGatherShape {
  using Tr = BackwardTraits<Cfg>;
  static constexpr int block = Cfg::pattern_block;
  static_assert(Cfg::sparsity != kDense && (block == 16 || block == 32 || block == 64),
                "path=wgmma_gather: one pattern block of 16, 32 or 64 a CTA");
  static_assert(Cfg::warps == 4 && Cfg::block_cols == 64 && Cfg::stages == 2,
                "path=wgmma_gather: one warpgroup, 64 rows a step, two ring slots");
  static constexpr int step_rows = 64;  // the rows of a wgmma product
  static constexpr int blocks_per_step = step_rows / block;
  static constexpr int tile_dim = swizzled_tile_cols(Tr::head_dim);
  static constexpr int dim_blocks = tile_dim / 64;  // 64-row products over the head dims
  static constexpr int block_bytes = block * tile_dim * 2;  // the CTA's block of one tensor
  static constexpr int step_bytes = step_rows * tile_dim * 2;  // a step's rows of one tensor
};

template <class Cfg>
struct BackwardGatherLayout : BackwardGatherShape<Cfg> {
  using Base = BackwardGatherShape<Cfg>;
  using Base::block, Base::tile_dim, Base::step_bytes;
  using Tr = BackwardTraits<Cfg>;
  static constexpr int step_queries = Base::step_rows, runs = Base::blocks_per_step;
  static_assert(Cfg::query_runs == runs, "path=wgmma_gather (dK/dV): a query block a run");
  static_assert(block < 64, "path=wgmma_gather (dK/dV): blocks of 64 run attention_backward_sm90_key_block.cuh");
  static constexpr int kv_bytes = Base::block_bytes;
  static constexpr int slot_bytes = 2 * step_bytes;  // a ring slot: a step's Q, then its dO
  static constexpr int transposed_bytes = block * 128;            // P^T or dS^T: a row of 64 queries a key
  // A step's fp32 dQ (atomic dQ), staged over its own slot once the products are done with it: boxes of
  // 32 columns x 64 rows (128-byte swizzled rows), one after the other.
  static constexpr int dq_box_bytes = 64 * 128, dq_boxes = (Tr::head_dim + 31) / 32;
  static_assert(dq_boxes * dq_box_bytes <= slot_bytes, "a step's dQ fits its slot");
  // Offsets from the aligned base (each a multiple of 1 KB: swizzle atoms), then the barriers (K and
  // V's; each slot's) and the walk.
  static constexpr int k_tile = 0, v_tile = kv_bytes;
  static constexpr int ring = 2 * kv_bytes;
  static constexpr int p_tile = ring + 2 * slot_bytes;
  static constexpr int ds_tile = p_tile + transposed_bytes;
  static constexpr int barriers = ds_tile + transposed_bytes;
  static constexpr int kv_full = 0, slot_full = 1;
  static constexpr int walk = barriers + 8 * 3;
  static constexpr int used_bytes = walk + int(sizeof(QueryTileWalk<Cfg, step_queries>));
  static_assert(sizeof(QueryTileWalk<Cfg, step_queries>) <= 1024, "codegen's attention_backward_shared_bytes allows 1 KB for the walk");
  // dK and dV are staged over the first slot once the walk is done.
  static_assert(kv_bytes <= step_bytes, "the output staging tiles fit a slot's Q and dO");
  // At most 4: one CTA's element-wise steps and barriers then run under another's products.
  static constexpr int ctas_per_sm = ctas_per_sm_by_shared(used_bytes, 4);
};

// What the dK/dV passes of a pattern block a CTA share (this file's and, for blocks of 64,
// attention_backward_sm90_key_block.cuh's). Thread 0 initializes the CTA's three mbarriers (K and V's,
// each ring slot's) and, where `loads_kv`, requests the block's ROWS keys of K and V, TILE_BYTES each,
// into `k_tile` and `v_tile`: before the walk is built (a chain of dependent loads of the schedule),
// so that the copies run under it.
template <int D, int ROWS>
__device__ __forceinline__ void request_block_kv(unsigned first_barrier, bool loads_kv, unsigned k_tile, unsigned v_tile,
                                                 unsigned tile_bytes, const AttentionBackwardTensorMaps& maps,
                                                 const KeyTileOwner& own) {
  if (threadIdx.x != 0) return;
  init_copy_barriers(first_barrier, 3);
  if (!loads_kv) return;
  mbarrier_expect_bytes(first_barrier, 2 * tile_bytes);
  tma_load_tile<D, ROWS>(k_tile, maps.k, first_barrier, own.batch, own.kv_head, own.key0);
  tma_load_tile<D, ROWS>(v_tile, maps.v, first_barrier, own.batch, own.kv_head, own.key0);
}

// A step's fp32 dQ (64 queries x the dims of DIM_BLOCKS 64-dim products, dq[b]: this warp's 16 rows)
// into `tile`: boxes of 32 columns x 64 rows of 128-byte swizzled rows, one after the other, the source
// of the bulk reductions; dims past 32 * BOXES (d = 96: K's zero padding) are dropped.
template <int DIM_BLOCKS, int BOXES>
__device__ __forceinline__ void stage_step_dq(unsigned char* tile, const float (&dq)[DIM_BLOCKS][8][4]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int b = 0; b < DIM_BLOCKS; ++b)
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = 16 * warp + lane / 4 + 8 * h, col = 64 * b + 8 * nt + 2 * (lane % 4);
        if (col < 32 * BOXES)
          *reinterpret_cast<float2*>(tile + swizzled_offset<4>(64, row, col)) = make_float2(dq[b][nt][2 * h], dq[b][nt][2 * h + 1]);
      }
}

// Rows row0 .. row0 + ROWS - 1 (those before `rows_total`) of a [rows, HEAD_DIM] matrix at `out` from a
// 128-byte-swizzled tile of ROWS rows (stmatrix_transposed's), a 16-byte chunk a thread at a time.
template <int HEAD_DIM, int ROWS, class T>
__device__ __forceinline__ void store_staged_rows(T* out, long long row_stride, const unsigned char* tile, int row0,
                                                  int rows_total) {
  constexpr int chunks = HEAD_DIM / 8;
  for (int i = threadIdx.x; i < ROWS * chunks; i += 128) {
    const int r = i / chunks, c = i % chunks;
    if (row0 + r < rows_total)
      *reinterpret_cast<uint4*>(out + (row0 + r) * row_stride + 8 * c) =
          *reinterpret_cast<const uint4*>(tile + swizzled_offset(ROWS, r, 8 * c));
  }
}

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
  static_assert(L::kv_full == 0, "K and V's barrier comes first");
  request_block_kv<D, N>(barrier(0), loads_kv, base + L::k_tile, base + L::v_tile, L::kv_bytes, maps, own);
  // The query blocks of the pattern column, of every query head of the group (ends with a
  // __syncthreads, which also publishes the barriers).
  const int entries = walk.build(p, own, N);
  const int steps = (entries + runs - 1) / runs;
  // Step j's query blocks: the next `runs` of the walk; a last step's missing ones repeat its last
  // block (real rows, finite scores), masked to P = dS = 0.
  auto step_runs = [&](int j) { return locate_packed<N, runs, 1>(walk, p, own, j, entries, true); };
  auto slot_at = [&](int j) { return base + L::ring + (j % 2) * L::slot_bytes; };
  auto load_step = [&](int j, const PackedQueries<N, runs>& t) {
    const unsigned full = barrier(L::slot_full + j % 2);
    mbarrier_expect_bytes(full, L::slot_bytes);
#pragma unroll
    for (int i = 0; i < runs; ++i) {
      tma_load_rows<D, N, L::step_queries>(slot_at(j), i * N, maps.q_runs, full, own.batch, t.head_q[i], t.q0[i]);
      tma_load_rows<D, N, L::step_queries>(slot_at(j) + L::step_bytes, i * N, maps.d_o_runs, full, own.batch,
                                           t.head_q[i], t.q0[i]);
    }
  };
  // Where a step's blocks are comes from global memory (the schedule's list), and so do its rows'
  // statistics, which need that: each step locates the step after next and loads the next one's
  // statistics, so that no step waits for either.
  auto located = [&](int j) { return step_runs(min(j, steps - 1)); };
  PackedQueries<N, runs> t, t_next;
  if (steps > 0) t = located(0), t_next = located(1);
  if (threadIdx.x == 0 && steps > 0) load_step(0, t);
  if (threadIdx.x == 0 && steps > 1) load_step(1, t_next);

  float dk[L::dim_blocks][N / 8][4], dv[L::dim_blocks][N / 8][4];  // dK^T, dV^T: dims 64b + 16 warp + g (+ 8) x keys
#pragma unroll
  for (int b = 0; b < L::dim_blocks; ++b)
#pragma unroll
    for (int c = 0; c < N / 8; ++c)
#pragma unroll
      for (int e = 0; e < 4; ++e) dk[b][c][e] = dv[b][c][e] = 0.f;
  const int causal_offset = Cfg::causal == kCausalBottomRight ? p.seq_k - p.seq_q : 0;
  // This warp's query block of a step (its place among the step's runs), its first row in it, and the
  // step's first query of this warp and its head.
  const int run = 16 * warp / N, run_row0 = 16 * warp % N;
  struct WarpRows {
    int head_q, q0;
  };
  auto warp_rows = [&](const PackedQueries<N, runs>& at) {
    WarpRows r{at.head_q[0], at.q0[0] + run_row0};
#pragma unroll
    for (int i = 1; i < runs; ++i)  // (a constant index each: the runs stay in registers)
      if (run == i) r = {at.head_q[i], at.q0[i] + run_row0};
    return r;
  };
  // This thread's two rows' statistics (past Sq: lse2 = inf, so P = 0).
  struct Stats {
    RowStats row[2];
  };
  auto stats_of = [&](const PackedQueries<N, runs>& at) {
    const WarpRows r = warp_rows(at);
    return Stats{{row_stats(p, own.batch, r.head_q, r.q0 + lane / 4), row_stats(p, own.batch, r.head_q, r.q0 + lane / 4 + 8)}};
  };
  Stats stats;
  if (steps > 0) stats = stats_of(t);
  if (loads_kv) mbarrier_wait(barrier(L::kv_full), 0);  // (a CTA must not end with its copies in flight)

  for (int j = 0; j < steps; ++j) {
    const unsigned q_slot = slot_at(j), do_slot = q_slot + L::step_bytes;
    const PackedQueries<N, runs> t_after = located(j + 2);  // in flight during the step
    mbarrier_wait(barrier(L::slot_full + j % 2), (j / 2) & 1);

    // S = Q K^T and dP = dO V^T: the step's 64 queries as rows, the block's keys as columns.
    float s[N / 8][4], dp[N / 8][4];
    wgmma_fence();
    wgmma_ss_steps<T, N, Tr::k_steps>(s, q_slot, L::step_queries, base + L::k_tile);
    wgmma_commit();
    wgmma_ss_steps<T, N, Tr::k_steps>(dp, do_slot, L::step_queries, base + L::v_tile);
    wgmma_commit();
    // The slot of step j + 1 takes its queries once step j - 1's reductions have read its dQ there:
    // waited for under this step's products, not before them, where it held up the warpgroup's wgmma
    // (2-3% faster at blocks of 16 and 32; the key-block pass of blocks of 64 lost 2-6% so:
    // docs/attention-log.md, "The thirty-seventh session's runs").
    if (threadIdx.x == 0 && j >= 1 && j + 1 < steps) {
      if constexpr (Cfg::atomic_dq) bulk_wait_read();
      load_step(j + 1, t_next);
    }
    const Stats stats_next = stats_of(t_next);  // in flight during the step
    wgmma_wait<1>();
    wgmma_fence_operands(s);

    // Masks: a padding run; keys past Sk (the copy's zeros); the causal edge.
    const bool padding = run >= t.runs;
    const int q0 = warp_rows(t).q0;  // this warp's first query
    const bool whole = !padding && own.key0 + N <= p.seq_k &&
                       (Cfg::causal == kNotCausal || own.key0 + N - 1 <= q0 + causal_offset);
    if (!whole)
      mask_gathered_scores<Cfg::causal>(
          s, padding, p.seq_q, p.seq_k, [&](int c, int e) { return own.key0 + 8 * c + 2 * (lane % 4) + e % 2; },
          [&](int, int e) { return q0 + lane / 4 + 8 * (e / 2); });
#pragma unroll
    for (int c = 0; c < N / 8; ++c)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[c][e] = fast_exp2(fmaf(s[c][e], p.scale_log2, -stats.row[e / 2].lse2));
    wgmma_wait<0>();
    wgmma_fence_operands(dp);
#pragma unroll
    for (int c = 0; c < N / 8; ++c)
#pragma unroll
      for (int e = 0; e < 4; ++e) dp[c][e] = s[c][e] * (dp[c][e] - stats.row[e / 2].delta);  // dS

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
      // dQ = dS K, all dims (64 a product), then staged over the step's slot once every warp's products
      // are done with it, and added to the accumulator a query block (run) and 32 dims at a time.
      float dq[L::dim_blocks][8][4];
      wgmma_fence();
#pragma unroll
      for (int b = 0; b < L::dim_blocks; ++b)
#pragma unroll
        for (int kk = 0; kk < N / 16; ++kk)
          wgmma_rs<T, 64>(dq[b], dsa[kk], nmajor_descriptor(base + L::k_tile + b * N * 128, N, kk), kk > 0);
      wgmma_commit();
      wgmma_wait<0>();
#pragma unroll
      for (int b = 0; b < L::dim_blocks; ++b) {
        wgmma_fence_operands(dq[b]);
        wgmma_fence_operands(dv[b]);
        wgmma_fence_operands(dk[b]);
      }
      named_barrier_sync<1, 128>();  // every warp's products of the step are done with its slot
      stage_step_dq<L::dim_blocks, L::dq_boxes>(smem + (q_slot - base), dq);
      fence_proxy_async();
      named_barrier_sync<1, 128>();
      if (threadIdx.x == 0) {
#pragma unroll
        for (int i = 0; i < runs; ++i)
          if (i < t.runs)
#pragma unroll
            for (int box = 0; box < L::dq_boxes; ++box)
              tma_reduce_add_4d(maps.dq_accum_runs, q_slot + box * L::dq_box_bytes + i * N * 128, 32 * box, t.q0[i],
                                t.head_q[i], own.batch);
        bulk_commit();
      }
    } else {
      wgmma_wait<0>();
#pragma unroll
      for (int b = 0; b < L::dim_blocks; ++b) {
        wgmma_fence_operands(dv[b]);
        wgmma_fence_operands(dk[b]);
      }
      named_barrier_sync<1, 128>();  // every warp's products of the step are done with its slot
    }
    t = t_next, t_next = t_after, stats = stats_next;
  }

  // dK (scaled) and dV: staged transposed over the first slot (no copy or product uses it any more),
  // then written a 16-byte chunk a thread at a time.
  if (threadIdx.x == 0) bulk_wait_done();  // (the reductions' reads of shared memory too)
  named_barrier_sync<1, 128>();
  const unsigned dk_staging = base + L::ring, dv_staging = dk_staging + L::step_bytes;
#pragma unroll
  for (int b = 0; b < L::dim_blocks; ++b) {
    stmatrix_transposed<T, N>(dk_staging, N, 64 * b, dk[b], [&](int, int) { return p.scale; });
    stmatrix_transposed<T, N>(dv_staging, N, 64 * b, dv[b]);
  }
  named_barrier_sync<1, 128>();
  store_staged_rows<D, N>(static_cast<T*>(p.dk) + own.batch * p.dk_batch_stride + own.kv_head * p.dk_head_stride,
                          p.dk_row_stride, smem + (dk_staging - base), own.key0, p.seq_k);
  store_staged_rows<D, N>(static_cast<T*>(p.dv) + own.batch * p.dv_batch_stride + own.kv_head * p.dv_head_stride,
                          p.dv_row_stride, smem + (dv_staging - base), own.key0, p.seq_k);
}

// The dQ pass (deterministic: no atomics): one warpgroup computes dQ of one query block, walking the
// key blocks of its pattern row (the forward's schedule, cut at the causal edge) 64 keys a step, the
// products transposed as in the gathered-key forward (attention_forward_sm90_gather.cuh):
//   S^T = K Q^T, dP^T = V dO^T        the step's 64 keys as rows (A: the gathered K and V), the
//                                      block's queries as columns (B);
//   P^T = exp2(S^T scale log2 e - lse2), dS^T = P^T (dP^T - delta)   a thread's columns' statistics
//                                      in registers;
//   dQ^T += K^T dS^T                   the head dims as rows (A: K read transposed), the keys as the
//                                      reduction, dS^T from shared memory (stmatrix.trans: K-major B).
// K and V have two ring slots with one barrier for both; step j + 2 loads into step j's slot once every
// warp's products of step j are done. Rows: warp w holds keys 16w .. 16w + 15 of a step, all in one key
// block, and each thread columns 8c + 2t, 8c + 2t + 1 of every 8-column chunk c.
template <class Cfg>
struct BackwardDqGatherLayout : BackwardGatherShape<Cfg> {
  using Base = BackwardGatherShape<Cfg>;
  using Base::block, Base::step_bytes;
  static constexpr int step_keys = Base::step_rows;
  static constexpr int q_tile = 0, do_tile = Base::block_bytes, ring = 2 * Base::block_bytes;  // a slot: K, then V
  static constexpr int ds_tile = ring + 4 * step_bytes;  // dS^T: a row of 64 keys a query
  static constexpr int barriers = ds_tile + block * 128;
  static constexpr int own_full = 0, slot_full = 1;
  static constexpr int used_bytes = barriers + 8 * 3;
  static constexpr int ctas_per_sm = ctas_per_sm_by_shared(used_bytes, 4);
};

template <class Cfg>
__global__ void __launch_bounds__(128, BackwardDqGatherLayout<Cfg>::ctas_per_sm)
    attention_backward_dq_sm90_gather(const AttentionBackwardParams p,
                                      const __grid_constant__ AttentionBackwardTensorMaps maps) {
  using Tr = BackwardTraits<Cfg>;
  using L = BackwardDqGatherLayout<Cfg>;
  using T = typename Tr::T;
  constexpr int N = L::block, D = Tr::head_dim;
  extern __shared__ __align__(1024) unsigned char shared_dq_gather[];
  unsigned char* smem = swizzle_aligned_shared(shared_dq_gather, L::used_bytes);
  const unsigned base = smem_address(smem);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  auto barrier = [&](int i) { return base + L::barriers + 8 * i; };

  // The query block, and its key blocks (a key tile of the schedule is one block).
  const QueryTileWork w = query_tile_work<Cfg, N, N>(p);
  if (w.q0 >= p.seq_q) return;  // a schedule item past the end of a short sequence
  const int kv_head = w.head_q / (p.heads_q / p.heads_kv);
  const int steps = (w.count + L::blocks_per_step - 1) / L::blocks_per_step;
  auto slot_at = [&](int j) { return base + L::ring + (j % 2) * 2 * L::step_bytes; };
  // Step j gathers the blocks j * blocks_per_step .. + blocks_per_step - 1 into one tile; past the last
  // block the tile repeats it (finite values), masked.
  auto load_step = [&](int j) {
    const unsigned full = barrier(L::slot_full + j % 2);
    mbarrier_expect_bytes(full, 2 * L::step_bytes);
#pragma unroll
    for (int i = 0; i < L::blocks_per_step; ++i) {
      const int key0 = w.key_tile(min(j * L::blocks_per_step + i, w.count - 1)) * N;
      tma_load_rows<D, N, L::step_keys>(slot_at(j), i * N, maps.k, full, w.batch, kv_head, key0);
      tma_load_rows<D, N, L::step_keys>(slot_at(j) + L::step_bytes, i * N, maps.v, full, w.batch, kv_head, key0);
    }
  };
  if (threadIdx.x == 0) {
    init_copy_barriers(barrier(0), 3);
    if (steps > 0) {
      mbarrier_expect_bytes(barrier(L::own_full), 2 * L::block_bytes);
      tma_load_tile<D, N>(base + L::q_tile, maps.q, barrier(L::own_full), w.batch, w.head_q, w.q0);
      tma_load_tile<D, N>(base + L::do_tile, maps.d_o, barrier(L::own_full), w.batch, w.head_q, w.q0);
      for (int j = 0; j < 2 && j < steps; ++j) load_step(j);
    }
  }
  // This thread's columns' statistics (past Sq: lse2 = inf, so P = 0).
  RowStats stats[N / 8][2];
#pragma unroll
  for (int c = 0; c < N / 8; ++c)
#pragma unroll
    for (int e = 0; e < 2; ++e) stats[c][e] = row_stats(p, w.batch, w.head_q, w.q0 + 8 * c + 2 * (lane % 4) + e);
  __syncthreads();  // the barriers are initialized before anyone waits on them

  float dq[L::dim_blocks][N / 8][4];  // dQ^T: dims 64b + 16 warp + g (+ 8) x this thread's queries
#pragma unroll
  for (int b = 0; b < L::dim_blocks; ++b)
#pragma unroll
    for (int c = 0; c < N / 8; ++c) dq[b][c][0] = dq[b][c][1] = dq[b][c][2] = dq[b][c][3] = 0.f;
  const int causal_offset = Cfg::causal == kCausalBottomRight ? p.seq_k - p.seq_q : 0;
  if (steps > 0) mbarrier_wait(barrier(L::own_full), 0);
  for (int j = 0; j < steps; ++j) {
    const unsigned k_slot = slot_at(j), v_slot = k_slot + L::step_bytes;
    mbarrier_wait(barrier(L::slot_full + j % 2), (j / 2) & 1);
    float s[N / 8][4], dp[N / 8][4];  // S^T and dP^T: the step's keys x the block's queries
    wgmma_fence();
    wgmma_ss_steps<T, N, Tr::k_steps>(s, k_slot, L::step_keys, base + L::q_tile);
    wgmma_commit();
    wgmma_ss_steps<T, N, Tr::k_steps>(dp, v_slot, L::step_keys, base + L::do_tile);
    wgmma_commit();
    wgmma_wait<1>();
    wgmma_fence_operands(s);

    // This warp's 16 keys: one key block's (all of it, or a half of one of 32, or a quarter of one of
    // 64), or padding.
    const int position = j * L::blocks_per_step + 16 * warp / N;
    const int first_key = w.key_tile(min(position, w.count - 1)) * N + 16 * warp % N;
    const bool padding = position >= w.count;
    const bool whole = !padding && first_key + 16 <= p.seq_k &&
                       (Cfg::causal == kNotCausal || first_key + 15 <= w.q0 + causal_offset);
    if (!whole)
      mask_gathered_scores<Cfg::causal>(
          s, padding, p.seq_q, p.seq_k, [&](int, int e) { return first_key + lane / 4 + 8 * (e / 2); },
          [&](int c, int e) { return w.q0 + 8 * c + 2 * (lane % 4) + e % 2; });
#pragma unroll
    for (int c = 0; c < N / 8; ++c)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[c][e] = fast_exp2(fmaf(s[c][e], p.scale_log2, -stats[c][e % 2].lse2));
    wgmma_wait<0>();
    wgmma_fence_operands(dp);
#pragma unroll
    for (int c = 0; c < N / 8; ++c)
#pragma unroll
      for (int e = 0; e < 4; ++e) dp[c][e] = s[c][e] * (dp[c][e] - stats[c][e % 2].delta);  // dS^T

    // dS^T into its tile, a row of 64 keys a query (the previous step's products that read it are done:
    // every warp waited for them before the last barrier); then dQ^T += K^T dS^T.
    stmatrix_transposed<T, N>(base + L::ds_tile, N, 0, dp);
    fence_proxy_async();
    named_barrier_sync<1, 128>();
    wgmma_fence();
#pragma unroll
    for (int b = 0; b < L::dim_blocks; ++b) {
      wgmma_fence_operands(dq[b]);
#pragma unroll
      for (int kk = 0; kk < L::step_keys / 16; ++kk)
        wgmma_ss_a_transposed<T, N>(dq[b], nmajor_descriptor(k_slot + b * L::step_keys * 128, L::step_keys, kk),
                                    kmajor_descriptor(base + L::ds_tile, N, kk), 1);
    }
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int b = 0; b < L::dim_blocks; ++b) wgmma_fence_operands(dq[b]);
    named_barrier_sync<1, 128>();  // every warp's products of the step are done with its slot
    if (threadIdx.x == 0 && j + 2 < steps) load_step(j + 2);
  }

  // dQ (scaled), staged transposed over Q (no product reads it any more), then written.
  named_barrier_sync<1, 128>();
#pragma unroll
  for (int b = 0; b < L::dim_blocks; ++b)
    stmatrix_transposed<T, N>(base + L::q_tile, N, 64 * b, dq[b], [&](int, int) { return p.scale; });
  named_barrier_sync<1, 128>();
  store_staged_rows<D, N>(static_cast<T*>(p.dq) + w.batch * p.dq_batch_stride + w.head_q * p.dq_head_stride,
                          p.dq_row_stride, smem + L::q_tile, w.q0, p.seq_q);
}

}  // namespace sjit_kernels

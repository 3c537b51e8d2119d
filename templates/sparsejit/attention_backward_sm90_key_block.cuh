// Attention backward on Hopper (sm_90a) for pattern blocks of 64 (path=wgmma_gather, block=64): a
// dK/dV pass in which one warpgroup computes dK and dV of one key block of 64, walking only the query
// blocks of its own pattern column, one 64-query block a step. (Its dQ pass, without atomic dQ, is the
// gathered one of attention_backward_sm90_gather.cuh with 64 keys a step.)
//
// Why. The dK/dV pass of attention_backward_sm90.cuh gives a CTA 128 keys, two blocks of 64, one a
// warpgroup, and walks the union of both blocks' query tiles. With random blocks at density 0.1 the
// two columns share few tiles, so nearly every step has one warpgroup idle (it skips the products:
// "the dK/dV pass skips a warpgroup's inactive keys"), and the CTA runs its steps with one warpgroup's
// work and the other's latency uncovered. Here a CTA walks only its own block's steps, and two CTAs
// an SM (about 107 KB of shared memory each) cover each other's element-wise steps and waits.
//
// Unlike the gathered passes of blocks of 16 and 32, a block of 64 keys fills the rows of a wgmma
// product, so the products keep the 128-key pass's orientation (keys as rows):
//   S^T = K Q^T, dP^T = V dO^T         A = the block's K and V, B = the step's Q and dO, K-major;
//   P^T = exp2(S^T scale log2 e - lse2), dS^T = P^T (dP^T - delta)   the step's statistics, by query
//                                       column, from shared memory;
//   dV += P^T dO, dK += dS^T Q          A = P^T and dS^T from registers, B = dO and Q read transposed;
//   dQ = dS K (atomic dQ)               A = dS^T from shared memory read transposed, B = K read
//                                       transposed, 64 dims a product; staged in fp32 over the step's
//                                       slot and added to the accumulator by bulk reductions.
// One warpgroup a CTA; thread 0 issues every copy and reduction. A ring slot holds a step's Q and dO
// (one barrier for both), then its fp32 dQ once every warp's products are done with them; step j + 1
// loads into step j - 1's slot at the top of step j, once that step's reductions have read it. The
// threads load step j + 1's statistics during step j into a ring of two. K and V stay for the walk.
#pragma once

#include "sparsejit/attention_backward_sm90_gather.cuh"  // attention_backward.cuh, tma.cuh, wgmma.cuh

namespace sjit_kernels {

template <class Cfg>
struct BackwardKeyBlockLayout {
  using Tr = BackwardTraits<Cfg>;
  static_assert(Cfg::sparsity != kDense && Cfg::pattern_block == 64 && Cfg::query_runs == 1,
                "path=wgmma_gather (dK/dV) with block=64: one pattern block of 64 keys a CTA");
  static_assert(Cfg::warps == 4 && Cfg::block_cols == 64 && Cfg::stages == 2,
                "path=wgmma_gather: one warpgroup, 64 queries a step, two ring slots");
  static_assert(Tr::head_dim == 64 || Tr::head_dim == 96 || Tr::head_dim == 128,
                "path=wgmma_gather: head_dim 64, 96 or 128");
  static constexpr int rows = 64, cols = 64;  // the block's keys; a step's queries
  static constexpr int tile_dim = swizzled_tile_cols(Tr::head_dim);
  static constexpr int tile_bytes = 64 * tile_dim * 2;  // 64 rows of one tensor
  static constexpr int slot_bytes = 2 * tile_bytes;     // a ring slot: a step's Q, then its dO
  // A step's fp32 dQ (atomic dQ), staged over its own slot once the products are done with it: boxes of
  // 32 columns x 64 rows (128-byte swizzled rows), one after the other.
  static constexpr int dq_box_bytes = 64 * 128, dq_boxes = (Tr::head_dim + 31) / 32;
  static_assert(dq_boxes * dq_box_bytes <= slot_bytes, "a step's dQ fits its slot");
  // Offsets from the aligned base (the tiles' multiples of 1 KB: swizzle atoms), then the statistics'
  // ring, the barriers (K and V's; each slot's) and the walk.
  static constexpr int k_tile = 0, v_tile = tile_bytes;
  static constexpr int ring = 2 * tile_bytes;
  static constexpr int ds_tile = ring + 2 * slot_bytes;  // dS^T: [keys][64 queries], a 128-byte row a key
  static constexpr int stats = ds_tile + rows * cols * 2;  // lse2 then delta of a step, two steps
  static constexpr int barriers = stats + 2 * 2 * cols * 4;
  static constexpr int kv_full = 0, slot_full = 1;
  static constexpr int walk = barriers + 8 * 3;
  static constexpr int used_bytes = walk + int(sizeof(QueryTileWalk<Cfg, cols>));
  static_assert(sizeof(QueryTileWalk<Cfg, cols>) <= 1024, "codegen's attention_backward_shared_bytes allows 1 KB for the walk");
  // dK and dV are staged through padded rows (store_rows) over the ring once the walk is done.
  static_assert(2 * rows * Tr::row_elems * 2 <= 2 * slot_bytes, "the output staging tiles fit the ring");
  static constexpr int ctas_per_sm = ctas_per_sm_by_shared(used_bytes, 2);
  static_assert(ctas_per_sm == 2, "two CTAs an SM: each covers the other's element-wise steps");
};

template <class Cfg>
__global__ void __launch_bounds__(128, BackwardKeyBlockLayout<Cfg>::ctas_per_sm)
    attention_backward_dkdv_sm90_key_block(const AttentionBackwardParams p,
                                           const __grid_constant__ AttentionBackwardTensorMaps maps) {
  using Tr = BackwardTraits<Cfg>;
  using L = BackwardKeyBlockLayout<Cfg>;
  using T = typename Tr::T;
  using Step = PackedQueries<L::cols, 1>;
  constexpr int R = L::rows, C = L::cols, D = Tr::head_dim;
  extern __shared__ __align__(1024) unsigned char shared_bwd_key_block[];
  unsigned char* smem = swizzle_aligned_shared(shared_bwd_key_block, L::used_bytes);
  const unsigned base = smem_address(smem);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  QueryTileWalk<Cfg, C>& walk = *reinterpret_cast<QueryTileWalk<Cfg, C>*>(smem + L::walk);
  float* lse2_ring = reinterpret_cast<float*>(smem + L::stats);
  float* delta_ring = lse2_ring + 2 * C;
  auto barrier = [&](int i) { return base + L::barriers + 8 * i; };

  const KeyTileOwner own = key_tile_owner<Cfg>(p, R);
  if (own.key0 >= p.seq_k) return;  // a schedule item past the end of a short key sequence
  // K and V load before the walk is built (a chain of dependent loads of the schedule), wherever a
  // query may see the block under causality; a pattern column found empty later waits for them anyway.
  const bool loads_kv = QueryTileWalk<Cfg, C>::first_query_tile(p, own, C) < (p.seq_q + C - 1) / C;
  static_assert(L::kv_full == 0, "K and V's barrier comes first");
  request_block_kv<D, R>(barrier(0), loads_kv, base + L::k_tile, base + L::v_tile, L::tile_bytes, maps, own);
  // The query blocks of the pattern column, of every query head of the group (ends with a
  // __syncthreads, which also publishes the barriers).
  const int steps = walk.build(p, own, C);
  auto step_at = [&](int j) { return locate_packed<C, 1, 1>(walk, p, own, min(j, steps - 1), steps, false); };
  auto slot_at = [&](int j) { return base + L::ring + (j % 2) * L::slot_bytes; };
  auto load_step = [&](int j, const Step& t) {
    const unsigned full = barrier(L::slot_full + j % 2);
    mbarrier_expect_bytes(full, L::slot_bytes);
    tma_load_tile<D, C>(slot_at(j), maps.q, full, own.batch, t.head_q[0], t.q0[0]);
    tma_load_tile<D, C>(slot_at(j) + L::tile_bytes, maps.d_o, full, own.batch, t.head_q[0], t.q0[0]);
  };
  // A step's statistics: thread i < 64 loads query i's (in flight during the step before), then stores
  // them into the step's half of the ring.
  auto load_stats = [&](const Step& t) {
    return threadIdx.x < C ? row_stats(p, own.batch, t.head_q[0], t.q0[0] + threadIdx.x) : RowStats{0.f, 0.f};
  };
  auto store_stats = [&](int j, const RowStats& s) {
    if (threadIdx.x < C) lse2_ring[(j % 2) * C + threadIdx.x] = s.lse2, delta_ring[(j % 2) * C + threadIdx.x] = s.delta;
  };
  Step t, t_next;
  if (steps > 0) {
    t = step_at(0), t_next = step_at(1);
    store_stats(0, load_stats(t));
  }
  if (threadIdx.x == 0 && steps > 0) load_step(0, t);
  if (threadIdx.x == 0 && steps > 1) load_step(1, t_next);

  float dk[1][D / 8][4], dv[1][D / 8][4];  // this warp's 16 keys x all dims
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[0][dt][e] = dv[0][dt][e] = 0.f;
  const int warp_row0 = 16 * warp;
  if (loads_kv) mbarrier_wait(barrier(L::kv_full), 0);  // (a CTA must not end with its copies in flight)
  named_barrier_sync<1, 128>();  // step 0's statistics are stored

  for (int j = 0; j < steps; ++j) {
    const unsigned q_slot = slot_at(j), do_slot = q_slot + L::tile_bytes;
    const Step t_after = step_at(j + 2);  // in flight during the step
    const RowStats stats_next = load_stats(t_next);
    // The slot of step j + 1 takes its queries once step j - 1's reductions have read its dQ there.
    if (threadIdx.x == 0 && j >= 1 && j + 1 < steps) {
      if constexpr (Cfg::atomic_dq) bulk_wait_read();
      load_step(j + 1, t_next);
    }
    mbarrier_wait(barrier(L::slot_full + j % 2), (j / 2) & 1);
    const float* lse2 = lse2_ring + (j % 2) * C;
    const float* delta = delta_ring + (j % 2) * C;

    // S^T = K Q^T and dP^T = V dO^T: the block's keys as rows, the step's queries as columns.
    float s[1][Tr::n_tiles][4], ds[1][Tr::n_tiles][4];
    wgmma_fence();
    wgmma_ss_steps<T, C, Tr::k_steps>(s[0], base + L::k_tile, R, q_slot);
    wgmma_commit();
    wgmma_ss_steps<T, C, Tr::k_steps>(ds[0], base + L::v_tile, R, do_slot);
    wgmma_commit();
    wgmma_wait<1>();
    wgmma_fence_operands(s[0]);
    // Masks: keys past Sk, queries past Sq, the causal edge (a step is one active pattern block).
    if (backward_tile_needs_mask<Cfg>(p, t, own.key0, R)) mask_backward_tile<Cfg, true>(s, p, own.key0, t, warp_row0, t.mask);
    probabilities_from_scores<Tr>(s, lse2, p.scale_log2);
    wgmma_wait<0>();
    wgmma_fence_operands(ds[0]);
    score_gradients<Tr>(ds, s, delta);
    unsigned pa[C / 16][4], dsa[C / 16][4];  // P^T and dS^T as the A fragments of C / 16 k-steps
#pragma unroll
    for (int kk = 0; kk < C / 16; ++kk) {
      pack_a_fragment<T>(s[0], kk, pa[kk]);
      pack_a_fragment<T>(ds[0], kk, dsa[kk]);
    }
    if constexpr (Cfg::atomic_dq) {
      // dS^T into its tile (the previous step's dQ product that read it is done: every warp waited for
      // it before the last barrier), for dQ = dS K, which needs all 64 keys' rows.
#pragma unroll
      for (int nt = 0; nt < Tr::n_tiles; ++nt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int key = warp_row0 + lane / 4 + h * 8, query = nt * 8 + 2 * (lane % 4);
          *reinterpret_cast<unsigned*>(smem + L::ds_tile + swizzled_offset(R, key, query)) = dsa[nt / 2][(nt % 2) * 2 + h];
        }
      fence_proxy_async();
      named_barrier_sync<1, 128>();
    }

    // dV += P^T dO and dK += dS^T Q (scaled at the end), dO and Q read transposed.
    wgmma_fence();  // pa and dsa written by ordinary instructions
    wgmma_fence_operands(dk[0]);
    wgmma_fence_operands(dv[0]);
    wgmma_rs_steps<T, D, C / 16>(dv[0], pa, do_slot, C);
    wgmma_rs_steps<T, D, C / 16>(dk[0], dsa, q_slot, C);
    wgmma_commit();
    // Atomic dQ: dQ = dS K for 64 queries x 64 dims a product (d = 96: the second's dims 96 .. 127 are
    // K's zero padding, dropped), A = dS (M-major: stored by key), B = K (N-major).
    constexpr int dq_blocks = (D + 63) / 64;
    float dq[dq_blocks][8][4];
    if constexpr (Cfg::atomic_dq) {
#pragma unroll
      for (int b = 0; b < dq_blocks; ++b)
#pragma unroll
        for (int kk = 0; kk < R / 16; ++kk)
          wgmma_ss_transposed<T>(dq[b], nmajor_descriptor(base + L::ds_tile, R, kk),
                                 nmajor_descriptor(base + L::k_tile + b * R * 128, R, kk), kk > 0);
      wgmma_commit();
    }
    wgmma_wait<0>();
    wgmma_fence_operands(dk[0]);
    wgmma_fence_operands(dv[0]);
    wgmma_fence_operands(pa);
    wgmma_fence_operands(dsa);
    store_stats(j + 1, stats_next);
    if constexpr (Cfg::atomic_dq) {
#pragma unroll
      for (int b = 0; b < dq_blocks; ++b) wgmma_fence_operands(dq[b]);
    }
    named_barrier_sync<1, 128>();  // every warp's products of the step are done with its slot
    if constexpr (Cfg::atomic_dq) {
      // The step's dQ over its slot, then added to the accumulator 32 dims at a time.
      stage_step_dq<dq_blocks, L::dq_boxes>(smem + (q_slot - base), dq);
      fence_proxy_async();
      named_barrier_sync<1, 128>();
      if (threadIdx.x == 0) {
#pragma unroll
        for (int box = 0; box < L::dq_boxes; ++box)
          tma_reduce_add_4d(maps.dq_accum, q_slot + box * L::dq_box_bytes, 32 * box, t.q0[0], t.head_q[0], own.batch);
        bulk_commit();
      }
    }
    t = t_next, t_next = t_after;
  }

  // dK (scaled) and dV, staged through padded rows over the ring (no copy or product uses it any more).
  if (threadIdx.x == 0) bulk_wait_done();  // (the reductions' reads of shared memory too)
  named_barrier_sync<1, 128>();
  T* staging = reinterpret_cast<T*>(smem + L::ring);
  T* dk_out = static_cast<T*>(p.dk) + own.batch * p.dk_batch_stride + own.kv_head * p.dk_head_stride;
  T* dv_out = static_cast<T*>(p.dv) + own.batch * p.dv_batch_stride + own.kv_head * p.dv_head_stride;
  store_rows<Tr>(dk, p.scale, staging, dk_out, p.dk_row_stride, own.key0, p.seq_k, warp_row0);
  store_rows<Tr>(dv, 1.f, staging + R * Tr::row_elems, dv_out, p.dv_row_stride, own.key0, p.seq_k, warp_row0);
}

}  // namespace sjit_kernels

// Attention backward on Hopper (sm_90a), deterministic dQ: the dQ pass of attention_backward.cuh (one
// CTA a query tile walks the key tiles the forward's schedule gives it, the same masks and order, no
// atomics) with its three tile products on wgmma.
//
// A CTA owns 128 queries; warpgroup g takes rows 64g .. 64g + 63 (warp w rows 16w .. 16w + 15, as on
// the mma.sync path, so masks and stores are shared). Q and dO stay in shared memory for the whole
// walk, and each thread's two rows' lse2 and delta in registers. For each key tile (Cfg::block_cols
// keys: 128 at d = 128, where S and dP then read Q and dO once for 128 keys instead of twice; 64 at
// d = 64 or with narrower pattern blocks):
//   1. S = Q K^T and dP = dO V^T: Q and dO rows as A, the K and V tiles as B, all K-major, in two
//      wgmma groups (P = exp2(..) runs while dP computes);
//   2. in registers: the mask where the tile needs one, P = exp2(S scale log2 e - lse2) and
//      dS = P (dP - delta), packed as A fragments;
//   3. dQ += dS K (scaled at the end): A from registers, K read transposed (N-major), as the
//      forward's O += P V reads V.
// At d = 256 (Cfg::warps = 4: 64 queries a CTA) both warpgroups take the CTA's 64 queries and half the
// head dims of dQ each, as the dK/dV pass does at d = 256 (a warpgroup's dQ of 64 x 256 would hold 128
// registers a thread, leaving too few for S, dP and dS): warpgroup 0 computes S and P and hands P over
// in shared memory, warpgroup 1 computes dP and dS and hands dS back, and each adds its 64 x 128 share
// of dQ += dS K.
// With three or more ring slots, dQ += dS K of tile j - 1 runs under the element-wise steps of tile j
// (its K slot stays in use one tile longer). Thread 0 issues every copy (TMA); one CTA barrier a tile
// tells it that both warpgroups are done with the slot it refills, as in the forward's wgmma kernel.
// At d = 256 instead a third warpgroup gives its registers to the math warps (setmaxnreg) and one of
// its threads fills the ring, refilling a slot once the eight math warps have arrived on its "empty"
// mbarrier, so that no math thread issues a copy or meets the others but for the hand-overs (3-4% faster
// dense on the H100). At d = 64 that lost 10% (two CTAs an SM of 123 registers a thread without it:
// one's exponentials already run under the other's products), and at d = 128 it gained nothing.
#pragma once

#include "sparsejit/attention_backward.cuh"
#include "sparsejit/attention_forward_sm90.cuh"  // tma.cuh, wgmma.cuh
#include "sparsejit/backward_warp_roles.cuh"
#include "sparsejit/warpgroup_hand_over.cuh"

namespace sjit_kernels {

template <class Cfg>
struct BackwardDqSm90Layout : BackwardWarpRoles {
  using Tr = BackwardTraits<Cfg>;
  static_assert(((Tr::head_dim == 64 || Tr::head_dim == 96 || Tr::head_dim == 128) && Cfg::warps == 8 &&
                 (Tr::block_n == 64 || Tr::block_n == 128)) ||
                    (Tr::head_dim == 256 && Cfg::warps == 4 && Tr::block_n == 64),
                "wgmma dQ: head_dim 64, 96 or 128 with 8 warps (128 queries) and 64- or 128-key tiles, or 256 with "
                "4 warps (64 queries) and 64-key tiles");
  // The two warpgroups split the CTA's queries (64 each) or, at d = 256, the head dims (see above).
  static constexpr int query_groups = Cfg::warps / 4, dim_groups = 2 / query_groups;
  static constexpr int own_dims = Tr::head_dim / dim_groups;  // the dims of a warpgroup's dQ
  // The copy warp's warpgroup at d = 256 (above; backward_warp_roles.cuh).
  static constexpr bool copy_warp_ring = dim_groups == 2;
  static constexpr int threads = math_threads + (copy_warp_ring ? helper_threads : 0);
  static_assert(!copy_warp_ring || Cfg::stages == 2, "the copy warp's ring: a slot is free once its tile is done");
  static constexpr int rows = Tr::block_rows, cols = Tr::block_n;
  // Tiles in whole 64-column swizzle blocks: at d = 96 as at 128, columns 96 .. 127 zero-filled by the
  // copies and read by no product (S and dP take 6 k-steps, dQ += dS K is 64 x 96).
  static constexpr int tile_dim = swizzled_tile_cols(Tr::head_dim);
  static constexpr int own_bytes = rows * tile_dim * 2;    // the Q and dO tiles
  static constexpr int other_bytes = cols * tile_dim * 2;  // one K or V slot
  static constexpr int q_tile = 0, do_tile = own_bytes;        // offsets from the 1024-aligned base
  static constexpr int k_ring = 2 * own_bytes;
  static constexpr int v_ring = k_ring + Cfg::stages * other_bytes;
  // At d = 256 the hand-over between the warpgroups (warpgroup_hand_over.cuh).
  static constexpr int hand_over = v_ring + Cfg::stages * other_bytes;
  using HandOver = WarpgroupHandOver<Tr::n_tiles, cols / 16>;
  static_assert(HandOver::threads == math_threads, "the hand-over's barriers count the math warps");
  static constexpr int stats = hand_over + (dim_groups == 2 ? HandOver::p_bytes + HandOver::ds_bytes : 0);  // lse2, delta
  // mbarriers: Q and dO's, a full one per ring slot, then with the copy warp an empty one per slot.
  static constexpr int barriers = stats + 2 * rows * 4;
  static constexpr int used_bytes = barriers + 8 * ((copy_warp_ring ? 2 : 1) * Cfg::stages + 1);
  // dQ is staged through padded rows (store_rows) over Q and dO once the walk is done.
  static_assert(rows * Tr::row_elems * 2 <= k_ring, "the dQ staging tile must fit over Q and dO");
};

// Whether warpgroup `group`'s 64 queries of a tile may see any of its keys from key0: one of
// their pattern blocks is active (a tile's bits split by warpgroup where blocks are 64 rows or fewer),
// they start before the query sequence's end, and (causal) the tile's first key is not past their
// last query.
template <class Cfg>
__device__ __forceinline__ bool warpgroup_queries_active(const AttentionBackwardParams& p, int group, int q0, int key0,
                                                         unsigned long long pattern_mask) {
  using Tr = BackwardTraits<Cfg>;
  const int first_query = q0 + group * 64;
  if (first_query >= p.seq_q) return false;
  if constexpr (Cfg::causal != kNotCausal) {
    const int offset = Cfg::causal == kCausalBottomRight ? p.seq_k - p.seq_q : 0;
    if (key0 > first_query + 63 + offset) return false;
  }
  if constexpr (Tr::group_rows <= 64)
    if (pattern_mask != kWholeTile && (pattern_mask & warpgroup_mask_bits<Cfg>(group)) == 0) return false;
  return true;
}

template <class Cfg>
__global__ void __launch_bounds__(BackwardDqSm90Layout<Cfg>::threads, 1)
    attention_backward_dq_sm90(const AttentionBackwardParams p, const __grid_constant__ AttentionBackwardTensorMaps maps) {
  using Tr = BackwardTraits<Cfg>;
  using L = BackwardDqSm90Layout<Cfg>;
  using T = typename Tr::T;
  constexpr int R = L::rows, C = L::cols, D = Tr::head_dim, stages = Cfg::stages;
  extern __shared__ __align__(1024) unsigned char shared_dq_sm90[];
  unsigned char* smem = swizzle_aligned_shared(shared_dq_sm90, L::used_bytes);
  const unsigned base = smem_address(smem);

  const QueryTileWork work = query_tile_work<Cfg, R, C>(p);
  if (work.q0 >= p.seq_q) return;
  const int count = work.count, kv_head = work.head_q / (p.heads_q / p.heads_kv);
  const unsigned own_ready = base + L::barriers;
  auto slot_ready = [&](int slot) { return own_ready + 8 * (1 + slot); };
  auto slot_empty = [&](int slot) { return own_ready + 8 * (1 + stages + slot); };
  auto k_tile = [&](int slot) { return base + L::k_ring + slot * L::other_bytes; };
  auto v_tile = [&](int slot) { return base + L::v_ring + slot * L::other_bytes; };

  // The j-th key tile of the walk into ring slot j % stages, K and V counted into the slot's barrier,
  // whose phase flips once per use of the slot.
  auto load_key_tile = [&](int j) {
    const int slot = j % stages, key0 = work.key_tile(j) * C;
    mbarrier_expect_bytes(slot_ready(slot), 2 * L::other_bytes);
    tma_load_tile<D, C>(k_tile(slot), maps.k, slot_ready(slot), work.batch, kv_head, key0);
    tma_load_tile<D, C>(v_tile(slot), maps.v, slot_ready(slot), work.batch, kv_head, key0);
  };
  // Loads run `ahead` tiles ahead: with overlap the slot of tile j - 1 is still read while tile j
  // computes, so stages - 2 slots are free to load into (as in the forward).
  constexpr bool overlap = stages >= 3;
  constexpr int ahead = overlap ? stages - 2 : 1;
  if (threadIdx.x == 0) {
    if constexpr (L::copy_warp_ring)
      for (int slot = 0; slot < stages; ++slot) mbarrier_init(slot_empty(slot), L::math_warps);
    init_copy_barriers(own_ready, stages + 1);
    if (count > 0) {  // a tile with no key tile loads nothing: its dQ is 0
      mbarrier_expect_bytes(own_ready, 2 * L::own_bytes);
      tma_load_tile<D, R>(base + L::q_tile, maps.q, own_ready, work.batch, work.head_q, work.q0);
      tma_load_tile<D, R>(base + L::do_tile, maps.d_o, own_ready, work.batch, work.head_q, work.q0);
    }
    if constexpr (!L::copy_warp_ring)
      for (int j = 0; j < ahead && j < count; ++j) load_key_tile(j);
  }
  float* lse2_rows = reinterpret_cast<float*>(smem + L::stats);
  float* delta_rows = lse2_rows + R;
  load_row_stats<R, L::threads>(lse2_rows, delta_rows, p, work.batch, work.head_q, work.q0);
  __syncthreads();  // the barriers are initialized and the statistics written before anyone reads them
  if constexpr (L::copy_warp_ring) {
    if (threadIdx.x >= L::math_threads) {
      warpgroup_release_registers<L::helper_registers>();
      // The copy thread: key tile j into slot j % stages once every math warp is done with tile
      // j - stages there. The other helper threads have nothing to do.
      if (threadIdx.x == L::copy_warp * 32)
        for (int j = 0; j < count; ++j) {
          if (j >= stages) mbarrier_wait(slot_empty(j % stages), (j / stages - 1) & 1);
          load_key_tile(j);
        }
      return;
    }
    warpgroup_claim_registers<L::math_registers>();
  }

  // Where a pattern splits tiles between the warpgroups, the warp index is read from lane 0, so that
  // ptxas knows the branch on the warpgroup (below) is the same in every lane (C7520).
  constexpr bool may_skip = L::query_groups == 2 && Tr::group_rows <= 64 && !overlap;
  const int warp = may_skip ? __shfl_sync(0xffffffffu, threadIdx.x / 32, 0) : threadIdx.x / 32;
  // The warpgroup's queries (query_group: at d = 256 both take the CTA's 64) and the first of its dims.
  const int group = warp / 4, query_group = L::query_groups == 2 ? group : 0;
  const int dim0 = L::dim_groups == 2 ? group * L::own_dims : 0;
  const int lane = threadIdx.x % 32, warp_row0 = (L::query_groups == 2 ? warp : warp % 4) * 16;
  // A thread's accumulator elements lie on two rows: lane / 4 and lane / 4 + 8 of its warp's 16.
  const float lse2[2] = {lse2_rows[warp_row0 + lane / 4], lse2_rows[warp_row0 + lane / 4 + 8]};
  const float delta[2] = {delta_rows[warp_row0 + lane / 4], delta_rows[warp_row0 + lane / 4 + 8]};
  // This warpgroup's 64 rows of the Q and dO tiles, as K-major A operands.
  const unsigned q_rows = base + L::q_tile + query_group * 64 * 128, do_rows = base + L::do_tile + query_group * 64 * 128;
  // Its dims of the K slots, read transposed (N-major) by dQ += dS K: 64-column blocks of C rows.
  const unsigned own_cols = (dim0 / 64) * C * 128;
  float dq[1][L::own_dims / 8][4];
#pragma unroll
  for (int dt = 0; dt < L::own_dims / 8; ++dt) dq[0][dt][0] = dq[0][dt][1] = dq[0][dt][2] = dq[0][dt][3] = 0.f;
  unsigned dsa[C / 16][4];  // dS as the A fragments of C / 16 k-steps
  auto issue_dq = [&](int slot) {  // dQ += dS K of the K tile in `slot`, not yet committed
    wgmma_rs_steps<T, L::own_dims, C / 16>(dq[0], dsa, k_tile(slot) + own_cols, C);
  };
  // The same, committed and waited for: dQ and dS may be read and written again after it.
  auto add_dq = [&](int slot) {
    wgmma_fence();  // dsa written by ordinary instructions
    wgmma_fence_operands(dq[0]);
    issue_dq(slot);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_operands(dq[0]);
    wgmma_fence_operands(dsa);
  };

  if (count > 0) mbarrier_wait(own_ready, 0);
  int previous = 0;  // tile j - 1's slot
  for (int j = 0; j < count; ++j) {
    if constexpr (!L::copy_warp_ring) {
      __syncthreads();  // every warpgroup is done with the slot thread 0 refills now
      if (threadIdx.x == 0 && j + ahead < count) load_key_tile(j + ahead);
    }
    const int slot = j % stages;
    mbarrier_wait(slot_ready(slot), (j / stages) & 1);

    const int key0 = work.key_tile(j) * C;
    const unsigned long long mask = work.mask(j);
    // Where this warpgroup's 64 queries see none of the tile's keys (pattern blocks of 64 rows or
    // fewer split a tile between the warpgroups), it skips the tile. The tile's work comes in two
    // copies, chosen once, as in the dK/dV pass (attention_backward_sm90.cuh: so that ptxas serializes
    // no wgmma), only where blocks split tiles and without the overlap's products across tiles.
    auto walk_tile = [&](auto queries) {
      if constexpr (decltype(queries)::value) {
        float s[1][Tr::n_tiles][4], ds[1][Tr::n_tiles][4];  // S, and dP then dS: this warp's queries x the tile's keys
        wgmma_fence();  // dsa and dq written by ordinary instructions
        wgmma_ss_steps<T, C, Tr::k_steps>(s[0], q_rows, R, k_tile(slot));
        wgmma_commit();
        wgmma_ss_steps<T, C, Tr::k_steps>(ds[0], do_rows, R, v_tile(slot));
        wgmma_commit();
        // With overlap, tile j - 1's dQ += dS K behind this tile's products: a third group, empty at
        // j = 0, so that every tile waits for the same counts. (Waits that depended on j made ptxas
        // serialize every wgmma of the kernel: it could not tell which group a wait completes.)
        if constexpr (overlap) {
          wgmma_fence_operands(dq[0]);
          if (j > 0) issue_dq(previous);
          wgmma_commit();
          wgmma_wait<2>();
        } else {
          wgmma_wait<1>();
        }
        wgmma_fence_operands(s[0]);

        if (backward_tile_needs_mask<Cfg>(p, work.q0, R, key0, C, mask))
          mask_backward_tile<Cfg, false>(s, p, work.q0, key0, warp_row0, mask);
        probabilities_from_row_scores<Tr>(s, lse2, p.scale_log2);
        if constexpr (overlap) {
          wgmma_wait<1>();
        } else {
          wgmma_wait<0>();
        }
        wgmma_fence_operands(ds[0]);
#pragma unroll
        for (int nt = 0; nt < Tr::n_tiles; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) ds[0][nt][e] = s[0][nt][e] * (ds[0][nt][e] - delta[e / 2]);
        if constexpr (overlap) {  // tile j - 1's product has read dsa: it may be overwritten
          wgmma_wait<0>();
          wgmma_fence_operands(dq[0]);
          wgmma_fence_operands(dsa);
        }
#pragma unroll
        for (int kk = 0; kk < C / 16; ++kk) pack_a_fragment<T>(ds[0], kk, dsa[kk]);
        if constexpr (!overlap) add_dq(slot);
      }
    };
    // d = 256: S (warpgroup 0) or dP (warpgroup 1) over all 256 dims, one product each, P handed one
    // way and dS the other, then each warpgroup's dims of dQ. The products are issued outside any
    // branch on the warpgroup (only their operands differ). (Generic, so that kernels of other head
    // dims do not compile it.)
    auto walk_tile_by_roles = [&](auto) {
      float s[1][Tr::n_tiles][4];  // S then P (warpgroup 0), or dP then dS (warpgroup 1)
      const typename L::HandOver share(smem + L::hand_over);
      wgmma_fence();  // dsa and dq written by ordinary instructions
      wgmma_ss_steps<T, C, Tr::k_steps>(s[0], group == 0 ? q_rows : do_rows, R, group == 0 ? k_tile(slot) : v_tile(slot));
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_fence_operands(s[0]);
      if (group == 0) {
        if (backward_tile_needs_mask<Cfg>(p, work.q0, R, key0, C, mask))
          mask_backward_tile<Cfg, false>(s, p, work.q0, key0, warp_row0, mask);
        probabilities_from_row_scores<Tr>(s, lse2, p.scale_log2);
        share.send_p(s[0]);
      } else {
        share.wait_for_p();
#pragma unroll
        for (int nt = 0; nt < Tr::n_tiles; ++nt) {
          const float4 v = share.p_chunk(nt);
          const float pt[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
          for (int e = 0; e < 4; ++e) s[0][nt][e] = pt[e] * (s[0][nt][e] - delta[e / 2]);
        }
#pragma unroll
        for (int kk = 0; kk < C / 16; ++kk) pack_a_fragment<T>(s[0], kk, dsa[kk]);
        share.put_ds(dsa);
      }
      share.take_ds(dsa);
      add_dq(slot);
    };
    if constexpr (L::dim_groups == 2) {
      walk_tile_by_roles(0);
      __syncwarp();
      if (threadIdx.x % 32 == 0) mbarrier_arrive(slot_empty(slot));  // this warp's products are done with it
    } else {
      if (!may_skip || warpgroup_queries_active<Cfg>(p, group, work.q0, key0, mask)) walk_tile(WarpgroupActive<true>{});
      else walk_tile(WarpgroupActive<false>{});
    }
    previous = slot;
  }
  if (overlap && count > 0) add_dq(previous);

  // Every product is done with Q and dO, which dQ is staged over.
  if constexpr (L::copy_warp_ring) named_barrier(L::math_barrier, L::math_threads);
  else __syncthreads();
  T* dq_out = static_cast<T*>(p.dq) + work.batch * p.dq_batch_stride + work.head_q * p.dq_head_stride;
  // At d = 256 the two warps of a row slice each store their dims of it.
  store_rows<Tr, L::own_dims>(dq, p.scale, reinterpret_cast<T*>(smem) + dim0, dq_out + dim0, p.dq_row_stride, work.q0,
                              p.seq_q, warp_row0);
}

}  // namespace sjit_kernels

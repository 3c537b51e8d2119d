// Attention forward on Hopper (sm_90a): the same work items, tile schedule, masks and online softmax as
// attention_forward.cuh, with the two matrix products on wgmma instead of mma.sync.
//
// A CTA is Cfg::warps / 4 warpgroups; warpgroup g owns query rows 64g .. 64g + 63 of the CTA's tile
// (warp w owns rows 16w .. 16w + 15, as on the mma.sync path with one 16-row tile a warp, so the
// mask, softmax and output code is shared). For each key tile of the CTA's list:
//   1. S = Q K^T: head_dim / 16 wgmma k-steps, Q and K both read from shared memory;
//   2. the element mask where the tile needs one, and the online softmax (exp2 domain), in registers;
//   3. O += P V: block_n / 16 wgmma k-steps with P from registers (the accumulator layout of S is the
//      A fragment layout) and V from shared memory, transposed by the instruction.
// Q, K and V tiles live in the 128-byte swizzle of the wgmma descriptors (see wgmma.cuh). They arrive
// by bulk tensor copies (TMA, tma.cuh) that thread 0 issues, each ring slot with an mbarrier that
// counts the tile's bytes; one CTA barrier per tile tells thread 0 that every warpgroup is done with
// the slot it refills.
//
// The per-warpgroup part (WarpgroupRows: the products, mask, softmax and the walk over one item's
// tiles) is shared with the persistent, warp-specialized kernel of attention_forward_sm90_ws.cuh;
// each kernel passes the walk its own way of handing tiles over (a Feed).
#pragma once

#include "sparsejit/attention_forward.cuh"
#include "sparsejit/tma.cuh"
#include "sparsejit/wgmma.cuh"

namespace sjit_kernels {

template <class Cfg>
struct AttentionSm90Layout {
  using Tr = AttentionForwardTraits<Cfg>;
  static_assert(Cfg::m_tiles == 1, "wgmma path: each warp owns one 16-row slice of its warpgroup's 64 rows");
  static_assert(Cfg::warps % 4 == 0, "wgmma path: whole warpgroups");
  static_assert(Tr::head_dim == 64 || Tr::head_dim == 96 || Tr::head_dim == 128 || Tr::head_dim == 256,
                "wgmma path: head_dim 64, 96, 128 or 256");
  // 16- and 32-key tiles serve pattern blocks of 16 and 32 (a tile one key block wide).
  static_assert(Tr::block_n == 16 || Tr::block_n == 32 || Tr::block_n == 64 || Tr::block_n == 128,
                "wgmma path: block_n 16, 32, 64 or 128");
  // Tiles are whole 64-column swizzle blocks: at d = 96 the second block's last 32 columns are zeros
  // (the copies fill them), which S = Q K^T never reads (its k-steps stop at d) and O += P V does not
  // write (its N is d).
  static constexpr int tile_dim = swizzled_tile_cols(Tr::head_dim);
  static constexpr int q_bytes = Tr::block_m * tile_dim * 2;
  static constexpr int kv_bytes = Tr::block_n * tile_dim * 2;
  static constexpr int k_ring = q_bytes;                           // offsets from the aligned base
  static constexpr int v_ring = q_bytes + Cfg::stages * kv_bytes;
  static constexpr int barriers = q_bytes + 2 * Cfg::stages * kv_bytes;  // Q's, then one per ring slot
  static constexpr int used_bytes = barriers + 8 * (Cfg::stages + 1);
  // Two CTAs of two warpgroups an SM when their shared memory fits (228 KB an SM, 1 KB of it reserved
  // per CTA): one CTA's loads of Q and its first tiles, and its output stores, then overlap the other's
  // math, which short work items (sparse rows) need. The price is a cap of 128 registers a thread,
  // which 64-key tiles fit (S is 32 floats a thread; 128-key tiles spill).
  static constexpr int ctas_per_sm =
      Tr::threads == 256 && Tr::block_n == 64 && 2 * (1024 + used_bytes + 1024) <= 228 * 1024 ? 2 : 1;
  // The output is staged through padded rows (store_output) over the same memory once the loop is done.
  static_assert(Tr::block_m * Tr::row_elems * 2 <= used_bytes, "the output staging tile must fit");
};

// Where key tile j of a walk lies: its first key, and which of its pattern blocks are active.
struct TileRef {
  int key0;
  unsigned long long pattern_mask;
};

// One warpgroup's 64 query rows of a work item: the running output and softmax statistics, and the
// walk over the item's key tiles with both products on wgmma. The kernels differ only in how a tile's
// K and V arrive and how a ring slot is handed back, which they pass in as a Feed:
//   overlap             whether P V of tile j - 1 runs under the softmax of tile j;
//   acquire_k(j)        waits until tile j's K is in shared memory and returns its ring slot;
//   tile(j, slot)       the TileRef of tile j (read before release_k, after which the slot may refill);
//   acquire_v(j, slot)  waits until tile j's V is in shared memory;
//   release_k(slot)     the warpgroup's S = Q K^T is done with the slot's K, release_v with its V;
//   begin_turn(), end_turn()  around the products of one step: where two warpgroups take turns;
//   defer_last          whether the walk leaves its last P V to the caller (issue_last_values, its V
//                       slot still held), which overlaps the item's output with the next item's first
//                       S. The caller issues it before the next walk (in a loop over items: at the top
//                       of the next iteration, so no product runs across the loop's back edge, where
//                       ptxas would serialize every wgmma, C7514).
//   scores_cover_first  whether on_first_scores runs under the first S = Q K^T, in the warpgroup's
//                       turn, or once the turn is handed over (see the walk).
//   early_second_scores whether an item of two tiles or more issues S of both in its first turn (see
//                       the walk; needs defer_last).
// on_first_scores() runs once the first S = Q K^T is issued; it must not touch o (the caller reads an
// earlier walk's output before calling walk). With defer_last the walk resets the output and
// statistics itself, after its first S.
template <class Cfg>
struct WarpgroupRows {
  using Tr = AttentionForwardTraits<Cfg>;
  using L = AttentionSm90Layout<Cfg>;
  using T = typename Tr::T;
  float o[1][Tr::d_tiles][4];
  float row_max[1][2], row_sum[1][2], correction[1][2];
  float s[1][Tr::n_tiles][4];
  // S of an item's tile 0 where the walk issues tiles 0 and 1 together (Feed::early_second_scores;
  // tile 1's goes to s): o where it has the shape, whose registers hold nothing then (P V of tile 0
  // overwrites them once P is packed), else registers of its own, which fit beside o only at d <= 64
  // (d = 96 with 128-key tiles spills).
  static constexpr bool early_second_fits = Tr::head_dim == Tr::block_n || Tr::head_dim <= 64;
  float s_first_own[1][Tr::head_dim == Tr::block_n ? 1 : Tr::n_tiles][4];
  __device__ __forceinline__ auto& first_scores() {
    if constexpr (Tr::head_dim == Tr::block_n)
      return o;
    else
      return s_first_own;
  }
  unsigned pa[Tr::block_n / 16][4];  // P of one tile as the A fragments of block_n / 16 k-steps

  __device__ __forceinline__ void reset() {
#pragma unroll
    for (int dt = 0; dt < Tr::d_tiles; ++dt) o[0][dt][0] = o[0][dt][1] = o[0][dt][2] = o[0][dt][3] = 0.f;
    reset_statistics();
  }
  __device__ __forceinline__ void reset_statistics() {
    row_max[0][0] = row_max[0][1] = -infinity();
    row_sum[0][0] = row_sum[0][1] = 0.f;
  }

  // S = Q K^T of the K tile at shared address k_tile, issued (not waited for). q_rows: this
  // warpgroup's 64 rows of the Q tile, a K-major A operand.
  __device__ __forceinline__ void issue_scores(unsigned q_rows, unsigned k_tile) { issue_scores(s, q_rows, k_tile); }
  __device__ __forceinline__ void issue_scores(float (&scores)[1][Tr::n_tiles][4], unsigned q_rows, unsigned k_tile) {
    wgmma_ss_steps<T, Tr::block_n, Tr::k_steps>(scores[0], q_rows, Tr::block_m, k_tile);
    wgmma_commit();
  }
  // O += P V of the V tile at v_tile, issued.
  template <bool kOverwrite = false>
  __device__ __forceinline__ void issue_values(unsigned v_tile) {
    wgmma_rs_steps<T, Tr::head_dim, Tr::block_n / 16, kOverwrite>(o[0], pa, v_tile, Tr::block_n);
    wgmma_commit();
  }
  // Masks S of tile t where needed and turns it into P (correction set, o not yet rescaled).
  __device__ __forceinline__ void softmax_tile(const AttentionForwardParams& p, TileRef t, int q_row0, int warp_row0) {
    softmax_tile(s, p, t, q_row0, warp_row0);
  }
  __device__ __forceinline__ void softmax_tile(float (&scores)[1][Tr::n_tiles][4], const AttentionForwardParams& p,
                                               TileRef t, int q_row0, int warp_row0) {
    if (tile_needs_mask<Cfg>(p, q_row0, t.key0, t.pattern_mask))
      mask_tile<Cfg>(scores, p, q_row0, warp_row0, t.key0, t.pattern_mask);
    softmax_scores<Tr>(scores, row_max, row_sum, correction, p.scale_log2);
  }
  __device__ __forceinline__ void rescale_and_pack() { rescale_and_pack(s); }
  __device__ __forceinline__ void rescale_and_pack(const float (&scores)[1][Tr::n_tiles][4]) {
    rescale_output<Tr>(o, correction);
    pack(scores);
  }
  __device__ __forceinline__ void pack(const float (&scores)[1][Tr::n_tiles][4]) {
#pragma unroll
    for (int kk = 0; kk < Tr::block_n / 16; ++kk) pack_a_fragment<T>(scores[0], kk, pa[kk]);
  }

  // The item's `count` key tiles through this warpgroup; `ring` is the shared address of the K ring
  // (the V ring follows it). Feed is how the kernel hands tiles over (see the comment above the struct).
  // Returns the ring slot of the last tile's V where Feed::defer_last leaves its P V to the caller
  // (else -1).
  template <class Feed>
  __device__ __forceinline__ int walk(const AttentionForwardParams& p, int count, int q_row0, unsigned q_rows,
                                      unsigned ring, Feed& feed) {
    return walk(p, count, q_row0, q_rows, ring, feed, [] {});
  }
  template <class Feed, class OnFirstScores>
  __device__ __forceinline__ int walk(const AttentionForwardParams& p, int count, int q_row0, unsigned q_rows,
                                      unsigned ring, Feed& feed, OnFirstScores on_first_scores) {
    const int warp_row0 = (threadIdx.x / 32) * 16;
    auto k_tile = [&](int slot) { return ring + slot * L::kv_bytes; };
    auto v_tile = [&](int slot) { return v_tile_of(ring, slot); };
    static_assert(Feed::overlap || !Feed::defer_last, "a walk that leaves its last P V running overlaps its products");
    if constexpr (!Feed::overlap) {
      // S, softmax and O += P V one after the other.
      for (int j = 0; j < count; ++j) {
        const int slot = feed.acquire_k(j);
        wgmma_fence();
        issue_scores(q_rows, k_tile(slot));
        wgmma_wait<0>();
        wgmma_fence_operands(s[0]);
        const TileRef t = feed.tile(j, slot);
        feed.release_k(slot);
        softmax_tile(p, t, q_row0, warp_row0);
        rescale_and_pack();
        feed.acquire_v(j, slot);
        wgmma_fence();  // o rescaled and P written by ordinary instructions
        wgmma_fence_operands(o[0]);
        issue_values(v_tile(slot));
        wgmma_wait<0>();
        wgmma_fence_operands(o[0]);
        feed.release_v(slot);
      }
    } else {
      // FlashAttention-3's intra-warpgroup pipelining: while the tensor cores run O += P V of tile
      // j - 1, the warpgroup computes the softmax of tile j. The products of one step are issued in the
      // warpgroup's turn (the other warpgroup's softmax runs under them, where the feed alternates).
      int previous = 0;  // tile j - 1's slot
      int first_in_loop = 0;
      static_assert(!Feed::early_second_scores || Feed::defer_last, "the early second S: the walk resets its output");
      if constexpr (Feed::early_second_scores && early_second_fits) {
        // An item of two tiles or more issues S of tiles 0 and 1 in its first turn, and P V of tile 0
        // alone in its second: the softmax of tile 0 then runs under S of tile 1, and that of tile 1
        // under P V of tile 0, where the plain walk leaves the tensor cores with only the other
        // warpgroup's first S under its first softmax (docs/attention-log.md, "Landed: an item's first
        // two S in its first turn"). Tile 1's K is waited for in the turn: its slot was freed by the
        // previous item's last S, a softmax and a P V earlier, so it has (nearly) always landed.
        if (count >= 2) {
          auto& s_first = first_scores();
          const int slot0 = feed.acquire_k(0);
          feed.begin_turn();
          wgmma_fence();
          issue_scores(s_first, q_rows, k_tile(slot0));
          const int slot1 = feed.acquire_k(1);
          wgmma_fence();
          issue_scores(s, q_rows, k_tile(slot1));
          if constexpr (Feed::scores_cover_first) on_first_scores();  // under both products
          wgmma_wait<1>();  // S of tile 0; tile 1's still runs
          wgmma_fence_operands(s_first[0]);
          feed.end_turn();
          if constexpr (!Feed::scores_cover_first) on_first_scores();
          reset_statistics();
          const TileRef t0 = feed.tile(0, slot0);
          feed.release_k(slot0);
          softmax_tile(s_first, p, t0, q_row0, warp_row0);
          pack(s_first);  // P V of tile 0 then overwrites o (no rescale, no reset)
          feed.acquire_v(0, slot0);
          feed.begin_turn();
          wgmma_fence();
          wgmma_fence_operands(o[0]);
          issue_values<true>(v_tile(slot0));
          wgmma_wait<1>();  // S of tile 1 (issued before this P V)
          wgmma_fence_operands(s[0]);
          feed.end_turn();
          const TileRef t1 = feed.tile(1, slot1);
          feed.release_k(slot1);
          softmax_tile(s, p, t1, q_row0, warp_row0);
          wgmma_wait<0>();
          wgmma_fence_operands(o[0]);
          wgmma_fence_operands(pa);
          feed.release_v(slot0);
          rescale_and_pack(s);
          previous = slot1;
          first_in_loop = 2;
        }
      }
      for (int j = first_in_loop; j < count; ++j) {
        const int slot = feed.acquire_k(j);
        if (j > 0) feed.acquire_v(j - 1, previous);
        feed.begin_turn();
        wgmma_fence();
        wgmma_fence_operands(o[0]);
        issue_scores(q_rows, k_tile(slot));
        if (j > 0) issue_values(v_tile(previous));
        if (j > 0) {
          wgmma_wait<1>();  // S of tile j is ready; O += P V of tile j - 1 still runs
          wgmma_fence_operands(s[0]);
          feed.end_turn();
        } else {
          // S of tile 0 runs under on_first_scores, or the other warpgroup's products do once the
          // turn is handed over: the first is 1-2% faster where items are a few tiles, the second 2%
          // faster dense (Nsight Compute, docs/attention-log.md). Where o holds an earlier item's
          // output, it is reset only now: ptxas serializes every wgmma (C7514, C7515) where ordinary
          // instructions read or write an accumulator while one runs.
          if constexpr (Feed::scores_cover_first) on_first_scores();
          wgmma_wait<0>();
          wgmma_fence_operands(s[0]);
          feed.end_turn();
          if constexpr (!Feed::scores_cover_first) on_first_scores();
          if constexpr (Feed::defer_last) reset();
        }
        const TileRef t = feed.tile(j, slot);
        feed.release_k(slot);
        softmax_tile(p, t, q_row0, warp_row0);
        wgmma_wait<0>();
        wgmma_fence_operands(o[0]);
        wgmma_fence_operands(pa);
        if (j > 0) feed.release_v(previous);
        rescale_and_pack();
        previous = slot;
      }
      if (count > 0) {
        if constexpr (Feed::defer_last) return previous;
        issue_last_values(count, previous, ring, feed);
        wgmma_wait<0>();
        wgmma_fence_operands(o[0]);
        feed.release_v(previous);
      }
    }
    return -1;
  }
  // The walk's last O += P V (tile count - 1's V, in ring slot `slot`), issued in its own turn.
  template <class Feed>
  __device__ __forceinline__ void issue_last_values(int count, int slot, unsigned ring, Feed& feed) {
    feed.acquire_v(count - 1, slot);
    feed.begin_turn();
    wgmma_fence();
    wgmma_fence_operands(o[0]);
    issue_values(v_tile_of(ring, slot));
    feed.end_turn();
  }
  // The V tile of ring slot `slot`: the V ring follows the K ring at `ring`.
  static __device__ __forceinline__ unsigned v_tile_of(unsigned ring, int slot) {
    return ring + (Cfg::stages + slot) * L::kv_bytes;
  }
};

// The wgmma kernel's feed: one CTA barrier a tile, after which thread 0 refills the slot every
// warpgroup is done with (in `acquire`); K and V share a slot's barrier, and the warpgroups issue
// when they like.
template <class Cfg, class Acquire, class TileAt>
struct CtaBarrierFeed {
  static constexpr bool overlap = Cfg::stages >= 3, defer_last = false, scores_cover_first = true,
                        early_second_scores = false;
  Acquire acquire;  // acquire(j): the CTA barrier, thread 0's refill, the wait for tile j; its slot
  TileAt tile_at;   // tile_at(j): the TileRef of tile j
  __device__ __forceinline__ int acquire_k(int j) { return acquire(j); }
  __device__ __forceinline__ TileRef tile(int j, int) { return tile_at(j); }
  __device__ __forceinline__ void acquire_v(int, int) const {}
  __device__ __forceinline__ void release_k(int) const {}
  __device__ __forceinline__ void release_v(int) const {}
  __device__ __forceinline__ void begin_turn() const {}
  __device__ __forceinline__ void end_turn() const {}
};
template <class Cfg, class Acquire, class TileAt>
__device__ __forceinline__ CtaBarrierFeed<Cfg, Acquire, TileAt> cta_barrier_feed(Acquire acquire, TileAt tile_at) {
  return {acquire, tile_at};
}

template <class Cfg>
__global__ void __launch_bounds__(AttentionForwardTraits<Cfg>::threads, AttentionSm90Layout<Cfg>::ctas_per_sm)
    attention_forward_sm90(const AttentionForwardParams p, const __grid_constant__ AttentionForwardTensorMaps maps) {
  using Tr = AttentionForwardTraits<Cfg>;
  using L = AttentionSm90Layout<Cfg>;
  using T = typename Tr::T;
  constexpr int stages = Cfg::stages;
  extern __shared__ __align__(1024) unsigned char shared_sm90[];
  unsigned char* smem = swizzle_aligned_shared(shared_sm90, L::used_bytes);
  const unsigned smem_base = smem_address(smem);

  const WorkItem w = work_item_head_major<Cfg>(p, blockIdx.x);
  const int q_row0 = w.q_tile * Tr::block_m;
  if (q_row0 >= p.seq_q) return;  // a schedule item past the end of a short sequence: nothing to do
  const int kv_head = w.head_q / (p.heads_q / p.heads_kv);
  const KeyTiles& tiles = w.tiles;
  const unsigned q_ready = smem_base + L::barriers;
  auto slot_ready = [&](int slot) { return q_ready + 8 * (1 + slot); };

  // Thread 0 issues every copy: the j-th tile of the list into ring slot j % stages, K and V counted
  // into the slot's barrier, whose phase flips once per use of the slot.
  auto load_key_tile = [&](int j) {
    const int key0 = tiles.tile(j) * Tr::block_n;
    const int slot = j % stages;
    mbarrier_expect_bytes(slot_ready(slot), 2 * L::kv_bytes);
    tma_load_tile<Tr::head_dim, Tr::block_n>(smem_base + L::k_ring + slot * L::kv_bytes, maps.k, slot_ready(slot),
                                             w.batch, kv_head, key0);
    tma_load_tile<Tr::head_dim, Tr::block_n>(smem_base + L::v_ring + slot * L::kv_bytes, maps.v, slot_ready(slot),
                                             w.batch, kv_head, key0);
  };

  // Prologue: Q and the first key tiles. A CTA with no key tile loads nothing (its output is 0).
  // Loads run `ahead` tiles ahead of the one computed: with two slots, tile j + 1 loads while tile j
  // computes; with more, the slot of tile j - 1 stays in use until tile j's softmax is done (its
  // O += P V runs under it), so only stages - 2 slots are free to load into.
  constexpr int ahead = stages == 2 ? 1 : stages - 2;
  if (threadIdx.x == 0) {
    init_copy_barriers(q_ready, stages + 1);
    if (tiles.count > 0) {
      mbarrier_expect_bytes(q_ready, L::q_bytes);
      tma_load_tile<Tr::head_dim, Tr::block_m>(smem_base, maps.q, q_ready, w.batch, w.head_q, q_row0);
    }
    for (int j = 0; j < ahead && j < tiles.count; ++j) load_key_tile(j);
  }
  __syncthreads();  // the barriers are initialized before anyone waits on them
  if (tiles.count > 0) mbarrier_wait(q_ready, 0);

  // One CTA barrier a tile: every warpgroup is done with the slot that thread 0 then refills.
  auto acquire = [&](int j) {
    __syncthreads();
    if (threadIdx.x == 0 && j + ahead < tiles.count) load_key_tile(j + ahead);
    mbarrier_wait(slot_ready(j % stages), (j / stages) & 1);
    return j % stages;
  };
  auto tile_at = [&](int j) { return TileRef{tiles.tile(j) * Tr::block_n, tiles.pattern_mask(j)}; };
  auto feed = cta_barrier_feed<Cfg>(acquire, tile_at);
  WarpgroupRows<Cfg> rows;
  rows.reset();
  // This warpgroup's 64 rows of the Q tile: a K-major A operand starting at row 64 * warpgroup.
  rows.walk(p, tiles.count, q_row0, smem_base + (threadIdx.x / 128) * 64 * 128, smem_base + L::k_ring, feed);

  // Every copy has landed (each was waited for); meet before the warps stage their output rows over
  // tiles another warpgroup may still be reading.
  __syncthreads();
  T* out = static_cast<T*>(p.o) + w.batch * p.o_batch_stride + w.head_q * p.o_head_stride;
  float* lse_row0 =
      p.lse ? p.lse + (static_cast<long long>(w.batch) * p.heads_q + w.head_q) * p.seq_q + q_row0 : nullptr;
  store_output<Tr>(rows.o, rows.row_max, rows.row_sum, PaddedRows<Tr>{reinterpret_cast<T*>(smem)}, out, p.o_row_stride,
                   lse_row0, q_row0, (threadIdx.x / 32) * 16, p.seq_q);
}

}  // namespace sjit_kernels

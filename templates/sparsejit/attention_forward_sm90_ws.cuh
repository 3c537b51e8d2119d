// Attention forward on Hopper (sm_90a), warp-specialized and persistent (the structure of
// FlashAttention-3, Shah et al. 2024): the same work items, masks, online softmax and wgmma products as
// attention_forward_sm90.cuh (WarpgroupRows), but one CTA an SM walks one work item of every round of
// gridDim.x, and two threads of their own keep the copies ahead of the math across items.
//
// Why: at low density a work item is a few key tiles, and what a CTA does once per item (find its
// tiles in the schedule, load Q and the first K/V tile, store O) weighs as much as several tiles. One
// CTA per item hides it only behind the other CTA of the SM, and equal walks (random patterns) put
// both CTAs' prologues at the same moment. Here:
//   - only the copy threads read the schedule. The Q thread publishes each item (where it is, how
//     many tiles) and the K/V thread each ring slot's tile (first key, pattern mask), in shared memory
//     next to the barrier that announces them, so the math warps never wait on a global load of it;
//   - Q has two buffers: the next item's Q loads during the whole current item;
//   - the K/V ring runs across items: the next item's first tiles load as the current one's last
//     slots free up;
//   - an item's output is written out under the next item's first products (the math loop below),
//     and stored by the Q thread, whose waits for that never hold up the K/V thread's loads;
//   - where the host says so, the items of the last, part-full round are split into pieces of key
//     tiles across all the CTAs, and merged by the piece that ends each (last_round.cuh).
//
// A CTA is Cfg::warps math warps (warps / 4 warpgroups of 64 query rows) plus one warpgroup that gives
// its registers to them (setmaxnreg) and of which two threads issue every copy (the Q thread: Q in, O
// out; the K/V thread: the ring). They meet only on mbarriers, never on a CTA barrier:
//   q_full[b]     Q buffer b holds its item's Q, and the item's record is written (the Q thread's
//                 expect-bytes arrival and the copy's bytes; no bytes for an item without key tiles,
//                 and a record with count -1 after the last item);
//   q_empty[b]    every math thread is done with buffer b: its last S = Q K^T, and its rows of the
//                 item's output staged over it (the Q buffer is dead by then). The Q thread then
//                 stores the output with bulk copies and reuses the buffer once they have read it, so
//                 the math warps never wait on a global store;
//   k_full[s]     ring slot s holds its tile's K, and the slot's record is written; v_full[s] its V;
//   k_empty[s]    every math thread's S = Q K^T is done with slot s's K; v_empty[s] P V with its V.
// All sides count items and tiles the same way, so they agree on every barrier's phase. With K and V
// handed back separately, two slots let P V of tile j - 1 run under the softmax of tile j (the walk's
// overlap): tile j + 1's K loads once S of tile j - 1 is done, its V once P V of tile j - 1 is.
//
// Ping-pong (two math warpgroups): the warpgroups take turns to issue their products (named barriers),
// so that one's softmax and output stores run while the tensor cores do the other's products.
#pragma once

#include "sparsejit/attention_forward_sm90.cuh"
#include "sparsejit/global_signals.cuh"
#include "sparsejit/last_round.cuh"

namespace sjit_kernels {

// What the Q thread tells the math warps about an item, next to its Q buffer; what the K/V thread
// tells them about a tile is the TileRef, next to its ring slot.
struct WsItemRecord {
  int batch, head_q, q_tile;
  int count;       // key tiles (of this CTA's piece, where the item is split); -1: no more items
  int tail;        // -1: this CTA takes the item whole; else it is item t of the split last round, and
                   // this CTA's piece of it one that the merger waits for (tail = t) or the merger
                   // (tail = merging_tail(t))
  int item_count;  // the whole item's key tiles
};
// The record's tail of item t's merging piece, and back (below -1).
__device__ __forceinline__ int merging_tail(int t) { return -2 - t; }
static_assert(sizeof(WsItemRecord) == 24, "codegen's attention_forward_shared_bytes counts 24 bytes an item record");

template <class Cfg>
struct AttentionWsLayout {
  using Tr = AttentionForwardTraits<Cfg>;
  using Base = AttentionSm90Layout<Cfg>;  // its static_asserts hold here too
  static_assert(Tr::block_n == 64 || Tr::block_n == 128, "wgmma_ws path: block_n 64 or 128");
  static constexpr int math_threads = Tr::threads, threads = math_threads + 128;
  static constexpr int copy_warp = Cfg::warps;
  // Two math warpgroups: 2 x 128 x 240 + 128 x 24 registers fit the 65536 of the SM (the launch gives
  // 168 a thread). One math warpgroup has 255 a thread without moving any.
  static constexpr bool move_registers = Cfg::warps == 8;
  static constexpr int math_registers = 240, copy_registers = 24;
  static constexpr int q_bytes = Base::q_bytes, kv_bytes = Base::kv_bytes;
  // A split item's piece in its CTA's scratch slot (tail_slot): the staged output, then the rows'
  // log-sum-exp (the host's last_round_scratch_bytes counts the same).
  static constexpr int tail_slot_bytes = q_bytes + Tr::block_m * 4;
  static constexpr int q_tiles = 0, k_ring = 2 * q_bytes;  // offsets from the 1024-aligned base; V follows K
  static constexpr int records = k_ring + 2 * Cfg::stages * kv_bytes;
  static constexpr int record_bytes = 2 * int(sizeof(WsItemRecord)) + Cfg::stages * int(sizeof(TileRef));
  static constexpr int barriers = records + (record_bytes + 7) / 8 * 8;
  static constexpr int q_full = 0, q_empty = 2, k_full = 4, v_full = k_full + Cfg::stages,
                       k_empty = v_full + Cfg::stages, v_empty = k_empty + Cfg::stages, barrier_count = 4 + 4 * Cfg::stages;
  // Named barriers of the ping-pong (0 is __syncthreads', 1 and 2 warpgroup_barrier's): warpgroup g
  // waits on turn + g for its turn, issues its products, and arrives on the other's once its
  // S = Q K^T is done (arriving right after the issue makes ptxas serialize the wgmma, C7514).
  static constexpr bool ping_pong = Cfg::warps == 8;
  static constexpr int turn = 3;
  static constexpr int used_bytes = barriers + 8 * barrier_count;
};

// CTA c's scratch slot, where its piece that the merger waits for leaves the piece's output, staged
// as a whole item's (in the Q buffer's swizzle, T), and after it the rows' log-sum-exp (fp32).
template <class L>
__device__ __forceinline__ unsigned char* tail_slot(const AttentionForwardParams& p, int c) {
  return reinterpret_cast<unsigned char*>(p.tail_partials) + static_cast<long long>(c) * L::tail_slot_bytes;
}

// The merging piece's rows of split item t, once its own walk is done: waits until every other piece
// has counted itself in the item's counter, then folds their outputs into its own, in registers
// (FlashDecoding's merge: each piece weighted by exp2(its log-sum-exp - the largest so far)).
template <class Cfg>
__device__ __forceinline__ void merge_split_item(WarpgroupRows<Cfg>& rows, const AttentionForwardParams& p, int t,
                                                 int item_count, int warp) {
  using Tr = AttentionForwardTraits<Cfg>;
  using L = AttentionWsLayout<Cfg>;
  using T = typename Tr::T;
  constexpr float log2e = 1.4426950408889634f;
  const int lane = threadIdx.x % 32;
  const LastRound last{p.tail_items, p.tail_ctas};
  if (lane == 0) {  // (the Q thread zeroes the counter once every math warp is done with the item)
    const unsigned others = unsigned(last.pieces(t, item_count) - 1);
    while (load_acquire_gpu(p.tail_counters + t) < others) __nanosleep(64);
  }
  __syncwarp();  // every lane's loads below after lane 0's acquiring load
  // Its own rows first, in place (the order is fixed, so the bits never depend on timing): their
  // outputs unnormalized against the rows' exponent bases (maxima), whose exp2 sums the four lanes of
  // a row hold in parts. `lse_max` is the running log-sum-exp's reference (base 2), `weights` the sum
  // of exp2(score - lse_max) so far, against which rows.o is scaled.
  float lse_max[2], weights[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    lse_max[h] = rows.row_max[0][h];  // -inf where it saw no key: its outputs and sums are 0 then
    weights[h] = rows.row_sum[0][h];
    weights[h] += __shfl_xor_sync(0xffffffffu, weights[h], 1);
    weights[h] += __shfl_xor_sync(0xffffffffu, weights[h], 2);
  }
  for (int c = last.first_cta(t); c < last.merger(t); ++c) {
    if (!last.waited_for(t, c, item_count)) continue;
    // The lane's place in the slot, from the lane index read here: computed from a value known
    // outside the loops, the compiler keeps every load's offset in registers through the whole kernel.
    unsigned lane_here;
    asm volatile("mov.u32 %0, %%laneid;\n" : "=r"(lane_here));
    const unsigned char* slot = tail_slot<L>(p, c);
    const float* lse = reinterpret_cast<const float*>(slot + L::q_bytes);
    const int row_here = warp * 16 + int(lane_here) / 4;  // the lane's rows: row_here and row_here + 8
    // The piece's output is normalized: its weights sum to 1 against its own log-sum-exp.
    float keep[2], take[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float piece = __ldcg(lse + row_here + 8 * h) * log2e, next = fmaxf(lse_max[h], piece);
      // A row that has seen no key yet (or whose piece saw none) adds 0, never exp2(inf) * 0.
      keep[h] = lse_max[h] == -infinity() ? 0.f : fast_exp2(lse_max[h] - next);
      take[h] = piece == -infinity() ? 0.f : fast_exp2(piece - next);
      lse_max[h] = next;
      weights[h] = weights[h] * keep[h] + take[h];
    }
    // The lane's two columns of each d-tile, in its two rows (which share a swizzle).
    unsigned pairs[Tr::d_tiles][2];
#pragma unroll
    for (int dt = 0; dt < Tr::d_tiles; ++dt)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        pairs[dt][h] = __ldcg(reinterpret_cast<const unsigned*>(
            slot + swizzled_offset(Tr::block_m, row_here + 8 * h, dt * 8 + 2 * (lane_here % 4))));
#pragma unroll
    for (int dt = 0; dt < Tr::d_tiles; ++dt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float2 out = unpack2<T>(pairs[dt][h]);
        rows.o[0][dt][2 * h] = rows.o[0][dt][2 * h] * keep[h] + take[h] * out.x;
        rows.o[0][dt][2 * h + 1] = rows.o[0][dt][2 * h + 1] * keep[h] + take[h] * out.y;
      }
  }
  // Back for pack_output, which sums a row's four lanes: a quarter each (exact).
#pragma unroll
  for (int h = 0; h < 2; ++h) rows.row_max[0][h] = lse_max[h], rows.row_sum[0][h] = 0.25f * weights[h];
}

// The warp's rows of a merged split item straight to global memory (its other pieces' CTAs hold
// other rows of their Q buffers, so the Q thread's bulk store of the whole tile cannot serve them).
template <class Tr>
__device__ __forceinline__ void store_merged_rows(const PackedOutput<Tr>& out, const AttentionForwardParams& p,
                                                  int batch, int head_q, int q_row0, int warp) {
  using T = typename Tr::T;
  const int lane = threadIdx.x % 32;
  T* o = static_cast<T*>(p.o) + batch * p.o_batch_stride + head_q * p.o_head_stride;
  float* lse = p.lse ? p.lse + (static_cast<long long>(batch) * p.heads_q + head_q) * p.seq_q : nullptr;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = q_row0 + warp * 16 + lane / 4 + h * 8;
    if (row >= p.seq_q) continue;
    if (lse != nullptr && lane % 4 == 0) lse[row] = out.lse[0][h];
#pragma unroll
    for (int dt = 0; dt < Tr::d_tiles; ++dt)
      *reinterpret_cast<unsigned*>(o + row * p.o_row_stride + dt * 8 + 2 * (lane % 4)) = out.o[0][h][dt];
  }
}

// The math warps' side of the copy threads' barriers (WarpgroupRows::walk's Feed), and the ping-pong.
template <class Cfg>
struct CopyThreadFeed {
  using L = AttentionWsLayout<Cfg>;
  static constexpr bool overlap = true, defer_last = true;
  // The previous item's output is written under the first S of an item where items are a few tiles
  // (block-sparse), and under the other warpgroup's products where they are long (dense).
  static constexpr bool scores_cover_first = Cfg::sparsity != kDense;
  // An item's first two S issued together (WarpgroupRows::walk) where items are a few tiles; dense
  // items are 64 and more, and lost 1-2% with it (H200, docs/attention-log.md).
  static constexpr bool early_second_scores = Cfg::sparsity != kDense;
  unsigned barriers;  // the shared address of barrier 0
  int first;          // tiles walked before this item (the ring's position)
  volatile TileRef* records;
  int group;
  __device__ __forceinline__ unsigned barrier(int index) const { return barriers + 8 * index; }
  __device__ __forceinline__ int slot(int j) const { return (first + j) % Cfg::stages; }
  __device__ __forceinline__ unsigned phase(int j) const { return ((first + j) / Cfg::stages) & 1; }
  __device__ __forceinline__ int acquire_k(int j) const {
    mbarrier_wait(barrier(L::k_full + slot(j)), phase(j));
    return slot(j);
  }
  __device__ __forceinline__ TileRef tile(int, int s) const { return {records[s].key0, records[s].pattern_mask}; }
  __device__ __forceinline__ void acquire_v(int j, int s) const { mbarrier_wait(barrier(L::v_full + s), phase(j)); }
  __device__ __forceinline__ void release_k(int s) const { mbarrier_arrive(barrier(L::k_empty + s)); }
  __device__ __forceinline__ void release_v(int s) const { mbarrier_arrive(barrier(L::v_empty + s)); }
  __device__ __forceinline__ void begin_turn() const {
    if constexpr (L::ping_pong) take_turn<L::turn, L::math_threads>(group);
  }
  __device__ __forceinline__ void end_turn() const {
    if constexpr (L::ping_pong) pass_turn<L::turn, L::math_threads>(group);
  }
};

template <class Cfg>
__global__ void __launch_bounds__(AttentionWsLayout<Cfg>::threads, 1)
    attention_forward_sm90_ws(const AttentionForwardParams p, const __grid_constant__ AttentionForwardTensorMaps maps) {
  using Tr = AttentionForwardTraits<Cfg>;
  using L = AttentionWsLayout<Cfg>;
  using T = typename Tr::T;
  constexpr int stages = Cfg::stages;
  extern __shared__ __align__(1024) unsigned char shared_ws[];
  unsigned char* smem = swizzle_aligned_shared(shared_ws, L::used_bytes);
  const unsigned base = smem_address(smem);
  auto barrier = [&](int index) { return base + L::barriers + 8 * index; };
  volatile WsItemRecord* item_records = reinterpret_cast<WsItemRecord*>(smem + L::records);
  volatile TileRef* tile_records = reinterpret_cast<TileRef*>(smem + L::records + 2 * sizeof(WsItemRecord));

  if (threadIdx.x == 0) {
    for (int b = 0; b < 2; ++b) {
      mbarrier_init(barrier(L::q_full + b), 1);
      mbarrier_init(barrier(L::q_empty + b), L::math_threads);
    }
    for (int slot = 0; slot < stages; ++slot) {
      mbarrier_init(barrier(L::k_full + slot), 1);
      mbarrier_init(barrier(L::v_full + slot), 1);
      mbarrier_init(barrier(L::k_empty + slot), L::math_threads);
      mbarrier_init(barrier(L::v_empty + slot), L::math_threads);
    }
    fence_barrier_init();
  }
  __syncthreads();  // the barriers are initialized before anyone waits on them

  // The warp index read from lane 0: the compiler then knows it is the same in every lane, and so that
  // the math warps' branch is not divergent (it would serialize their wgmma otherwise, ptxas C7520).
  const int warp = __shfl_sync(0xffffffffu, threadIdx.x / 32, 0);
  if (warp >= Cfg::warps) {
    if constexpr (L::move_registers) warpgroup_release_registers<L::copy_registers>();
    // Two threads issue every copy, each walking the CTA's items in the same order: the Q thread
    // stores each item's output and loads the Q of the item two later into its buffer, the K/V thread
    // fills the ring. Neither waits for the other, so a store never holds up the ring's loads.
    const bool kv_thread = warp == L::copy_warp && threadIdx.x % 32 == 0;
    const bool q_thread = warp == L::copy_warp + 1 && threadIdx.x % 32 == 0;
    if (!kv_thread && !q_thread) return;
    // Round k takes item k * gridDim.x + blockIdx.x, or in odd rounds the mirror of it (a snake). Items
    // come heaviest first within each (batch, head): a plain stride would hand the low CTAs the heavier
    // item of every round (dense causal: 8% over the mean walk, against 3% snaking; see docs).
    // After the rounds, the CTA's pieces of the last round's items where it is split (LastRound):
    // visit(w, j0, j1, tail) takes key tiles [j0, j1) of w, tail -1 where the CTA takes w whole.
    const unsigned whole_items = unsigned(p.work_items - p.tail_items);
    auto for_each_item = [&](auto&& visit) {
      for (unsigned round = 0, first = 0; first < whole_items; ++round, first += gridDim.x) {
        const unsigned item = first + (round % 2 ? gridDim.x - 1 - blockIdx.x : blockIdx.x);
        if (item >= whole_items) continue;
        const WorkItem w = work_item_head_major<Cfg>(p, item);
        if (w.q_tile * Tr::block_m >= p.seq_q) continue;  // a schedule item past the end of a short sequence
        visit(w, 0, w.tiles.count, -1);
      }
      const LastRound last{p.tail_items, p.tail_ctas};
      if (p.tail_items == 0 || int(blockIdx.x) >= last.ctas) return;
      // Last item first: its piece (the item's start) is one the item's merger may wait for, and the
      // first item's (its end) the merger (last_round.cuh).
      for (int t = last.last_item(blockIdx.x); t >= last.first_item(blockIdx.x); --t) {
        const WorkItem w = work_item_head_major<Cfg>(p, whole_items + t);
        if (w.q_tile * Tr::block_m >= p.seq_q) continue;
        const int count = w.tiles.count;
        if (count == 0) {  // a row of no key tile: output 0, from the CTA of its first unit
          if (last.first_cta(t) == int(blockIdx.x)) visit(w, 0, 0, -1);
          continue;
        }
        const TileRange r = last.tiles(t, blockIdx.x, count);
        if (r.empty()) continue;
        const bool whole = r.end - r.begin == count;  // no other CTA has a tile
        visit(w, r.begin, r.end, whole ? -1 : last.merger(t) == int(blockIdx.x) ? merging_tail(t) : t);
      }
    };
    if (q_thread) {
      // For each item, its record and Q into the next Q buffer once the math warps are done with that
      // buffer's previous item and that item's output, staged there, has been copied out.
      int items = 0;
      // Item's output, once staged, by a bulk copy to where the buffer's record says. The record is
      // rewritten only after this. A split item's pieces are not stored here (below).
      auto store_output_of = [&](int item) {
        const int b = item % 2;
        mbarrier_wait(barrier(L::q_empty + b), (item / 2) & 1);
        if (item_records[b].tail != -1) return;
        tma_store_tile<Tr::head_dim, Tr::block_m>(maps.o, base + L::q_tiles + b * L::q_bytes, item_records[b].batch,
                                                  item_records[b].head_q, item_records[b].q_tile * Tr::block_m);
        bulk_commit();
        bulk_wait_read();  // the buffer may be refilled once the copy has read it
      };
      auto publish_item = [&](const WorkItem& w, int count, int tail) {
        const int b = items % 2;
        if (items >= 2) store_output_of(items - 2);
        item_records[b].batch = w.batch;
        item_records[b].head_q = w.head_q;
        item_records[b].q_tile = w.q_tile;
        item_records[b].count = count;
        item_records[b].tail = tail;
        item_records[b].item_count = w.tiles.count;
        mbarrier_expect_bytes(barrier(L::q_full + b), count > 0 ? L::q_bytes : 0);  // publishes the record
        if (count > 0)
          tma_load_tile<Tr::head_dim, Tr::block_m>(base + L::q_tiles + b * L::q_bytes, maps.q, barrier(L::q_full + b),
                                                   w.batch, w.head_q, w.q_tile * Tr::block_m);
        ++items;
      };
      for_each_item([&](const WorkItem& w, int j0, int j1, int tail) { publish_item(w, j1 - j0, tail); });
      // The split last round, here rather than in store_output_of, whose copies in the loops would
      // hold more than the copy threads' registers: the CTA walks at most two items of it, so the
      // piece that a merger waits for is one of its last two items and its merging piece its last.
      const int n = items, tail_of_last = n >= 1 ? item_records[(n - 1) % 2].tail : -1,
                tail_before = n >= 2 ? item_records[n % 2].tail : -1;
      publish_item(WorkItem{}, -1, -1);  // (the end record, over item n - 2's)
      if (tail_before >= 0 || tail_of_last >= 0) {
        // The piece to the CTA's scratch slot whole, then, once it has landed, counted in the item's
        // counter that the merger's warps wait for (the log-sum-exp, written there by the math warps
        // before they arrived on q_empty, is released with it).
        const int item = tail_before >= 0 ? n - 2 : n - 1, b = item % 2;
        mbarrier_wait(barrier(L::q_empty + b), (item / 2) & 1);
        bulk_store(tail_slot<L>(p, blockIdx.x), base + L::q_tiles + b * L::q_bytes, L::q_bytes);
        bulk_commit();
        bulk_wait_done();
        add_release_after_bulk_writes(p.tail_counters + (tail_before >= 0 ? tail_before : tail_of_last));
      }
      if (n >= 1) store_output_of(n - 1);
      // Every merger warp has seen its item's count (it arrived on q_empty after): zero for the next launch.
      if (tail_of_last < -1) p.tail_counters[merging_tail(tail_of_last)] = 0;
      bulk_wait_done();
      return;
    }
    // The K/V thread: each item's tiles, each with its record into the next ring slot once the math
    // warps free it.
    int tiles_loaded = 0;
    for_each_item([&](const WorkItem& w, int j0, int j1, int) {
      const int kv_head = w.head_q / (p.heads_q / p.heads_kv);
      for (int j = j0; j < j1; ++j, ++tiles_loaded) {
        const int slot = tiles_loaded % stages, phase = (tiles_loaded / stages - 1) & 1;
        const int key0 = w.tiles.tile(j) * Tr::block_n;
        if (tiles_loaded >= stages) mbarrier_wait(barrier(L::k_empty + slot), phase);
        tile_records[slot].key0 = key0;
        tile_records[slot].pattern_mask = w.tiles.pattern_mask(j);
        mbarrier_expect_bytes(barrier(L::k_full + slot), L::kv_bytes);
        tma_load_tile<Tr::head_dim, Tr::block_n>(base + L::k_ring + slot * L::kv_bytes, maps.k,
                                                 barrier(L::k_full + slot), w.batch, kv_head, key0);
        if (tiles_loaded >= stages) mbarrier_wait(barrier(L::v_empty + slot), phase);
        mbarrier_expect_bytes(barrier(L::v_full + slot), L::kv_bytes);
        tma_load_tile<Tr::head_dim, Tr::block_n>(base + L::k_ring + (stages + slot) * L::kv_bytes, maps.v,
                                                 barrier(L::v_full + slot), w.batch, kv_head, key0);
      }
    });
    return;
  }

  // The math warps: items in the copy threads' order until the record that says there are no more.
  if constexpr (L::move_registers) warpgroup_claim_registers<L::math_registers>();
  const int group = warp / 4;
  if constexpr (L::ping_pong)
    if (group == 1) pass_turn<L::turn, L::math_threads>(group);  // warpgroup 0 takes the first turn
  // An item's output is written to shared memory once the next item's first S = Q K^T is issued (the
  // walk's on_first_scores: under that product, or under the other warpgroup's once the turn is handed
  // over, CopyThreadFeed::scores_cover_first), so the tensor cores run while this one stores. The walk
  // leaves the item's last P V to this loop, which issues it at the top of the next iteration (no
  // product runs across the loop's back edge) and packs the output before the next walk (ptxas
  // serializes every wgmma, C7514, where ordinary instructions read an accumulator while one runs).
  // The item is pending until written, its last tile's V slot held until packed; its record stays
  // valid until then (the Q thread rewrites a buffer's record only once its output is written).
  WarpgroupRows<Cfg> rows;
  rows.reset();
  int pending = -1, pending_v_slot = -1;  // the pending item's Q buffer (-1: none), its last V slot
  PackedOutput<Tr> packed;
  auto pack_pending = [&] {  // once the pending item's last P V is complete
    wgmma_fence_operands(rows.o[0]);
    if (pending_v_slot >= 0) mbarrier_arrive(barrier(L::v_empty + pending_v_slot));
    if (item_records[pending].tail < -1)  // the piece of a split item that merges it
      merge_split_item<Cfg>(rows, p, merging_tail(item_records[pending].tail), item_records[pending].item_count, warp);
    packed = pack_output<Tr>(rows.o, rows.row_max, rows.row_sum);
  };
  auto write_pending = [&] {
    if (pending < 0) return;
    if (item_records[pending].tail < -1) {  // merged: its other pieces' CTAs hold other rows in their Q buffers
      store_merged_rows<Tr>(packed, p, item_records[pending].batch, item_records[pending].head_q,
                            item_records[pending].q_tile * Tr::block_m, warp);
      mbarrier_arrive(barrier(L::q_empty + pending));
      pending = -1;
      return;
    }
    // The output, over this warpgroup's rows of the item's Q buffer (in its swizzle, the layout the
    // Q thread's bulk store reads): every warp of the warpgroup has completed its products that
    // read them.
    warpgroup_barrier(group);
    unsigned char* staging = smem + L::q_tiles + pending * L::q_bytes;
    auto staged = [&](int row, int col) {
      return reinterpret_cast<T*>(staging + swizzled_offset(Tr::block_m, row, col));
    };
    const int q_row0 = item_records[pending].q_tile * Tr::block_m;
    // A piece that the merger waits for: the log-sum-exp next to the output in the CTA's scratch slot.
    float* lse_row0 =
        item_records[pending].tail >= 0
            ? reinterpret_cast<float*>(tail_slot<L>(p, blockIdx.x) + L::q_bytes)
        : p.lse ? p.lse + (static_cast<long long>(item_records[pending].batch) * p.heads_q +
                           item_records[pending].head_q) * p.seq_q + q_row0
                : nullptr;
    write_output<Tr>(packed, staged, lse_row0, q_row0, warp * 16, p.seq_q);
    fence_proxy_async();  // the staged rows, written by ordinary stores, visible to the bulk copy
    mbarrier_arrive(barrier(L::q_empty + pending));
    pending = -1;
  };
  int tiles_seen = 0;
  for (int n = 0;; ++n) {
    if (pending >= 0 && pending_v_slot >= 0) {
      const int pending_count = item_records[pending].count;
      CopyThreadFeed<Cfg> pending_feed{barrier(0), tiles_seen - pending_count, tile_records, group};
      rows.issue_last_values(pending_count, pending_v_slot, base + L::k_ring, pending_feed);
    }
    const int b = n % 2;
    mbarrier_wait(barrier(L::q_full + b), (n / 2) & 1);
    const int count = item_records[b].count;
    wgmma_wait<0>();  // the pending item's last P V (unconditional: ptxas would add one where it cannot tell)
    if (pending >= 0) pack_pending();
    if (count <= 0) {  // no first S to write the pending output under
      write_pending();
      if (count < 0) break;
      rows.reset();  // the item's output is zero
    }
    CopyThreadFeed<Cfg> feed{barrier(0), tiles_seen, tile_records, group};
    pending_v_slot = rows.walk(p, count, item_records[b].q_tile * Tr::block_m, base + L::q_tiles + b * L::q_bytes +
                               group * 64 * 128, base + L::k_ring, feed, write_pending);
    pending = b;
    tiles_seen += count;
  }
}

}  // namespace sjit_kernels

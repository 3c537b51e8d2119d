// Attention backward on Hopper (sm_90a): the dK/dV pass of attention_backward.cuh (same CTA ownership,
// query-tile walk, masks and atomic dQ contract) with its five tile products on wgmma, and a warpgroup
// of its own for everything that is not math.
//
// A CTA owns 128 keys. Its first two warpgroups (the math warps) each take 64 of them (warp w owns keys
// 16w .. 16w + 15, as on the mma.sync path, so masks and stores are shared). For each query tile of the
// walk (64 queries; 128 at d = 64):
//   1. S^T = K Q^T and dP^T = V dO^T: K and V rows of the warpgroup as A, the Q and dO tiles as B, all
//      K-major in shared memory, in two wgmma groups (P^T = exp2(..) runs while dP^T computes);
//   2. in registers: the mask where the tile needs one, P^T = exp2(S^T scale log2 e - lse2) and
//      dS^T = P^T (dP^T - delta), both packed as wgmma A fragments (the accumulator layout of a 64 x 64
//      product is the A layout of four k-steps);
//   3. dV += P^T dO and dK += dS^T Q: A from registers, dO and Q read transposed (N-major);
//   4. atomic dQ: dS^T goes to shared memory ([keys][queries], two buffers) and dQ = dS K is one more
//      product with A read transposed (M-major) and K read transposed, issued a tile later (with the
//      next tile's dV and dK), so that the warpgroups need not meet: at d = 128 warpgroup g takes head
//      dims 64g .. 64g + 63 over all 128 keys, so it reads both warpgroups' dS (at d = 96 the second
//      adds dims 64 .. 95 only). At d = 64 the tiles are 128 queries: warpgroup g takes queries
//      64g .. 64g + 63, all dims, over all 128 keys, so again each element of dQ is added once.
//      Each warpgroup writes its fp32 dQ tile to shared memory for the dQ warp (below).
// At d = 256 (Cfg::warps = 4: 64 keys a CTA, the dQ pass's dQ) the two math warpgroups take the same
// 64 keys and half the head dims each: dK and dV of 64 keys x 256 dims would need 256 registers a
// thread of one warpgroup. They split a tile by role: warpgroup 0 computes S^T and P^T, warpgroup 1
// dP^T and dS^T, P^T and dS^T handed over in shared memory (walk_tile_by_roles); each then adds its
// 128 dims of dV and dK (64 x 128 products reading its half of dO and Q), holding as many accumulators
// as a warpgroup at d = 128. (Both computing S^T and dP^T, six products a tile instead of four, made
// the pass 13% slower.)
// At d = 96 the K, V, Q and dO tiles are stored as at d = 128, in two 64-column swizzle blocks. The
// tensor maps' extent is 96, so the copies fill columns 96 .. 127 with zeros, and no product reads
// them but the second warpgroup's dQ product (its dims 96 .. 127 are dropped): S^T and dP^T take 6
// k-steps, dV and dK are 64 x 96 products.
// The third warpgroup gives most of its registers to the math warps (setmaxnreg) and splits into:
//   - the copy warp: K and V, then for each tile of the walk Q and dO by bulk tensor copies (TMA) into
//     a ring of `stages` slots, and the rows' lse2 and delta, counted into the slot's "full" mbarrier;
//     it refills a slot once the eight math warps have arrived on its "empty" one;
//   - the dQ warp (atomic dQ): adds each warpgroup's dQ tile to the fp32 accumulator with bulk tensor
//     reductions (no per-element atomics) and hands the buffer back once they have read it; once all
//     its adds have landed it counts the CTA done in its group's counter;
//   - two conversion warps (atomic dQ): they turn a share of an earlier group's accumulator into dQ
//     while the math warps work (convert_earlier_group, below), so no pass after this one reads the
//     whole accumulator back. The host switches them off (convert_lag = every group) where a CTA has
//     too little work to hide its share, and dq_convert converts it all.
// The math warps never wait on a copy they issued, a global load or a reduction: only on the slot's
// full barrier, on their turn to issue S^T and dP^T (the two warpgroups take turns, ping-pong, so that
// one's exponentials run under the other's products), and with atomic dQ on mbarriers that hand the
// dS tiles between the warpgroups and the dQ tiles to the dQ warp. Every tile in shared memory uses
// the 128-byte swizzle of wgmma.cuh.
#pragma once

#include "sparsejit/attention_backward.cuh"
#include "sparsejit/attention_forward_sm90.cuh"  // tma.cuh, wgmma.cuh
#include "sparsejit/backward_warp_roles.cuh"
#include "sparsejit/global_signals.cuh"
#include "sparsejit/warpgroup_hand_over.cuh"

namespace sjit_kernels {

template <class Cfg>
struct BackwardSm90Layout : BackwardWarpRoles {
  using Tr = BackwardTraits<Cfg>;
  static_assert(Tr::block_n == 64 || (Tr::block_n == 128 && Tr::head_dim == 64),
                "wgmma dK/dV: 64-query tiles (128 at d = 64)");
  static_assert(((Tr::head_dim == 64 || Tr::head_dim == 96 || Tr::head_dim == 128) && Cfg::warps == 8) ||
                    (Tr::head_dim == 256 && Cfg::warps == 4 && !Cfg::atomic_dq),
                "wgmma dK/dV: head_dim 64, 96 or 128 with 8 warps (128 keys), or 256 with 4 (64 keys) and the dQ pass");
  // The math warpgroups split the CTA's keys (64 each) or, at d = 256, the head dims (see above).
  static constexpr int key_groups = Cfg::warps / 4, dim_groups = 2 / key_groups;
  static constexpr int own_dims = Tr::head_dim / dim_groups;  // the dims of a warpgroup's dK and dV
  static constexpr int threads = math_threads + helper_threads, dq_warp = copy_warp + 1;

  static constexpr int rows = Tr::block_rows, cols = Tr::block_n;
  // A tile's queries: `runs` runs of run_rows rows, one pattern block each where blocks are narrower
  // than the tile (PackedQueries), else one run of the tile's contiguous rows. The host chooses per
  // pattern whether the schedule lists such runs (p.k_query_rows == run_rows) or whole tiles. A tile
  // whose runs do not lie end to end moves (the copies of Q and dO, the dQ reductions) a run at a time.
  static constexpr int runs = Cfg::query_runs, run_rows = cols / runs;
  static_assert(runs == 1 || (Cfg::sparsity != kDense && Cfg::pattern_block == run_rows),
                "query runs: one pattern block each");
  using Tile = PackedQueries<run_rows, runs>;
  // Eight runs a tile with atomic dQ (blocks of 16 on d = 64's 128-query tiles): the copy warp and the
  // dQ warp each locate eight runs, which spilled 24 bytes in 40 registers; the math warps give them 16
  // more. (Without atomic dQ the math warps need their 232: 12 bytes spilled at 224.)
  static constexpr bool eight_runs_atomic = runs > 4 && Cfg::atomic_dq;
  static constexpr int math_registers = eight_runs_atomic ? 224 : BackwardWarpRoles::math_registers;
  static constexpr int helper_registers = eight_runs_atomic ? 56 : BackwardWarpRoles::helper_registers;
  static_assert(takes_launch_share(math_registers, helper_registers),
                "the math and helper warps' registers: all the launch gives the CTA");
  static constexpr int tile_dim = swizzled_tile_cols(Tr::head_dim);  // d = 96: 128
  static constexpr int own_bytes = rows * tile_dim * 2;           // the K and V tiles
  static constexpr int other_bytes = cols * tile_dim * 2;         // one Q or dO slot
  static constexpr int ds_bytes = rows * cols * 2;             // one dS^T tile: [keys][64 queries], 128-byte rows
  static constexpr int k_tile = 0, v_tile = own_bytes;         // offsets from the 1024-aligned base
  static constexpr int q_ring = 2 * own_bytes;
  static constexpr int do_ring = q_ring + Cfg::stages * other_bytes;
  // Two dS tiles: tile j's is written while a slower warpgroup may still read j - 1's. At d = 256
  // instead the hand-over between the warpgroups (below): P^T in fp32, then dS^T as packed A fragments,
  // each thread's in 16-byte chunks, chunk c of all 128 threads side by side.
  static constexpr int ds_tiles = do_ring + Cfg::stages * other_bytes;
  using HandOver = WarpgroupHandOver<Tr::n_tiles, cols / 16>;
  static constexpr int ds_region_bytes = dim_groups == 2 ? HandOver::p_bytes + HandOver::ds_bytes : 2 * ds_bytes;
  // Each warpgroup's fp32 dQ tile (64 queries x 64 dims) as two 32-column boxes of 128-byte swizzled
  // rows, the source of the dQ warp's reductions.
  static constexpr int dq_box_bytes = 64 * 128, dq_bytes = 2 * dq_box_bytes;
  // With atomic dQ at d = 64 (128-query tiles) warpgroup g's dQ tile is queries 64g .. 64g + 63 of the
  // tile (all 64 dims); otherwise all the tile's 64 queries, dims 64g .. 64g + 63 (d = 64: all, over
  // the warpgroup's own keys).
  static constexpr bool dq_by_queries = Cfg::atomic_dq && cols == 128;
  static constexpr int dq_tiles = ds_tiles + ds_region_bytes;
  // Atomic dQ's conversion: two buffers the accumulator's rows arrive in by bulk copies.
  static constexpr int convert_buffer_bytes = 8192;
  static constexpr int convert_ring = dq_tiles + (Cfg::atomic_dq ? 2 * dq_bytes : 0);
  static constexpr int lse2_ring = convert_ring + (Cfg::atomic_dq ? 2 * convert_buffer_bytes : 0);
  static constexpr int delta_ring = lse2_ring + Cfg::stages * cols * 4;
  // mbarriers: K/V's; a full and an empty one per ring slot; each warpgroup's dQ tile full (written)
  // and empty (read by the reductions); each conversion buffer's full one; each dS tile full (every
  // math thread has written its part) and empty (both warpgroups' dQ products have read it).
  static constexpr int kv_ready = 0, slot_full = 1, slot_empty = 1 + Cfg::stages, dq_full = 1 + 2 * Cfg::stages,
                       dq_empty = dq_full + 2, convert_full = dq_empty + 2, ds_full = convert_full + 2,
                       ds_empty = ds_full + 2, barrier_count = ds_empty + 2;
  static constexpr int convert_barrier = 4;  // named: the two conversion warps
  // The warpgroups never meet inside the walk: they take turns to issue S^T and dP^T (named barriers
  // turn and turn + 1), so that one's element-wise steps run while the tensor cores do the other's
  // products. With atomic dQ, the dQ product of tile j (at d = 128 it needs both warpgroups' dS) is
  // issued a tile later, once the dS tile's full mbarrier says both have written it; by then the
  // other warpgroup, half a tile behind or ahead, has long done so, so the wait rarely blocks.
  static constexpr int turn = 5;
  // At d = 256 the warpgroups split a tile's work by role, not by keys (warpgroup_hand_over.cuh).
  static_assert(HandOver::threads == math_threads && HandOver::p_ready > turn + 1,
                "the hand-over's named barriers: over the math warps, past the turns'");
  static constexpr int barriers = delta_ring + Cfg::stages * cols * 4;
  // The walk and the tile each ring slot holds. Here rather than in static shared memory: the extern
  // array's 1 KB alignment would pad a static block to 1 KB.
  struct Indices {
    QueryTileWalk<Cfg, cols> walk;
    Tile slot_tile[Cfg::stages];
  };
  static constexpr int indices = barriers + 8 * barrier_count;
  static constexpr int used_bytes = indices + int(sizeof(Indices));
  static_assert(sizeof(Indices) <= 1024, "codegen's attention_backward_shared_bytes allows 1 KB for them");
  // dK and dV are staged through padded rows (store_rows) over the tiles once the walk is done.
  static constexpr int staging_elems = rows * Tr::row_elems;
  static_assert(2 * staging_elems * 2 <= dq_tiles, "the output staging tiles must fit below the dQ tiles");
};

// Bytes of dynamic shared memory (the host asks for 1 KB more, to align the base to a swizzle atom).
template <class Cfg>
constexpr int backward_sm90_shared_bytes() { return BackwardSm90Layout<Cfg>::used_bytes; }

// Whether warpgroup `group`'s 64 keys of a tile may see any of its queries, the last of which is
// `last_query`: one of their pattern blocks is active (a tile's bits split by warpgroup where blocks
// are 64 keys or fewer; with larger blocks the walk only lists tiles that are), they start before the
// key sequence's end, and (causal) the first of them is not past the tile's last query.
template <class Cfg>
__device__ __forceinline__ bool warpgroup_keys_active(const AttentionBackwardParams& p, int group, int key0,
                                                      int last_query, unsigned long long pattern_mask) {
  using Tr = BackwardTraits<Cfg>;
  const int first_key = key0 + group * 64;
  if (first_key >= p.seq_k) return false;
  if constexpr (Cfg::causal != kNotCausal) {
    const int offset = Cfg::causal == kCausalBottomRight ? p.seq_k - p.seq_q : 0;
    if (first_key > last_query + offset) return false;
  }
  if constexpr (Tr::group_rows <= 64)
    if (pattern_mask != kWholeTile && (pattern_mask & warpgroup_mask_bits<Cfg>(group)) == 0) return false;
  return true;
}

// Atomic dQ's conversion inside the pass, by the helper warpgroup's two spare warps (64 threads,
// `thread` 0 .. 63): the CTA of rank r converts the r-th share of `group`'s rows (its query heads,
// contiguous in the accumulator) once all `ranks` CTAs of that group have counted themselves done.
// That group is convert_lag groups before this CTA's: CTAs start in launch order, one an SM, so its
// CTAs all started before this one and wait for nothing later, and the wait ends. The host picks a lag
// of a wave of CTAs and one group more, so that group has finished when this CTA starts.
// The rows arrive by bulk copies into two buffers in turn (registers would hold one row a thread in
// flight: these warps have 40), and leave as dQ, with zeros written back behind them.
template <class Cfg, class L = BackwardSm90Layout<Cfg>>
__device__ __forceinline__ void convert_earlier_group(const AttentionBackwardParams& p, int group, int rank, int ranks,
                                                      int thread, unsigned char* smem, unsigned base) {
  // d = 96: 12 chunks a row, 5 rows a pass, threads 60 .. 63 idle.
  constexpr int D = Cfg::head_dim, chunks = D / 8, rows_per_pass = 64 / chunks;
  constexpr int buffer_rows = L::convert_buffer_bytes / (4 * D);
  const long long group_rows = static_cast<long long>(p.heads_q / p.heads_kv) * p.seq_q;
  const long long share = (group_rows + ranks - 1) / ranks;
  const long long begin = group * group_rows + min(group_rows, rank * share);
  const long long end = group * group_rows + min(group_rows, (rank + 1) * share);
  if (begin >= end) return;
  const int buffers = static_cast<int>((end - begin + buffer_rows - 1) / buffer_rows);
  auto full = [&](int b) { return base + L::barriers + 8 * (L::convert_full + b); };
  auto request = [&](int b) {  // rows of buffer-load b into buffer b % 2
    const long long row0 = begin + static_cast<long long>(b) * buffer_rows;
    const unsigned bytes = static_cast<unsigned>(min(static_cast<long long>(buffer_rows), end - row0) * D * 4);
    mbarrier_expect_bytes(full(b % 2), bytes);
    bulk_load(base + L::convert_ring + (b % 2) * L::convert_buffer_bytes, p.dq_accum + row0 * D, bytes, full(b % 2));
  };
  if (thread == 0) {
    while (load_acquire_gpu(p.groups_done + group) < static_cast<unsigned>(ranks)) __nanosleep(256);
    // The other CTAs' adds, seen through the acquire above, come before this thread's bulk copies.
    fence_proxy_async_global();
    for (int b = 0; b < 2 && b < buffers; ++b) request(b);
  }
  // A thread per 8 elements of a row, stepping through the rows (a 64-bit division is a call here).
  const int chunk = thread % chunks;
  const bool idle = thread >= rows_per_pass * chunks;
  QueryRow r = query_row(p, begin + thread / chunks);
  for (int b = 0; b < buffers; ++b) {
    mbarrier_wait(full(b % 2), (b / 2) & 1);
    const float* rows = reinterpret_cast<const float*>(smem + L::convert_ring + (b % 2) * L::convert_buffer_bytes);
    const long long row_end = min(end, begin + static_cast<long long>(b + 1) * buffer_rows);
    for (; !idle && r.row < row_end; r.row += rows_per_pass) {
      const float4* at = reinterpret_cast<const float4*>(rows + (r.row - begin) % buffer_rows * D + chunk * 8);
      store_dq_chunk<typename Cfg::T, D>(p, r, chunk, {at[0], at[1]});
      for (r.i += rows_per_pass; r.i >= p.seq_q; r.i -= p.seq_q) ++r.head;
    }
    named_barrier(L::convert_barrier, 64);  // buffer b % 2 is read: it may take load b + 2
    if (thread == 0 && b + 2 < buffers) request(b + 2);
  }
}

template <class Cfg>
__global__ void __launch_bounds__(BackwardSm90Layout<Cfg>::threads, 1)
    attention_backward_dkdv_sm90(const AttentionBackwardParams p, const __grid_constant__ AttentionBackwardTensorMaps maps) {
  using Tr = BackwardTraits<Cfg>;
  using L = BackwardSm90Layout<Cfg>;
  using T = typename Tr::T;
  constexpr int R = L::rows, C = L::cols, D = Tr::head_dim, stages = Cfg::stages;
  extern __shared__ __align__(1024) unsigned char shared_bwd_sm90[];
  unsigned char* smem = swizzle_aligned_shared(shared_bwd_sm90, L::used_bytes);
  const unsigned base = smem_address(smem);
  float* lse2_ring = reinterpret_cast<float*>(smem + L::lse2_ring);
  float* delta_ring = reinterpret_cast<float*>(smem + L::delta_ring);
  typename L::Indices& indices = *reinterpret_cast<typename L::Indices*>(smem + L::indices);
  QueryTileWalk<Cfg, C>& walk = indices.walk;
  using Tile = typename L::Tile;
  constexpr int runs = L::runs, run_rows = L::run_rows;

  const KeyTileOwner own = key_tile_owner<Cfg>(p, R);
  // Whether the schedule lists query runs to pack into tiles (the host's choice for this pattern) or
  // whole tiles; the walk's entries are then runs or tiles.
  const bool packing = runs > 1 && p.k_query_rows == run_rows;
  const int entry_rows = packing ? run_rows : C;
  auto locate = [&](int j, int entries) {  // tile j of the walk
    return locate_packed<run_rows, runs, R / run_rows>(walk, p, own, j, entries, packing);
  };
  // A schedule item past the end of a short key sequence, or a key tile no query may see, walks
  // nothing; the CTA still counts itself done and converts its share of dQ. Another may still find
  // its pattern column empty once the walk is built: its K and V load for nothing, as it was cheaper
  // not to wait for the walk before requesting them.
  const bool has_keys = own.key0 < p.seq_k && QueryTileWalk<Cfg, C>::first_query_tile(p, own, entry_rows) <
                                                  (p.seq_q + entry_rows - 1) / entry_rows;

  auto barrier = [&](int index) { return base + L::barriers + 8 * index; };
  if (threadIdx.x == L::copy_warp * 32 + 1) {  // the descriptors of the walk's copies, fetched while it is built
    prefetch_tensor_map(maps.q);
    prefetch_tensor_map(maps.d_o);
    if constexpr (Cfg::atomic_dq) prefetch_tensor_map(maps.dq_accum);
    if constexpr (L::runs > 1) {
      prefetch_tensor_map(maps.q_runs);
      prefetch_tensor_map(maps.d_o_runs);
      if constexpr (Cfg::atomic_dq) prefetch_tensor_map(maps.dq_accum_runs);
    }
  }
  if (threadIdx.x == 0) {
    mbarrier_init(barrier(L::kv_ready), 1);
    for (int slot = 0; slot < stages; ++slot) {
      mbarrier_init(barrier(L::slot_full + slot), 32);  // the copy warp's lanes
      mbarrier_init(barrier(L::slot_empty + slot), L::math_warps);
    }
    for (int g = 0; g < 2; ++g) {
      mbarrier_init(barrier(L::dq_full + g), 1);
      mbarrier_init(barrier(L::dq_empty + g), 1);
      mbarrier_init(barrier(L::convert_full + g), 1);
      mbarrier_init(barrier(L::ds_full + g), L::math_threads);
      mbarrier_init(barrier(L::ds_empty + g), L::math_threads);
    }
    fence_barrier_init();
  }
  __syncthreads();  // the barriers are initialized before the copies that count into them
  // K and V before the walk is built (a chain of dependent loads of the schedule), so their copies
  // run under it.
  if (threadIdx.x == L::copy_warp * 32 && has_keys) {
    mbarrier_expect_bytes(barrier(L::kv_ready), 2 * L::own_bytes);
    tma_load_tile<D, R>(base + L::k_tile, maps.k, barrier(L::kv_ready), own.batch, own.kv_head, own.key0);
    tma_load_tile<D, R>(base + L::v_tile, maps.v, barrier(L::kv_ready), own.batch, own.kv_head, own.key0);
  }
  // Runs or tiles; build() ends with a __syncthreads.
  const int entries = has_keys ? walk.build(p, own, entry_rows) : 0;
  const int count = packing ? (entries + runs - 1) / runs : entries;  // tiles

  // Where a pattern splits tiles between the warpgroups, the math warps branch on their warpgroup
  // (below): the warp index is then read from lane 0, so that ptxas knows it is the same in every
  // lane of the warp and does not serialize the wgmma (C7520). Elsewhere the plain index: the code of
  // before (a version that read the shuffled index everywhere measured the dense backward 3-5% slower).
  // 128-query tiles (d = 64) do not branch: with both copies of the walk ptxas spilled 20-36 bytes
  // at pattern blocks of 16, 32 and 64 (none with one), so a warpgroup whose keys see none of a tile's
  // queries runs its products over scores its mask sets to -inf (P^T and dS^T zero).
  constexpr bool may_skip = L::key_groups == 2 && Tr::group_rows <= 64 && C == 64;
  const int warp = may_skip ? __shfl_sync(0xffffffffu, threadIdx.x / 32, 0) : threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= L::math_warps) {
    warpgroup_release_registers<L::helper_registers>();
    if (warp == L::copy_warp) {
      // The copy warp (its lane 0 requested K and V above): tile j's Q and dO into ring slot
      // j % stages (lane 0's copies), its rows' statistics (every lane) and where the tile is, all
      // counted into the slot's full barrier, whose phase flips once per use.
      for (int j = 0; j < count; ++j) {
        const int slot = j % stages;
        // Kernels that may pack: where tile j's runs are and their rows' statistics (a load a run,
        // then one a row) are in flight while the slot is still in use (a window of blocks of 16 ran
        // 9% slower than unpacked with them after the wait, 2-3% so; docs/attention-log.md, "Landed:
        // the dK/dV pass packs narrow query blocks"). The others locate and load after the wait, as
        // before: ahead of it, the dense backward measured 4-5% slower.
        Tile t;
        TileStats<C> stats;
        if constexpr (runs > 1) {
          t = locate(j, entries);
          stats = load_run_stats<C>(p, own.batch, t, lane);
        }
        if (j >= stages) mbarrier_wait(barrier(L::slot_empty + slot), (j / stages - 1) & 1);
        if constexpr (runs == 1) t = locate(j, entries);
        const unsigned full = barrier(L::slot_full + slot);
        if (lane == 0) {
          mbarrier_expect_bytes_only(full, 2 * L::other_bytes);
          const unsigned q_slot = base + L::q_ring + slot * L::other_bytes;
          const unsigned do_slot = base + L::do_ring + slot * L::other_bytes;
          if (t.contiguous()) {
            tma_load_tile<D, C>(q_slot, maps.q, full, own.batch, t.head_q[0], t.q0[0]);
            tma_load_tile<D, C>(do_slot, maps.d_o, full, own.batch, t.head_q[0], t.q0[0]);
          } else {
#pragma unroll
            for (int i = 0; i < runs; ++i) {
              tma_load_rows<D, run_rows, C>(q_slot, i * run_rows, maps.q_runs, full, own.batch, t.head_q[i], t.q0[i]);
              tma_load_rows<D, run_rows, C>(do_slot, i * run_rows, maps.d_o_runs, full, own.batch, t.head_q[i], t.q0[i]);
            }
          }
          indices.slot_tile[slot] = t;
        }
        if constexpr (runs == 1) stats = load_run_stats<C>(p, own.batch, t, lane);
        stats.store(lse2_ring + slot * C, delta_ring + slot * C, lane);
        mbarrier_arrive(full);
      }
    } else if (Cfg::atomic_dq && warp == L::dq_warp) {
      // The dQ warp: adds each warpgroup's dQ tile of tile j to the accumulator (bulk reductions of 32
      // dims each: two a warpgroup, one for the second at d = 96) and hands the buffer back once they
      // have read it.
      if (lane != 0) return;
      for (int j = 0; j < count; ++j) {
        const Tile t = locate(j, entries);
        for (int g = 0; g < 2; ++g) {
          mbarrier_wait(barrier(L::dq_full + g), j & 1);
          const int dim0 = D > 64 ? g * 64 : 0;
          // The tile's first query row in this warpgroup's dQ tile (L::dq_by_queries: its half).
          const int row0 = L::dq_by_queries ? g * 64 : 0;
          const unsigned tile = base + L::dq_tiles + g * L::dq_bytes;
          // Each 32-dim box of the tile, or of each real run's rows of it.
          auto add_rows = [&](const TensorMap& accum, unsigned rows_at, int head_q, int q0) {
            tma_reduce_add_4d(accum, rows_at, dim0, q0, head_q, own.batch);
            if (dim0 + 32 < D) tma_reduce_add_4d(accum, rows_at + L::dq_box_bytes, dim0 + 32, q0, head_q, own.batch);
          };
          if (t.contiguous()) {
            add_rows(maps.dq_accum, tile, t.head_q[0], t.q0[0] + row0);
          } else {
#pragma unroll
            for (int i = 0; i < runs; ++i) {
              const int r = i * run_rows - row0;  // the run's first row in this warpgroup's tile
              if (i < t.runs && r >= 0 && r < 64) add_rows(maps.dq_accum_runs, tile + r * 128, t.head_q[i], t.q0[i]);
            }
          }
          bulk_commit();
        }
        bulk_wait_read();
        mbarrier_arrive(barrier(L::dq_empty + 0));
        mbarrier_arrive(barrier(L::dq_empty + 1));
      }
      bulk_wait_done();  // the adds land before the group counts this CTA done
      add_release_after_bulk_writes(p.groups_done + own.group);
    } else if (Cfg::atomic_dq && own.group >= p.convert_lag) {
      convert_earlier_group<Cfg>(p, own.group - p.convert_lag, own.rank, own.ranks, threadIdx.x % 64, smem, base);
    }
    return;
  }

  // The math warps.
  warpgroup_claim_registers<L::math_registers>();
  // Also where the walk came out empty: dK and dV (zero) are staged over the K and V tiles, so their
  // copies must have landed first.
  if (has_keys) mbarrier_wait(barrier(L::kv_ready), 0);
  // The warpgroup; its keys (key_group: at d = 256 both warpgroups take the CTA's 64) and the first of
  // its dims of dK and dV (dim0).
  const int group = warp / 4, key_group = L::key_groups == 2 ? group : 0;
  const int warp_row0 = (L::key_groups == 2 ? warp : warp % 4) * 16, dim0 = L::dim_groups == 2 ? group * L::own_dims : 0;
  // This warpgroup's 64 keys of the K and V tiles, as K-major A operands.
  const unsigned k_rows = base + L::k_tile + key_group * 64 * 128, v_rows = base + L::v_tile + key_group * 64 * 128;
  // Its dims of the Q and dO slots, read transposed (N-major) by the dK and dV products: 64-column
  // blocks of C rows.
  const unsigned own_cols = (dim0 / 64) * C * 128;
  float dk[1][L::own_dims / 8][4], dv[1][L::own_dims / 8][4];
#pragma unroll
  for (int dt = 0; dt < L::own_dims / 8; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[0][dt][e] = dv[0][dt][e] = 0.f;
  if (L::dim_groups == 1 && group == 1) pass_turn<L::turn, L::math_threads>(group);  // warpgroup 0's turn first

  // Atomic dQ of tile i, a tile late: dQ = dS K for 64 queries x 64 dims, A = dS (M-major: stored by
  // key), B = K (N-major). At d = 128 warpgroup g takes dims 64g .. 64g + 63 over all 128 keys, so it
  // waits for both warpgroups' dS (the tile's full mbarrier); at d = 96 the second's dims 96 .. 127 are
  // K's zero padding, computed and dropped (a 64 x 32 product instead, in a branch on the warpgroup,
  // made ptxas serialize every wgmma of the kernel: 5.5 ms dense on the H100 against 4.7 for the
  // deterministic backward). At d = 64 (128-query tiles) warpgroup g takes queries 64g .. 64g + 63 of
  // the tile, all dims, over all 128 keys: its A is the dS tile's g-th 64-query column block. (64-query
  // tiles split dQ by keys instead, each warpgroup its own 64, two adds per element; with them the
  // pass's S^T and dP^T were m64n64 products and the d = 64 backward lost to the dQ pass.) `until_done`
  // waits for the product (with whatever else is in flight); the fp32 result then goes to shared memory
  // for the dQ warp's reductions. (The accumulator is local to this lambda: one captured by reference
  // would live in local memory.)
  auto dq_product = [&](int i, auto&& until_done) {
    constexpr bool by_dims = D > 64, by_queries = L::dq_by_queries;
    constexpr int key_steps = by_dims || by_queries ? R / 16 : 64 / 16;
    const bool narrow = D == 96 && group == 1;
    const unsigned ds_tile = L::ds_tiles + (i % 2) * L::ds_bytes;
    const unsigned a_tile = base + ds_tile + (by_dims ? 0 : by_queries ? group * R * 128 : group * 64 * 128);
    const unsigned b_tile = base + L::k_tile + (by_dims ? group * R * 128 : by_queries ? 0 : group * 64 * 128);
    float dq[8][4];
    mbarrier_wait(barrier(L::ds_full + i % 2), (i / 2) & 1);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < key_steps; ++kk)
      wgmma_ss_transposed<T>(dq, nmajor_descriptor(a_tile, R, kk), nmajor_descriptor(b_tile, R, kk), kk > 0);
    wgmma_commit();
    until_done();
    wgmma_fence_operands(dq);
    mbarrier_arrive(barrier(L::ds_empty + i % 2));  // this thread's dQ product is done with the dS tile
    // The warpgroup's dQ tile into shared memory, once the dQ warp has read the previous one.
    if (i > 0) mbarrier_wait(barrier(L::dq_empty + group), (i - 1) & 1);
    const unsigned dq_tile = L::dq_tiles + group * L::dq_bytes;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (narrow && nt >= 4) continue;  // dims 96 .. 127: nothing reads them
        const int row = (warp % 4) * 16 + lane / 4 + h * 8, col = nt * 8 + 2 * (lane % 4);
        *reinterpret_cast<float2*>(smem + dq_tile + swizzled_offset<4>(64, row, col)) =
            make_float2(dq[nt][2 * h], dq[nt][2 * h + 1]);
      }
    fence_proxy_async();
    warpgroup_barrier(group);
    if (threadIdx.x % 128 == 0) mbarrier_arrive(barrier(L::dq_full + group));
  };

  for (int j = 0; j < count; ++j) {
    const int slot = j % stages;
    mbarrier_wait(barrier(L::slot_full + slot), (j / stages) & 1);  // tile j's Q, dO and statistics
    const Tile& t = indices.slot_tile[slot];
    const unsigned q_slot = base + L::q_ring + slot * L::other_bytes;
    const unsigned do_slot = base + L::do_ring + slot * L::other_bytes;
    const float* lse2 = lse2_ring + slot * C;
    const float* delta = delta_ring + slot * C;

    // Where this warpgroup's keys see none of the tile's queries (pattern blocks of 64 keys or fewer
    // split a tile between the warpgroups: at density 0.1 nearly every tile of blocks of 64 is active
    // for one of them only), it skips the tile's products but the dQ one, and its dS^T is zero. The
    // rest of the tile comes in two copies, active or not, chosen once: ptxas serializes every wgmma
    // where one still runs as two ways meet again (C7515), or around a branch it deems divergent
    // (C7520: `group` comes from a shuffle, so it knows the branch is the same for a whole warp).
    auto walk_tile = [&](auto keys) {
      constexpr bool active = decltype(keys)::value;
      // S^T and dP^T in two groups, in this warpgroup's turn: P = exp2(..) runs while dP^T is still in
      // the tensor cores, and the turn passes once S^T is done.
      float s[1][Tr::n_tiles][4], ds[1][Tr::n_tiles][4];  // S^T and dP^T: this warp's keys x the tile's queries
      unsigned pa[C / 16][4], dsa[C / 16][4];  // P^T and dS^T as the A fragments of C / 16 k-steps
      take_turn<L::turn, L::math_threads>(group);
      if constexpr (active) {
        wgmma_fence();
        wgmma_ss_steps<T, C, Tr::k_steps>(s[0], k_rows, R, q_slot);
        wgmma_commit();
        wgmma_ss_steps<T, C, Tr::k_steps>(ds[0], v_rows, R, do_slot);
        wgmma_commit();
        wgmma_wait<1>();
        wgmma_fence_operands(s[0]);
      }
      pass_turn<L::turn, L::math_threads>(group);  // S^T is done

      if constexpr (active) {
        // The pattern masks nothing of this warpgroup's keys where all their blocks are active.
        const unsigned long long own_bits = warpgroup_mask_bits<Cfg>(group);
        Tile own_tile = t;
        if ((t.mask & own_bits) == own_bits) own_tile.mask = kWholeTile;
        if (backward_tile_needs_mask<Cfg>(p, own_tile, own.key0, R))
          mask_backward_tile<Cfg, true>(s, p, own.key0, own_tile, warp_row0, own_tile.mask);
        probabilities_from_scores<Tr>(s, lse2, p.scale_log2);
        wgmma_wait<0>();
        wgmma_fence_operands(ds[0]);
        score_gradients<Tr>(ds, s, delta);
#pragma unroll
        for (int kk = 0; kk < C / 16; ++kk) {
          pack_a_fragment<T>(s[0], kk, pa[kk]);
          pack_a_fragment<T>(ds[0], kk, dsa[kk]);
        }

        // dV += P^T dO and dK += dS^T Q (scaled at the end), dO and Q read transposed.
        wgmma_fence();  // pa and dsa written by ordinary instructions
        wgmma_fence_operands(dk[0]);
        wgmma_fence_operands(dv[0]);
        // (own_dims is D here; d = 256's kernel, which never calls this copy, compiles it too.)
        wgmma_rs_steps<T, L::own_dims, C / 16>(dv[0], pa, do_slot, C);
        wgmma_rs_steps<T, L::own_dims, C / 16>(dk[0], dsa, q_slot, C);
        wgmma_commit();
      }

      if constexpr (Cfg::atomic_dq) {
        // dS^T into tile j's [keys][queries] buffer (64 queries are one 128-byte swizzled row a key),
        // once both warpgroups' dQ products of tile j - 2 are done with it; then the dQ product of the
        // tile before, whose dS both warpgroups have written by now.
        const unsigned ds_tile = L::ds_tiles + (j % 2) * L::ds_bytes;
        if (j >= 2) mbarrier_wait(barrier(L::ds_empty + j % 2), ((j - 2) / 2) & 1);
#pragma unroll
        for (int nt = 0; nt < Tr::n_tiles; ++nt)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int key = warp_row0 + lane / 4 + h * 8, query = nt * 8 + 2 * (lane % 4);
            *reinterpret_cast<unsigned*>(smem + ds_tile + swizzled_offset(R, key, query)) =
                active ? dsa[nt / 2][(nt % 2) * 2 + h] : 0u;
          }
        fence_proxy_async();
        mbarrier_arrive(barrier(L::ds_full + j % 2));
      }
      auto tile_done = [&] {
        wgmma_wait<0>();
        if constexpr (active) {
          wgmma_fence_operands(dk[0]);
          wgmma_fence_operands(dv[0]);
          wgmma_fence_operands(pa);
          wgmma_fence_operands(dsa);
        }
        // This warp's products that read tile j's Q and dO are complete: release the slot.
        __syncwarp();
        if (lane == 0) mbarrier_arrive(barrier(L::slot_empty + slot));
      };
      if constexpr (Cfg::atomic_dq) {
        if (j > 0) dq_product(j - 1, tile_done);
        else tile_done();
      } else {
        tile_done();
      }
    };
    // d = 256: S^T (warpgroup 0) or dP^T (warpgroup 1) over all 256 dims, one product each, and the
    // hand-overs between them (see the layout), then each warpgroup's dims of dV and dK. The products
    // are issued outside any branch on the warpgroup (only their operands differ), so that ptxas
    // serializes none. (Generic, so that kernels of other head dims do not compile it.)
    auto walk_tile_by_roles = [&](auto) {
      float s[1][Tr::n_tiles][4];  // S^T then P^T (warpgroup 0), or dP^T then dS^T (warpgroup 1)
      unsigned pa[C / 16][4], dsa[C / 16][4];
      const typename L::HandOver share(smem + L::ds_tiles);
      wgmma_fence();
      wgmma_ss_steps<T, C, Tr::k_steps>(s[0], group == 0 ? k_rows : v_rows, R, group == 0 ? q_slot : do_slot);
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_fence_operands(s[0]);
      if (group == 0) {
        if (backward_tile_needs_mask<Cfg>(p, t, own.key0, R)) mask_backward_tile<Cfg, true>(s, p, own.key0, t, warp_row0, t.mask);
        probabilities_from_scores<Tr>(s, lse2, p.scale_log2);
        share.send_p(s[0]);
#pragma unroll
        for (int kk = 0; kk < C / 16; ++kk) pack_a_fragment<T>(s[0], kk, pa[kk]);
      } else {
        share.wait_for_p();
#pragma unroll
        for (int kk = 0; kk < C / 16; ++kk) {
          float pt[2][4];  // P^T of k-step kk: accumulator chunks 2 kk and 2 kk + 1
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int nt = 2 * kk + h;
            const float4 v = share.p_chunk(nt);
            pt[h][0] = v.x, pt[h][1] = v.y, pt[h][2] = v.z, pt[h][3] = v.w;
#pragma unroll
            for (int e = 0; e < 4; ++e) s[0][nt][e] = pt[h][e] * (s[0][nt][e] - delta[nt * 8 + 2 * (lane % 4) + e % 2]);
          }
          pack_a_fragment<T>(pt, 0, pa[kk]);
          pack_a_fragment<T>(s[0], kk, dsa[kk]);
        }
        share.put_ds(dsa);
      }
      // dV += P^T dO for this warpgroup's dims, then (once warpgroup 1 has handed dS^T over) dK += dS^T Q.
      wgmma_fence();  // pa written by ordinary instructions
      wgmma_fence_operands(dv[0]);
      wgmma_rs_steps<T, L::own_dims, C / 16>(dv[0], pa, do_slot + own_cols, C);
      wgmma_commit();
      share.take_ds(dsa);
      wgmma_fence();
      wgmma_fence_operands(dk[0]);
      wgmma_rs_steps<T, L::own_dims, C / 16>(dk[0], dsa, q_slot + own_cols, C);
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_fence_operands(dk[0]);
      wgmma_fence_operands(dv[0]);
      wgmma_fence_operands(pa);
      wgmma_fence_operands(dsa);
      __syncwarp();
      if (lane == 0) mbarrier_arrive(barrier(L::slot_empty + slot));  // the warp is done with tile j's slot
    };
    if constexpr (L::dim_groups == 2) {
      walk_tile_by_roles(0);
    } else {
      // Without a pattern that splits tiles (may_skip) only the causal edge (a tile a key tile) and the
      // key sequence's end make a warpgroup's keys inactive, and their masks handle that: one copy (the
      // second made ptxas spill at d = 128).
      if (!may_skip || warpgroup_keys_active<Cfg>(p, group, own.key0, t.last_query(), t.mask)) walk_tile(WarpgroupActive<true>{});
      else walk_tile(WarpgroupActive<false>{});
    }
  }
  if constexpr (Cfg::atomic_dq)
    if (count > 0) dq_product(count - 1, [] { wgmma_wait<0>(); });  // the last tile's

  named_barrier(L::math_barrier, L::math_threads);  // every math warp is done with the tiles staged over
  T* staging = reinterpret_cast<T*>(smem);
  T* dk_out = static_cast<T*>(p.dk) + own.batch * p.dk_batch_stride + own.kv_head * p.dk_head_stride;
  T* dv_out = static_cast<T*>(p.dv) + own.batch * p.dv_batch_stride + own.kv_head * p.dv_head_stride;
  // At d = 256 the two warps of a row slice each store their dims of it.
  store_rows<Tr, L::own_dims>(dk, p.scale, staging + dim0, dk_out + dim0, p.dk_row_stride, own.key0, p.seq_k, warp_row0);
  store_rows<Tr, L::own_dims>(dv, 1.f, staging + L::staging_elems + dim0, dv_out + dim0, p.dv_row_stride, own.key0,
                              p.seq_k, warp_row0);
}

}  // namespace sjit_kernels

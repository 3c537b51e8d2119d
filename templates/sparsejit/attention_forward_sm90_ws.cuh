// Attention forward on Hopper (sm_90a), warp-specialized and persistent (the structure of
// FlashAttention-3, Shah et al. 2024): the same work items, masks, online softmax and wgmma products as
// attention_forward_sm90.cuh (WarpgroupRows), but one CTA an SM walks work items gridDim.x apart, and
// a warp of its own keeps the copies ahead of the math across items.
//
// Why: at low density a work item is a few key tiles, and a CTA's prologue (Q and the first K/V tile
// from DRAM) and epilogue (O's stores) weigh as much as several tiles. One CTA per item overlaps them
// only with the other CTA of the SM, and equal walks (random patterns) put both CTAs' prologues at the
// same moment. Here the copy warp loads the next item's Q as soon as the math warps have read the
// current one (after their last S = Q K^T), and its first K/V tiles as soon as ring slots free up, so
// the next item's data lands while the current item's last products, softmax and stores run.
//
// A CTA is Cfg::warps math warps (warps / 4 warpgroups of 64 query rows) plus one warpgroup that gives
// its registers to them (setmaxnreg) and of which one thread issues every copy. They meet only on
// mbarriers, never on a CTA barrier:
//   q_full        Q has landed (the copy thread's expect-bytes and the copy's bytes);
//   q_empty       every math warp has completed its last S = Q K^T of the item (one arrival a warp);
//   kv_full[s]    ring slot s holds its tile's K and V;
//   kv_empty[s]   every math warp's products are done with ring slot s.
// Both sides walk the same item sequence and count Q loads and K/V tiles the same way, so they agree
// on every barrier's phase without exchanging anything. The output is staged through padded rows of a
// buffer of its own (Q's is being refilled by then) and stored with 16-byte stores.
#pragma once

#include "sparsejit/attention_forward_sm90.cuh"

namespace sjit_kernels {

template <class Cfg>
struct AttentionWsLayout {
  using Tr = AttentionForwardTraits<Cfg>;
  using Base = AttentionSm90Layout<Cfg>;  // its static_asserts hold here too
  static constexpr int math_threads = Tr::threads, threads = math_threads + 128;
  static constexpr int copy_warp = Cfg::warps;
  // Two math warpgroups: 2 x 128 x 240 + 128 x 24 registers fit the 65536 of the SM (the launch gives
  // 168 a thread). One math warpgroup has 255 a thread without moving any.
  static constexpr bool move_registers = Cfg::warps == 8;
  static constexpr int math_registers = 240, copy_registers = 24;
  static constexpr int q_bytes = Base::q_bytes, kv_bytes = Base::kv_bytes;
  static constexpr int q_tile = 0, k_ring = q_bytes;  // offsets from the 1024-aligned base; V follows K
  static constexpr int staging = q_bytes + 2 * Cfg::stages * kv_bytes;
  static constexpr int staging_bytes = Tr::block_m * Tr::row_elems * 2;
  static constexpr int barriers = staging + staging_bytes;
  static constexpr int q_full = 0, q_empty = 1, kv_full = 2, kv_empty = 2 + Cfg::stages, barrier_count = 2 + 2 * Cfg::stages;
  static constexpr int used_bytes = barriers + 8 * barrier_count;
};

template <class Cfg>
__global__ void __launch_bounds__(AttentionWsLayout<Cfg>::threads, 1)
    attention_forward_sm90_ws(const AttentionForwardParams p, const __grid_constant__ AttentionForwardTensorMaps maps) {
  using Tr = AttentionForwardTraits<Cfg>;
  using L = AttentionWsLayout<Cfg>;
  using T = typename Tr::T;
  constexpr int stages = Cfg::stages;
  extern __shared__ __align__(1024) unsigned char shared_ws[];
  const unsigned align = (1024 - (smem_address(shared_ws) & 1023)) & 1023;
  // No launch may give less than the layout: the host's figure (codegen) is written apart from it.
  if (dynamic_shared_bytes() < L::used_bytes + align) __trap();
  unsigned char* smem = shared_ws + align;
  const unsigned base = smem_address(smem);
  auto barrier = [&](int index) { return base + L::barriers + 8 * index; };

  if (threadIdx.x == 0) {
    mbarrier_init(barrier(L::q_full), 1);
    mbarrier_init(barrier(L::q_empty), L::math_threads);
    for (int slot = 0; slot < stages; ++slot) {
      mbarrier_init(barrier(L::kv_full + slot), 1);
      mbarrier_init(barrier(L::kv_empty + slot), L::math_threads);
    }
    fence_barrier_init();
  }
  __syncthreads();  // the barriers are initialized before anyone waits on them

  // The warp index read from lane 0: the compiler then knows it is the same in every lane, and so that
  // the math warps' branch is not divergent (it would serialize their wgmma otherwise, ptxas C7520).
  const int warp = __shfl_sync(0xffffffffu, threadIdx.x / 32, 0), lane = threadIdx.x % 32;
  if (warp >= Cfg::warps) {
    if constexpr (L::move_registers) warpgroup_release_registers<L::copy_registers>();
    if (warp != L::copy_warp || lane != 0) return;
    // The copy thread: for each item with key tiles, Q once the math warps are done reading the last
    // item's, then the item's K/V tiles, each into the next ring slot once the math warps free it.
    int q_loads = 0, tiles_loaded = 0;
    for (unsigned item = blockIdx.x; item < unsigned(p.work_items); item += gridDim.x) {
      const WorkItem w = work_item_head_major<Cfg>(p, item);
      const int q_row0 = w.q_tile * Tr::block_m;
      if (q_row0 >= p.seq_q || w.tiles.count == 0) continue;
      if (q_loads > 0) mbarrier_wait(barrier(L::q_empty), (q_loads - 1) & 1);
      mbarrier_expect_bytes(barrier(L::q_full), L::q_bytes);
      tma_load_tile<Tr::head_dim, Tr::block_m>(base + L::q_tile, maps.q, barrier(L::q_full), w.batch, w.head_q, q_row0);
      ++q_loads;
      const int kv_head = w.head_q / (p.heads_q / p.heads_kv);
      for (int j = 0; j < w.tiles.count; ++j, ++tiles_loaded) {
        const int slot = tiles_loaded % stages;
        if (tiles_loaded >= stages) mbarrier_wait(barrier(L::kv_empty + slot), (tiles_loaded / stages - 1) & 1);
        const int key0 = w.tiles.tile(j) * Tr::block_n;
        const unsigned full = barrier(L::kv_full + slot);
        mbarrier_expect_bytes(full, 2 * L::kv_bytes);
        tma_load_tile<Tr::head_dim, Tr::block_n>(base + L::k_ring + slot * L::kv_bytes, maps.k, full, w.batch, kv_head,
                                                 key0);
        tma_load_tile<Tr::head_dim, Tr::block_n>(base + L::k_ring + (stages + slot) * L::kv_bytes, maps.v, full,
                                                 w.batch, kv_head, key0);
      }
    }
    return;
  }

  // The math warps.
  if constexpr (L::move_registers) warpgroup_claim_registers<L::math_registers>();
  const unsigned q_rows = base + L::q_tile + (threadIdx.x / 128) * 64 * 128;  // this warpgroup's rows of Q
  T* staging = reinterpret_cast<T*>(smem + L::staging);
  int q_loads = 0, tiles_seen = 0;
  for (unsigned item = blockIdx.x; item < unsigned(p.work_items); item += gridDim.x) {
    const WorkItem w = work_item_head_major<Cfg>(p, item);
    const int q_row0 = w.q_tile * Tr::block_m;
    if (q_row0 >= p.seq_q) continue;  // a schedule item past the end of a short sequence
    const KeyTiles& tiles = w.tiles;
    WarpgroupRows<Cfg> rows;
    rows.reset();
    if (tiles.count > 0) mbarrier_wait(barrier(L::q_full), q_loads++ & 1);
    auto acquire = [&](int j) {
      const int n = tiles_seen + j;
      mbarrier_wait(barrier(L::kv_full + n % stages), (n / stages) & 1);
      return n % stages;
    };
    auto scores_read = [&](int j) { mbarrier_arrive_if(barrier(L::q_empty), j == tiles.count - 1); };
    auto release = [&](int slot) { mbarrier_arrive(barrier(L::kv_empty + slot)); };
    rows.walk(p, tiles, q_row0, q_rows, base + L::k_ring, acquire, scores_read, release);
    tiles_seen += tiles.count;

    T* out = static_cast<T*>(p.o) + w.batch * p.o_batch_stride + w.head_q * p.o_head_stride;
    float* lse_row0 =
        p.lse ? p.lse + (static_cast<long long>(w.batch) * p.heads_q + w.head_q) * p.seq_q + q_row0 : nullptr;
    __syncwarp();  // every lane has read the warp's staged rows of the previous item
    store_output<Tr>(rows.o, rows.row_max, rows.row_sum, staging, out, p.o_row_stride, lse_row0, q_row0, warp * 16,
                     p.seq_q);
  }
}

}  // namespace sjit_kernels

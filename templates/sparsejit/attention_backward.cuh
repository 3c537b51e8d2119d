// Attention backward (FlashAttention-2, Dao 2023, Algorithm 2) in three kernels:
//   prep:  delta_i = rowsum(dO_i * O_i) and lse2_i = lse_i * log2(e) (+inf for a row that saw no key)
//   dkdv:  one CTA per key tile: walks the query tiles that see it (the transposed pattern) and
//          accumulates dV += P^T dO and dK += scale * dS^T Q in registers, over every query head of
//          the K/V head's group (grouped-query attention sums there). With atomic dQ (Cfg::atomic_dq)
//          it also adds dS K for each query tile to the fp32 accumulator with atomics.
//   dq:    deterministic: one CTA per query tile walks its key tiles (the forward's schedule) and
//          accumulates dQ += scale * dS K in registers, recomputing P and dP (no atomics anywhere, the
//          same inputs give the same bits). Atomic: dQ = scale * accumulator, rounded to T, and the
//          accumulator back to zero (it is zeroed once, when allocated, and left zero by every pass);
//          after the Hopper dK/dV pass, which converts most groups itself, only the last groups.
// with P = exp2(S * scale * log2(e) - lse2) recomputed from Q and K, dP = dO V^T, dS = P * (dP - delta).
// Atomic dQ does five tile products a (query tile, key tile) pair instead of seven; the price is a
// [B, Hq, Sq, D] fp32 accumulator and a summation order that varies between runs.
//
// As in the forward, the tiles a CTA visits are a list known before any load, so an inactive tile is
// never loaded, waited for or synchronized on; element masks run only on tiles that need them.
#pragma once

#include "sparsejit/attention_forward.cuh"

namespace sjit_kernels {

// Cfg: T, head_dim, warps, block_cols, stages, causal, sparsity, pattern_block.
// A CTA owns block_rows = 16 * warps rows (keys for dkdv, queries for dq), one mma tile a warp, and
// walks tiles of block_cols columns of the other side.
template <class Cfg>
struct BackwardTraits {
  using T = typename Cfg::T;
  static constexpr int head_dim = Cfg::head_dim;
  static constexpr int warps = Cfg::warps;
  static constexpr int threads = 32 * warps;
  static constexpr int m_tiles = 1;
  static constexpr int block_rows = 16 * warps;
  static constexpr int block_n = Cfg::block_cols;  // named as in the forward: score_tile and
  static constexpr int n_tiles = block_n / 8;      // accumulate_values serve both directions
  static constexpr int d_tiles = head_dim / 8;
  static constexpr int k_steps = head_dim / 16;
  static constexpr int row_elems = TileGeometry<head_dim>::row_elems;
  static constexpr int own_tile_elems = block_rows * row_elems;
  static constexpr int other_tile_elems = block_n * row_elems;
  static constexpr int group_rows = Cfg::pattern_block < block_rows ? Cfg::pattern_block : block_rows;
  static constexpr int group_cols = Cfg::pattern_block < block_n ? Cfg::pattern_block : block_n;
  static constexpr int groups_per_tile_row = block_n / group_cols;
  static_assert(block_n % 16 == 0, "block_cols must be a multiple of 16");
};

// Whether the tile of queries [q0, q0 + q_rows) x keys [key0, key0 + key_rows) needs an element mask:
// it crosses a sequence end or the causal edge, or its pattern blocks are smaller than the tile.
template <class Cfg>
__device__ __forceinline__ bool backward_tile_needs_mask(const AttentionBackwardParams& p, int q0, int q_rows,
                                                         int key0, int key_rows, unsigned long long pattern_mask) {
  const bool partial = q0 + q_rows > p.seq_q || key0 + key_rows > p.seq_k;
  const bool causal_edge = Cfg::causal != kNotCausal &&
                           key0 + key_rows - 1 > q0 + (Cfg::causal == kCausalBottomRight ? p.seq_k - p.seq_q : 0);
  return partial || causal_edge || pattern_mask != kWholeTile;
}

// The index of a tile's column c (a constant of the unrolled loops), where the tile's columns are
// contiguous from col0.
__device__ __forceinline__ int column_index(int col0, int c) { return col0 + c; }

// Scores of masked elements to -inf. Rows are `row0 + r` and columns `column_index(cols, c)` of the
// score tile: `cols` is the first column's index, or in the Hopper dK/dV pass the tile's
// PackedQueries (runs of queries from several places). `keys_are_rows` says which side is the key
// (dkdv computes S^T). Pattern bits index the tile's (row group, column group) in the same
// orientation as the schedule that produced them (a whole tile's mask is all ones).
template <class Cfg, bool keys_are_rows, class Tr = BackwardTraits<Cfg>, class Cols>
__device__ __forceinline__ void mask_backward_tile(float (&s)[1][Tr::n_tiles][4], const AttentionBackwardParams& p,
                                                   int row0, const Cols& cols, int warp_row0,
                                                   unsigned long long pattern_mask) {
  const int lane = threadIdx.x % 32;
  const int offset = Cfg::causal == kCausalBottomRight ? p.seq_k - p.seq_q : 0;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = warp_row0 + lane / 4 + h * 8;
    const int row_bit = tile_mask_row_bit<Tr>(r);
#pragma unroll
    for (int nt = 0; nt < Tr::n_tiles; ++nt) {
      const bool block_active = tile_mask_active<Tr>(pattern_mask, row_bit, nt);
#pragma unroll
      for (int e = 2 * h; e < 2 * h + 2; ++e) {
        const int c = nt * 8 + 2 * (lane % 4) + (e % 2);
        const int key = keys_are_rows ? row0 + r : column_index(cols, c);
        const int query = keys_are_rows ? column_index(cols, c) : row0 + r;
        bool allowed = block_active && key < p.seq_k && query < p.seq_q;
        if constexpr (Cfg::causal != kNotCausal) allowed = allowed && key <= query + offset;
        if (!allowed) s[0][nt][e] = -infinity();
      }
    }
  }
}

// The Hopper kernels' two copies of a tile's work, for a warpgroup whose rows are active in the tile
// and for one whose are not (attention_backward_sm90.cuh, attention_backward_dq_sm90.cuh).
template <bool ACTIVE>
struct WarpgroupActive {
  static constexpr bool value = ACTIVE;
};

// The bits of a tile's pattern mask that cover the 64 rows of the Hopper kernels' warpgroup `group`
// (keys in the dK/dV pass, queries in the dQ pass), where pattern blocks are 64 rows or fewer; with
// larger blocks all of them.
template <class Cfg>
__device__ __forceinline__ unsigned long long warpgroup_mask_bits(int group) {
  using Tr = BackwardTraits<Cfg>;
  if constexpr (Tr::group_rows <= 64) {
    return tile_mask_rows<Tr, 64>(64 * group);
  } else {
    return kWholeTile;
  }
}

// The dK/dV pass's element-wise steps on the warp's S^T fragments (its keys x the tile's queries, whose
// lse2 and delta are indexed by column): P^T = exp2(S^T scale log2(e) - lse2) in place, and then
// dS^T = P^T (dP^T - delta) in place over dP^T.
template <class Tr>
__device__ __forceinline__ void probabilities_from_scores(float (&s)[1][Tr::n_tiles][4], const float* lse2,
                                                          float scale_log2) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int nt = 0; nt < Tr::n_tiles; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[0][nt][e] = fast_exp2(fmaf(s[0][nt][e], scale_log2, -lse2[nt * 8 + 2 * (lane % 4) + e % 2]));
}
// The dQ pass's P = exp2(S scale log2(e) - lse2) in place, on the warp's S fragments (its queries x the
// tile's keys: a thread's two rows' lse2 in registers).
template <class Tr>
__device__ __forceinline__ void probabilities_from_row_scores(float (&s)[1][Tr::n_tiles][4], const float (&lse2)[2],
                                                              float scale_log2) {
#pragma unroll
  for (int nt = 0; nt < Tr::n_tiles; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[0][nt][e] = fast_exp2(fmaf(s[0][nt][e], scale_log2, -lse2[e / 2]));
}
template <class Tr>
__device__ __forceinline__ void score_gradients(float (&dp)[1][Tr::n_tiles][4], const float (&p)[1][Tr::n_tiles][4],
                                                const float* delta) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int nt = 0; nt < Tr::n_tiles; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) dp[0][nt][e] = p[0][nt][e] * (dp[0][nt][e] - delta[nt * 8 + 2 * (lane % 4) + e % 2]);
}

// Writes the warp's rows of a [rows, DIMS] fp32 accumulator times `factor` as T, staged through the
// warp's own rows of `staging` (a tile only this warp reads) for 16-byte coalesced stores. DIMS is the
// head dim, or where warps split the dims (the Hopper kernels at d = 256) the warp's columns, which
// `staging` and `out` then point to.
template <class Tr, int DIMS = Tr::head_dim>
__device__ __forceinline__ void store_rows(float (&acc)[1][DIMS / 8][4], float factor, typename Tr::T* staging,
                                           typename Tr::T* out, long long row_stride, int row0, int rows_total,
                                           int warp_row0) {
  using T = typename Tr::T;
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int dt = 0; dt < DIMS / 8; ++dt) {
      const int r = warp_row0 + lane / 4 + h * 8;
      *reinterpret_cast<unsigned*>(staging + r * Tr::row_elems + dt * 8 + 2 * (lane % 4)) =
          pack2<T>(acc[0][dt][2 * h] * factor, acc[0][dt][2 * h + 1] * factor);
    }
  __syncwarp();
  constexpr int chunks = DIMS / 8;
  for (int i = lane; i < 16 * chunks; i += 32) {
    const int r = warp_row0 + i / chunks, c = i % chunks;
    if (row0 + r < rows_total)
      *reinterpret_cast<uint4*>(out + (row0 + r) * row_stride + c * 8) =
          *reinterpret_cast<const uint4*>(staging + r * Tr::row_elems + c * 8);
  }
}

// A query row of the per-row kernels (prep, dq_convert) and of the dQ conversion inside the Hopper
// dK/dV pass.
struct QueryRow {
  long long row;  // flat (batch, head, i), the index of lse, delta and lse2
  int batch, head, i;
  bool valid;     // false past the last row
};
__device__ __forceinline__ QueryRow query_row(const AttentionBackwardParams& p, long long row) {
  QueryRow r;
  r.row = row;
  r.valid = row < static_cast<long long>(p.batch) * p.heads_q * p.seq_q;
  r.i = r.valid ? static_cast<int>(row % p.seq_q) : 0;
  r.head = r.valid ? static_cast<int>(row / p.seq_q % p.heads_q) : 0;
  r.batch = r.valid ? static_cast<int>(row / p.seq_q / p.heads_q) : 0;
  return r;
}

// The per-row kernels' threads (see per_row_lanes): the j-th row of this thread, counting from
// first_row, and the 8-element chunk of it that is this thread's (chunks past D / 8 are idle).
template <int D>
struct PerRowSlot {
  static constexpr int lanes = per_row_lanes(D), rows_per_pass = 256 / lanes;
  static constexpr int rows = kPerRowRowsPerThread, chunks = D / 8, cta_rows = per_row_cta_rows(D);
  static_assert(chunks <= lanes && lanes <= 32, "a row's chunks on one segment of a warp");
  static __device__ __forceinline__ QueryRow row(const AttentionBackwardParams& p, long long first_row, int j,
                                                  unsigned cta = blockIdx.x) {
    return query_row(p, first_row + static_cast<long long>(cta) * cta_rows + j * rows_per_pass + threadIdx.x / lanes);
  }
  static __device__ __forceinline__ int chunk() { return threadIdx.x % lanes; }
};

// Atomic dQ's conversion, 8 elements of a row at a time: the accumulator's fp32 values (read past L1:
// other CTAs added them), then dQ = scale * them as T and zeros back in the accumulator. Split in two
// so a caller can have several chunks' loads in flight before their stores.
struct DqChunk {
  float4 lo, hi;
};
template <int D>
__device__ __forceinline__ DqChunk load_dq_chunk(const AttentionBackwardParams& p, long long row, int chunk) {
  const float4* acc = reinterpret_cast<const float4*>(p.dq_accum + row * D + chunk * 8);
  return {__ldcg(acc), __ldcg(acc + 1)};
}
template <class T, int D>
__device__ __forceinline__ void store_dq_chunk(const AttentionBackwardParams& p, const QueryRow& r, int chunk,
                                               const DqChunk& c) {
  uint4 packed;
  packed.x = pack2<T>(c.lo.x * p.scale, c.lo.y * p.scale);
  packed.y = pack2<T>(c.lo.z * p.scale, c.lo.w * p.scale);
  packed.z = pack2<T>(c.hi.x * p.scale, c.hi.y * p.scale);
  packed.w = pack2<T>(c.hi.z * p.scale, c.hi.w * p.scale);
  T* dq = static_cast<T*>(p.dq) + r.batch * p.dq_batch_stride + r.head * p.dq_head_stride + r.i * p.dq_row_stride;
  *reinterpret_cast<uint4*>(dq + chunk * 8) = packed;
  float4* acc = reinterpret_cast<float4*>(p.dq_accum + r.row * D + chunk * 8);
  __stcg(acc, make_float4(0.f, 0.f, 0.f, 0.f));
  __stcg(acc + 1, make_float4(0.f, 0.f, 0.f, 0.f));
}

// delta_i = sum_d dO_id * O_id and lse2_i, every load of a thread's rows issued before the sums. The
// first B * Hkv rows' threads also reset the groups' done counters of atomic dQ's conversion in the
// Hopper dK/dV pass.
// CTAs take the rows last to first: the forward writes O head by head, so in a training step the
// last heads' O is still in L2 when the backward starts (2-3 us of the 51 after a forward, in Nsight
// Compute without cache flushes), and the first heads' dO, which the dK/dV pass reads first, is in L2
// when it ends.
template <class Cfg>
__global__ void __launch_bounds__(256) attention_backward_prep(const AttentionBackwardParams p) {
  using T = typename Cfg::T;
  using Slot = PerRowSlot<Cfg::head_dim>;
  const int chunk = Slot::chunk();
  QueryRow w[Slot::rows];
  float a[Slot::rows][8], b[Slot::rows][8];
#pragma unroll
  for (int j = 0; j < Slot::rows; ++j) {
    w[j] = Slot::row(p, 0, j, gridDim.x - 1 - blockIdx.x);
    if (w[j].valid && chunk < Slot::chunks) {
      const T* o = static_cast<const T*>(p.o) + w[j].batch * p.o_batch_stride + w[j].head * p.o_head_stride +
                   w[j].i * p.o_row_stride;
      const T* d_o = static_cast<const T*>(p.d_o) + w[j].batch * p.do_batch_stride +
                     w[j].head * p.do_head_stride + w[j].i * p.do_row_stride;
      load_packet<T, 8>(o + chunk * 8, a[j]);
      load_packet<T, 8>(d_o + chunk * 8, b[j]);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) a[j][e] = b[j][e] = 0.f;
    }
  }
#pragma unroll
  for (int j = 0; j < Slot::rows; ++j) {
    float dot = 0.f;
#pragma unroll
    for (int e = 0; e < 8; ++e) dot = fmaf(a[j][e], b[j][e], dot);
#pragma unroll
    for (int m = Slot::lanes / 2; m >= 1; m /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, m);
    const long long row = w[j].row;
    if (chunk == 0 && w[j].valid) {
      if (Cfg::atomic_dq && row < static_cast<long long>(p.batch) * p.heads_kv) p.groups_done[row] = 0;
      p.delta[row] = dot;
      const float lse = p.lse[row];
      // A row that saw no key has P = 0 everywhere: +inf makes exp2(s - lse2) exactly 0, never NaN.
      p.lse2[row] = lse == -infinity() ? infinity() : lse * 1.4426950408889634f;
    }
  }
}

// Query row q of (batch, head_q)'s lse2 and delta. Rows past the end get lse2 = +inf (P = 0) and
// delta = 0, as for a row that saw no key.
struct RowStats {
  float lse2, delta;
};
__device__ __forceinline__ RowStats row_stats(const AttentionBackwardParams& p, int batch, int head_q, int q) {
  if (q >= p.seq_q) return {infinity(), 0.f};
  const long long row = (static_cast<long long>(batch) * p.heads_q + head_q) * p.seq_q + q;
  return {p.lse2[row], p.delta[row]};
}

// lse2 and delta of `ROWS` query rows from q0 into shared memory, by the CTA's THREADS threads.
template <int ROWS, int THREADS>
__device__ __forceinline__ void load_row_stats(float* lse2_out, float* delta_out, const AttentionBackwardParams& p,
                                               int batch, int head_q, int q0) {
  for (int r = threadIdx.x; r < ROWS; r += THREADS) {
    const RowStats s = row_stats(p, batch, head_q, q0 + r);
    lse2_out[r] = s.lse2;
    delta_out[r] = s.delta;
  }
}

// Which key tile a dK/dV CTA owns, head-major: blockIdx.x = (batch, K/V head) * key_tiles + rank.
// The CTAs resident at one time then cover one or two heads, whose Q and dO (4 MB a head at S = 8192,
// D = 128) stay in L2 while every key tile of the head reads them. Within a head, ranks take the key
// tiles heaviest first when one pattern serves every head (the key-major schedule's item order: a
// random pattern's columns differ in length, unlike its rows), so the grid ends on short walks; dense
// causal walks are already longest first.
struct KeyTileOwner {
  int batch, kv_head, key_tile, key0;
  int group, rank, ranks;  // group = (batch, K/V head), its CTAs ranked 0 .. ranks - 1 in launch order
};
template <class Cfg>
__device__ __forceinline__ KeyTileOwner key_tile_owner(const AttentionBackwardParams& p, int block_rows) {
  // With a pattern, the key-major schedule's tiles: where pattern blocks are wider than the CTA's keys
  // (blocks of 128, 64 keys a CTA at d = 256) the last pattern block may hold one tile past the key
  // sequence's end, whose CTA walks nothing.
  const int key_tiles = Cfg::sparsity != kDense ? p.k_items_per_head : (p.seq_k + block_rows - 1) / block_rows;
  int rank = blockIdx.x % key_tiles, group = blockIdx.x / key_tiles;
  // The last tail_groups groups take turns, a CTA each, so all their heaviest key tiles start before
  // any of their light ones and the grid ends on light CTAs. One group after another, the last group's
  // heaviest tiles would start late in the last wave and leave the other SMs idle while they finish.
  // Every CTA of a group still starts after all CTAs of the group convert_lag earlier (>= tail_groups).
  const int tail_begin = p.batch * p.heads_kv - p.tail_groups;
  if (p.tail_groups > 1 && group >= tail_begin) {
    const int turn = blockIdx.x - tail_begin * key_tiles;
    group = tail_begin + turn % p.tail_groups;
    rank = turn / p.tail_groups;
  }
  const int kv_head = group % p.heads_kv;
  int key_tile = rank;
  // A group's CTAs take its key tiles heaviest first, by the pattern of its first query head (with a
  // per-head pattern and several query heads a group, the others' columns may differ: then it is only
  // an estimate, but still every key tile once).
  if constexpr (Cfg::sparsity != kDense) {
    const int pattern_head = p.pattern_heads == 1 ? 0 : kv_head * (p.heads_q / p.heads_kv);
    key_tile = p.k_item_order[pattern_head * p.k_items_per_head + rank];
  }
  return {group / p.heads_kv, kv_head, key_tile, key_tile * block_rows, group, rank, key_tiles};
}

struct QueryTile {
  int head_q, q_tile;
  unsigned long long mask;  // pattern blocks of the tile that are active (kWholeTile: all)
};

// The query tiles a key tile's CTA visits: for each query head of the K/V head's group, its run of
// query tiles of C rows (dense: from the first the causal edge allows; sparse: the transposed
// pattern's list, cut to the causal edge and the sequence end), laid end to end. Lives in shared
// memory; build() is called by every thread before any load, so the CTA knows its whole walk first.
// Each CTA starts its walk at a different place (rotated by its key tile): the CTAs of one head would
// otherwise visit the same query tile at the same moment and queue their dQ atomics on the same rows.
// The tiles are C rows, or (the Hopper dK/dV pass, whose schedule may list query runs narrower than
// its tiles) the rows given to build() and first_query_tile().
template <class Cfg, int C>
struct QueryTileWalk {
  static constexpr int max_group = 64;  // query heads per K/V head with per-head patterns (host-checked)
  int start[max_group + 1];  // flat position of each query head's first tile
  int first[max_group];      // its first q tile (dense) or list position (sparse)
  int group;
  int rotation;              // the walk's j-th tile is the (j + rotation) % count-th of the lists

  // The first query tile of `rows` rows that may see the key tile under causality (q_tiles: none may);
  // query tiles before it are skipped outright.
  static __device__ int first_query_tile(const AttentionBackwardParams& p, const KeyTileOwner& own, int rows = C) {
    const int q_tiles = (p.seq_q + rows - 1) / rows;
    if constexpr (Cfg::causal == kNotCausal) return 0;
    const int offset = Cfg::causal == kCausalBottomRight ? p.seq_k - p.seq_q : 0;
    const int first_query = own.key0 - offset > 0 ? own.key0 - offset : 0;
    return first_query >= p.seq_q ? q_tiles : first_query / rows;
  }

  // Returns the number of query tiles in the walk.
  __device__ int build(const AttentionBackwardParams& p, const KeyTileOwner& own, int tile_rows = C) {
    const int heads = p.heads_q / p.heads_kv;
    const int q_tiles = (p.seq_q + tile_rows - 1) / tile_rows;
    const int first_q_tile = first_query_tile(p, own, tile_rows);
    if (threadIdx.x < heads) {
      const int head_q = own.kv_head * heads + threadIdx.x;
      int begin = first_q_tile, end = q_tiles;
      if constexpr (Cfg::sparsity != kDense) {
        const int item = (p.pattern_heads == 1 ? 0 : head_q) * p.k_items_per_head + own.key_tile;
        begin = p.k_item_tile_begin[item];
        end = p.k_item_tile_begin[item + 1];
        while (begin < end && p.k_tile_index[begin] < first_q_tile) ++begin;
        while (end > begin && p.k_tile_index[end - 1] >= q_tiles) --end;
      }
      first[threadIdx.x] = begin;
      start[threadIdx.x + 1] = end > begin ? end - begin : 0;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      group = heads;
      start[0] = 0;
      for (int g = 0; g < heads; ++g) start[g + 1] += start[g];
      rotation = start[heads] > 0 ? own.key_tile % start[heads] : 0;
    }
    __syncthreads();
    return start[heads];
  }

  // Where the walk's tile `walked` is: its query head's place in the group and its position in the
  // schedule's list (dense: its q tile). Shared memory only, so that a caller locating several tiles
  // issues all their global loads at once.
  struct Place {
    int g, pos;
  };
  __device__ Place place(int walked) const {
    int j = walked + rotation;
    if (j >= start[group]) j -= start[group];
    int g = 0;
    while (j >= start[g + 1]) ++g;
    return {g, first[g] + j - start[g]};
  }
  __device__ QueryTile tile_at(const AttentionBackwardParams& p, const KeyTileOwner& own, Place at) const {
    if constexpr (Cfg::sparsity != kDense) return {own.kv_head * group + at.g, p.k_tile_index[at.pos], p.k_tile_mask[at.pos]};
    else return {own.kv_head * group + at.g, at.pos, kWholeTile};
  }
  __device__ QueryTile locate(const AttentionBackwardParams& p, const KeyTileOwner& own, int walked) const {
    return tile_at(p, own, place(walked));
  }
};

// The queries of a Hopper dK/dV tile: RUNS runs of RUN_ROWS consecutive rows, each of its own query
// head and first row. Where pattern blocks are narrower than the tile (16 or 32 queries in a 64-query
// tile), the walk lists the query blocks any of the CTA's keys see, one a run, and a tile takes the
// next RUNS of them wherever they lie: contiguous 64-query tiles would also hold the blocks between
// them (random blocks of 32 at density 0.1: a CTA's 128 keys see 34% of the blocks but 57% of the
// 64-query tiles). Elsewhere RUNS = 1, and where the host keeps contiguous tiles for a pattern the
// RUNS runs of each lie end to end (locate_packed). A walk's last tile may hold
// fewer real runs (`runs`); the others repeat its last one with no active pattern block, so that they
// load real rows (finite scores, all masked: P and dS are 0) and add nothing.
template <int RUN_ROWS, int RUNS>
struct PackedQueries {
  int head_q[RUNS], q0[RUNS];
  int runs;
  unsigned long long mask;  // bit (key group * RUNS + run), as a tile of RUNS column groups; or kWholeTile
  // Whether the runs lie end to end in one query head (a whole tile of C = RUNS * RUN_ROWS rows from
  // q0[0]), so that the tile moves by the whole-tile copies.
  __device__ __forceinline__ bool contiguous() const {
    bool whole = runs == RUNS;
#pragma unroll
    for (int i = 1; i < RUNS; ++i) whole = whole && head_q[i] == head_q[0] && q0[i] == q0[0] + i * RUN_ROWS;
    return whole;
  }
  __device__ __forceinline__ int last_query() const {
    int last = q0[0];
#pragma unroll
    for (int i = 1; i < RUNS; ++i) last = max(last, q0[i]);
    return last + RUN_ROWS - 1;
  }
};
template <int RUN_ROWS, int RUNS>
__device__ __forceinline__ int column_index(const PackedQueries<RUN_ROWS, RUNS>& t, int c) {
  return t.q0[c / RUN_ROWS] + c % RUN_ROWS;
}
// load_row_stats for a tile of query runs, by the 32 lanes of a warp, C / 32 rows a lane, in two steps:
// the loads into registers (issued together, and before the caller waits for the ring slot they go
// to), then the stores. (Loads after a store to shared memory wait for it: the compiler cannot tell the
// two apart. A run at a time, each run's loads waited for the last run's stores.)
template <int C>
struct TileStats {
  static constexpr int per_lane = C / 32;
  float lse2[per_lane], delta[per_lane];
  __device__ __forceinline__ void store(float* lse2_out, float* delta_out, int lane) const {
#pragma unroll
    for (int k = 0; k < per_lane; ++k) {
      lse2_out[lane + 32 * k] = lse2[k];
      delta_out[lane + 32 * k] = delta[k];
    }
  }
};
template <int C, int RUN_ROWS, int RUNS>
__device__ __forceinline__ TileStats<C> load_run_stats(const AttentionBackwardParams& p, int batch,
                                                       const PackedQueries<RUN_ROWS, RUNS>& t, int lane) {
  constexpr int per_lane = C / 32;
  static_assert(C % 32 == 0 && C == RUN_ROWS * RUNS, "a tile's rows: whole warps of its runs");
  TileStats<C> s;
  float (&lse2)[per_lane] = s.lse2;
  float (&delta)[per_lane] = s.delta;
#pragma unroll
  for (int k = 0; k < per_lane; ++k) {
    const int r = lane + 32 * k;
    int head = t.head_q[0], q = t.q0[0] + r;
#pragma unroll
    for (int i = 1; i < RUNS; ++i)
      if (r >= i * RUN_ROWS) head = t.head_q[i], q = t.q0[i] + r - i * RUN_ROWS;
    const RowStats row = row_stats(p, batch, head, q);
    lse2[k] = row.lse2;
    delta[k] = row.delta;
  }
  return s;
}
// backward_tile_needs_mask for a tile of query runs (keys its rows): any run's own reasons, or a
// pattern block of the tile inactive.
template <class Cfg, int RUN_ROWS, int RUNS>
__device__ __forceinline__ bool backward_tile_needs_mask(const AttentionBackwardParams& p,
                                                         const PackedQueries<RUN_ROWS, RUNS>& t, int key0, int key_rows) {
  bool needs = t.mask != kWholeTile;
#pragma unroll
  for (int i = 0; i < RUNS; ++i) needs = needs || backward_tile_needs_mask<Cfg>(p, t.q0[i], RUN_ROWS, key0, key_rows, kWholeTile);
  return needs;
}
// Tile `tile` of a dK/dV walk (QueryTileWalk) of `entries` entries: where `packing`, query runs of
// RUN_ROWS rows, RUNS to a tile, whose masks have a bit for each of the KEY_GROUPS pattern blocks of the
// CTA's keys; otherwise whole tiles of RUN_ROWS * RUNS rows (RUNS runs end to end), with their masks.
template <int RUN_ROWS, int RUNS, int KEY_GROUPS, class Walk>
__device__ __forceinline__ PackedQueries<RUN_ROWS, RUNS> locate_packed(const Walk& walk, const AttentionBackwardParams& p,
                                                                       const KeyTileOwner& own, int tile, int entries,
                                                                       bool packing) {
  static_assert(KEY_GROUPS * RUNS <= 64, "a tile's pattern mask has 64 bits");
  PackedQueries<RUN_ROWS, RUNS> t;
  if (RUNS == 1 || !packing) {
    const QueryTile e = walk.locate(p, own, tile);
#pragma unroll
    for (int i = 0; i < RUNS; ++i) t.head_q[i] = e.head_q, t.q0[i] = e.q_tile * (RUN_ROWS * RUNS) + i * RUN_ROWS;
    t.runs = RUNS;
    t.mask = e.mask;
    return t;
  }
  t.runs = min(RUNS, entries - tile * RUNS);
  unsigned long long mask = 0;
  typename Walk::Place places[RUNS];  // all first, then every run's loads at once
#pragma unroll
  for (int i = 0; i < RUNS; ++i) places[i] = walk.place(tile * RUNS + min(i, t.runs - 1));
  QueryTile entries_of[RUNS];
#pragma unroll
  for (int i = 0; i < RUNS; ++i) entries_of[i] = walk.tile_at(p, own, places[i]);
#pragma unroll
  for (int i = 0; i < RUNS; ++i) {
    const QueryTile& e = entries_of[i];
    t.head_q[i] = e.head_q;
    t.q0[i] = e.q_tile * RUN_ROWS;
    if (i < t.runs) {
#pragma unroll
      for (int g = 0; g < KEY_GROUPS; ++g) mask |= ((e.mask >> g) & 1ull) << (g * RUNS + i);
    }
  }
  constexpr unsigned long long all_bits = KEY_GROUPS * RUNS == 64 ? ~0ull : (1ull << (KEY_GROUPS * RUNS)) - 1;
  t.mask = mask == all_bits ? kWholeTile : mask;
  return t;
}

// at[0] += a, at[1] += b in global memory; one vector atomic on sm_90 (red.global.add.v2.f32).
__device__ __forceinline__ void atomic_add_pair(float* at, float a, float b) {
#if __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(at), make_float2(a, b));
#else
  atomicAdd(at, a);
  atomicAdd(at + 1, b);
#endif
}

// dQ += dS K for one query tile, from inside the dK/dV pass. The warps hold dS^T by key rows; they
// meet in shared memory as a [keys][queries] tile, then each warp multiplies 16 queries by all the
// CTA's keys for a slice of the head dims and adds the product to the fp32 accumulator with atomics
// (the CTAs of the other key tiles add to the same rows).
template <class Cfg, class Tr = BackwardTraits<Cfg>>
struct AtomicDq {
  static constexpr int q_mtiles = Tr::block_n / 16;
  static constexpr int dim_slices = Tr::warps / q_mtiles;  // warps sharing one 16-query tile
  static constexpr int dims = Tr::head_dim / dim_slices;
  static constexpr int row_elems = Tr::block_n + 8;       // padded like every tile: conflict-free
  static constexpr int tile_elems = Tr::block_rows * row_elems;
  static constexpr int kChunk = dims % 32 == 0 ? 32 : 16;
  static_assert(Tr::warps % q_mtiles == 0 && dims % 16 == 0,
                "atomic dQ: warps must be a multiple of block_cols / 16, splitting head_dim into 16s");

  // The warp's dS^T fragment (its 16 keys x the tile's queries) into ds_t[key][query], as T.
  static __device__ __forceinline__ void stage(const float (&ds)[1][Tr::n_tiles][4], typename Tr::T* ds_t,
                                               int warp_row0) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int nt = 0; nt < Tr::n_tiles; ++nt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = warp_row0 + lane / 4 + h * 8, c = nt * 8 + 2 * (lane % 4);
        *reinterpret_cast<unsigned*>(ds_t + r * row_elems + c) = pack2<typename Tr::T>(ds[0][nt][2 * h], ds[0][nt][2 * h + 1]);
      }
  }

  // accum[query0 + q][d] += sum_key dS[q][key] K[key][d] for the warp's queries and dims.
  static __device__ __forceinline__ void add(const typename Tr::T* ds_t, const typename Tr::T* k_tile, float* accum,
                                             int query0, int seq_q) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int q_row0 = (warp % q_mtiles) * 16;
    // 32 dims at a time: the dK and dV accumulators already hold most of the registers.
#pragma unroll 1
    for (int dim0 = (warp / q_mtiles) * dims; dim0 < (warp / q_mtiles + 1) * dims; dim0 += kChunk) {
      float acc[kChunk / 8][4];
#pragma unroll
      for (int nt = 0; nt < kChunk / 8; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < Tr::block_rows / 16; ++kk) {
        // A = dS (queries x keys): the stored [key][query] tile read transposed. Matrix j holds
        // queries q_row0 + (j & 1) * 8 and keys kk * 16 + (j >> 1) * 8.
        unsigned a[4];
        const int j = lane / 8, r = lane % 8;
        ldmatrix_x4_trans(a, smem_address(ds_t + (kk * 16 + (j >> 1) * 8 + r) * row_elems + q_row0 + (j & 1) * 8));
#pragma unroll
        for (int dp = 0; dp < kChunk / 16; ++dp) {
          unsigned b[4];
          load_v_fragments<Tr::head_dim>(b, k_tile, kk * 16, dim0 + dp * 16);
          mma_16x8x16<typename Tr::T>(acc[2 * dp], a, b[0], b[1]);
          mma_16x8x16<typename Tr::T>(acc[2 * dp + 1], a, b[2], b[3]);
        }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int q = query0 + q_row0 + lane / 4 + h * 8;
        if (q >= seq_q) continue;
        float* row = accum + static_cast<long long>(q) * Tr::head_dim + dim0 + 2 * (lane % 4);
#pragma unroll
        for (int nt = 0; nt < kChunk / 8; ++nt) atomic_add_pair(row + nt * 8, acc[nt][2 * h], acc[nt][2 * h + 1]);
      }
    }
  }
};

// dK and dV of one key tile (and, with atomic dQ, its share of dQ).
template <class Cfg>
__global__ void __launch_bounds__(BackwardTraits<Cfg>::threads) attention_backward_dkdv(const AttentionBackwardParams p) {
  using Tr = BackwardTraits<Cfg>;
  using T = typename Tr::T;
  constexpr int R = Tr::block_rows, C = Tr::block_n, stages = Cfg::stages;
  extern __shared__ __align__(16) unsigned char shared_raw[];
  T* k_tile = reinterpret_cast<T*>(shared_raw);
  T* v_tile = k_tile + Tr::own_tile_elems;
  T* q_ring = v_tile + Tr::own_tile_elems;
  T* do_ring = q_ring + stages * Tr::other_tile_elems;
  float* lse2_ring = reinterpret_cast<float*>(do_ring + stages * Tr::other_tile_elems);
  float* delta_ring = lse2_ring + stages * C;
  T* ds_t = reinterpret_cast<T*>(delta_ring + stages * C);  // atomic dQ only: AtomicDq<Cfg>::tile_elems
  __shared__ QueryTileWalk<Cfg, C> walk;

  const KeyTileOwner own = key_tile_owner<Cfg>(p, R);
  const int batch = own.batch, kv_head = own.kv_head, key0 = own.key0;
  if (key0 >= p.seq_k) return;  // a schedule item past the end of a short key sequence
  const int count = walk.build(p, own);
  auto locate = [&](int j) { return walk.locate(p, own, j); };
  auto load_query_tile = [&](int j) {
    const QueryTile t = locate(j);
    const int slot = j % stages, q0 = t.q_tile * C;
    const T* q = static_cast<const T*>(p.q) + batch * p.q_batch_stride + t.head_q * p.q_head_stride;
    const T* d_o = static_cast<const T*>(p.d_o) + batch * p.do_batch_stride + t.head_q * p.do_head_stride;
    load_tile_async<T, Tr::head_dim, C, Tr::threads>(q_ring + slot * Tr::other_tile_elems, q, p.q_row_stride, q0,
                                                     p.seq_q);
    load_tile_async<T, Tr::head_dim, C, Tr::threads>(do_ring + slot * Tr::other_tile_elems, d_o, p.do_row_stride, q0,
                                                     p.seq_q);
    load_row_stats<C, Tr::threads>(lse2_ring + slot * C, delta_ring + slot * C, p, batch, t.head_q, q0);
  };

  const T* k = static_cast<const T*>(p.k) + batch * p.k_batch_stride + kv_head * p.k_head_stride;
  const T* v = static_cast<const T*>(p.v) + batch * p.v_batch_stride + kv_head * p.v_head_stride;
  load_tile_async<T, Tr::head_dim, R, Tr::threads>(k_tile, k, p.k_row_stride, key0, p.seq_k);
  load_tile_async<T, Tr::head_dim, R, Tr::threads>(v_tile, v, p.v_row_stride, key0, p.seq_k);
#pragma unroll
  for (int j = 0; j < stages - 1; ++j) {
    if (j < count) load_query_tile(j);
    cp_async_commit();
  }

  const int warp_row0 = (threadIdx.x / 32) * 16;
  float dk[1][Tr::d_tiles][4], dv[1][Tr::d_tiles][4];
#pragma unroll
  for (int dt = 0; dt < Tr::d_tiles; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[0][dt][e] = dv[0][dt][e] = 0.f;
  const unsigned no_q_fragment[1][1][4] = {};

  for (int j = 0; j < count; ++j) {
    cp_async_wait<stages - 2>();
    __syncthreads();
    if (j + stages - 1 < count) load_query_tile(j + stages - 1);
    cp_async_commit();
    const int slot = j % stages;
    const QueryTile t = locate(j);
    const int q0 = t.q_tile * C;
    const T* q_slot = q_ring + slot * Tr::other_tile_elems;
    const T* do_slot = do_ring + slot * Tr::other_tile_elems;
    const float* lse2 = lse2_ring + slot * C;
    const float* delta = delta_ring + slot * C;

    float s[1][Tr::n_tiles][4];  // S^T: this warp's keys x the tile's queries
    score_tile<Tr, false>(s, no_q_fragment, k_tile, q_slot, warp_row0);
    if (backward_tile_needs_mask<Cfg>(p, q0, C, key0, R, t.mask))
      mask_backward_tile<Cfg, true>(s, p, key0, q0, warp_row0, t.mask);
    probabilities_from_scores<Tr>(s, lse2, p.scale_log2);
    accumulate_values<Tr>(dv, s, do_slot);  // dV += P^T dO

    float ds[1][Tr::n_tiles][4];  // dP^T = V dO^T, then dS^T = P^T * (dP^T - delta)
    score_tile<Tr, false>(ds, no_q_fragment, v_tile, do_slot, warp_row0);
    score_gradients<Tr>(ds, s, delta);
    accumulate_values<Tr>(dk, ds, q_slot);  // dK += dS^T Q (scaled at the end)
    if constexpr (Cfg::atomic_dq) {
      // The ring slots are not touched: the next iteration's barrier comes before ds_t is rewritten.
      AtomicDq<Cfg>::stage(ds, ds_t, warp_row0);
      __syncthreads();
      const long long row_base = (static_cast<long long>(batch) * p.heads_q + t.head_q) * p.seq_q;
      AtomicDq<Cfg>::add(ds_t, k_tile, p.dq_accum + row_base * Tr::head_dim, q0, p.seq_q);
    }
  }

  cp_async_wait<0>();
  __syncthreads();  // K and V may still be landing when no query tile saw this key tile
  T* dk_out = static_cast<T*>(p.dk) + batch * p.dk_batch_stride + kv_head * p.dk_head_stride;
  T* dv_out = static_cast<T*>(p.dv) + batch * p.dv_batch_stride + kv_head * p.dv_head_stride;
  store_rows<Tr>(dk, p.scale, k_tile, dk_out, p.dk_row_stride, key0, p.seq_k, warp_row0);
  store_rows<Tr>(dv, 1.f, v_tile, dv_out, p.dv_row_stride, key0, p.seq_k, warp_row0);
}

// The deterministic dQ pass's work for CTA blockIdx.x: a query tile of R rows and the key tiles of C
// columns it walks, heaviest first as in the forward (the forward's schedule cut to the causal edge,
// or, dense, every key tile up to it). q0 may lie past the end of a short sequence: nothing to do.
struct QueryTileWork {
  int batch, head_q, q0, count;
  const int* tile_index;                // null (dense): the j-th tile is key tile j
  const unsigned long long* tile_mask;  // null (dense): every tile whole
  __device__ __forceinline__ int key_tile(int j) const { return tile_index ? tile_index[j] : j; }
  __device__ __forceinline__ unsigned long long mask(int j) const { return tile_mask ? tile_mask[j] : kWholeTile; }
};
template <class Cfg, int R, int C>
__device__ __forceinline__ QueryTileWork query_tile_work(const AttentionBackwardParams& p) {
  QueryTileWork w{0, 0, 0, 0, nullptr, nullptr};
  int q_tile;
  const int q_tiles = (p.seq_q + R - 1) / R;
  if constexpr (Cfg::sparsity == kDense) {
    const int per_rank = p.batch * p.heads_q;
    const int rank = blockIdx.x / per_rank, rest = blockIdx.x % per_rank;
    q_tile = Cfg::causal != kNotCausal ? q_tiles - 1 - rank : rank;
    w.batch = rest / p.heads_q;
    w.head_q = rest % p.heads_q;
  } else {
    const int heads_per_pattern = p.heads_q / p.pattern_heads;
    const int per_rank = p.batch * heads_per_pattern;
    const int rank = blockIdx.x / per_rank, rest = blockIdx.x % per_rank;
    const int item = p.q_item_order[rank];
    q_tile = item % p.q_items_per_head;
    w.batch = rest / heads_per_pattern;
    w.head_q = (item / p.q_items_per_head) * heads_per_pattern + rest % heads_per_pattern;
    const int begin = p.q_item_tile_begin[item];
    w.count = p.q_item_tile_begin[item + 1] - begin;
    w.tile_index = p.q_tile_index + begin;
    w.tile_mask = p.q_tile_mask + begin;
  }
  w.q0 = q_tile * R;
  if (w.q0 >= p.seq_q) return w;
  int last_key = p.seq_k - 1;
  if constexpr (Cfg::causal != kNotCausal)
    last_key = min(last_key, min(w.q0 + R - 1, p.seq_q - 1) + (Cfg::causal == kCausalBottomRight ? p.seq_k - p.seq_q : 0));
  const int last_tile = last_key < 0 ? -1 : last_key / C;
  if constexpr (Cfg::sparsity == kDense) {
    w.count = last_tile + 1;
  } else {
    while (w.count > 0 && w.tile_index[w.count - 1] > last_tile) --w.count;
  }
  return w;
}

// dQ of one query tile.
template <class Cfg>
__global__ void __launch_bounds__(BackwardTraits<Cfg>::threads) attention_backward_dq(const AttentionBackwardParams p) {
  using Tr = BackwardTraits<Cfg>;
  using T = typename Tr::T;
  constexpr int R = Tr::block_rows, C = Tr::block_n, stages = Cfg::stages;
  extern __shared__ __align__(16) unsigned char shared_raw[];
  T* q_rows = reinterpret_cast<T*>(shared_raw);
  T* do_rows = q_rows + Tr::own_tile_elems;
  T* k_ring = do_rows + Tr::own_tile_elems;
  T* v_ring = k_ring + stages * Tr::other_tile_elems;
  float* lse2_rows = reinterpret_cast<float*>(v_ring + stages * Tr::other_tile_elems);
  float* delta_rows = lse2_rows + R;

  const QueryTileWork work = query_tile_work<Cfg, R, C>(p);
  const int batch = work.batch, head_q = work.head_q, q0 = work.q0, count = work.count;
  if (q0 >= p.seq_q) return;

  const T* q = static_cast<const T*>(p.q) + batch * p.q_batch_stride + head_q * p.q_head_stride;
  const T* d_o = static_cast<const T*>(p.d_o) + batch * p.do_batch_stride + head_q * p.do_head_stride;
  const int kv_head = head_q / (p.heads_q / p.heads_kv);
  const T* k = static_cast<const T*>(p.k) + batch * p.k_batch_stride + kv_head * p.k_head_stride;
  const T* v = static_cast<const T*>(p.v) + batch * p.v_batch_stride + kv_head * p.v_head_stride;
  auto load_key_tile = [&](int j) {
    const int slot = j % stages, key0 = work.key_tile(j) * C;
    load_tile_async<T, Tr::head_dim, C, Tr::threads>(k_ring + slot * Tr::other_tile_elems, k, p.k_row_stride, key0,
                                                     p.seq_k);
    load_tile_async<T, Tr::head_dim, C, Tr::threads>(v_ring + slot * Tr::other_tile_elems, v, p.v_row_stride, key0,
                                                     p.seq_k);
  };
  load_tile_async<T, Tr::head_dim, R, Tr::threads>(q_rows, q, p.q_row_stride, q0, p.seq_q);
  load_tile_async<T, Tr::head_dim, R, Tr::threads>(do_rows, d_o, p.do_row_stride, q0, p.seq_q);
  load_row_stats<R, Tr::threads>(lse2_rows, delta_rows, p, batch, head_q, q0);
#pragma unroll
  for (int j = 0; j < stages - 1; ++j) {
    if (j < count) load_key_tile(j);
    cp_async_commit();
  }

  const int lane = threadIdx.x % 32;
  const int warp_row0 = (threadIdx.x / 32) * 16;
  float dq[1][Tr::d_tiles][4];
#pragma unroll
  for (int dt = 0; dt < Tr::d_tiles; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) dq[0][dt][e] = 0.f;
  const unsigned no_q_fragment[1][1][4] = {};

  for (int j = 0; j < count; ++j) {
    cp_async_wait<stages - 2>();
    __syncthreads();
    if (j + stages - 1 < count) load_key_tile(j + stages - 1);
    cp_async_commit();
    const int slot = j % stages, key0 = work.key_tile(j) * C;
    const unsigned long long mask = work.mask(j);
    const T* k_slot = k_ring + slot * Tr::other_tile_elems;
    const T* v_slot = v_ring + slot * Tr::other_tile_elems;

    float s[1][Tr::n_tiles][4];
    score_tile<Tr, false>(s, no_q_fragment, q_rows, k_slot, warp_row0);
    if (backward_tile_needs_mask<Cfg>(p, q0, R, key0, C, mask)) mask_backward_tile<Cfg, false>(s, p, q0, key0, warp_row0, mask);
    float ds[1][Tr::n_tiles][4];
    score_tile<Tr, false>(ds, no_q_fragment, do_rows, v_slot, warp_row0);  // dP = dO V^T
#pragma unroll
    for (int nt = 0; nt < Tr::n_tiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = warp_row0 + lane / 4 + (e / 2) * 8;
        const float prob = fast_exp2(fmaf(s[0][nt][e], p.scale_log2, -lse2_rows[r]));
        ds[0][nt][e] = prob * (ds[0][nt][e] - delta_rows[r]);
      }
    accumulate_values<Tr>(dq, ds, k_slot);  // dQ += dS K (scaled at the end)
  }

  cp_async_wait<0>();
  __syncthreads();
  T* dq_out = static_cast<T*>(p.dq) + batch * p.dq_batch_stride + head_q * p.dq_head_stride;
  store_rows<Tr>(dq, p.scale, q_rows, dq_out, p.dq_row_stride, q0, p.seq_q, warp_row0);
}

// Atomic dQ: dq = scale * accumulator, rounded to T, for the rows from convert_row0 on, and the
// accumulator left zero; every load of a thread's rows issued before the stores.
template <class Cfg>
__global__ void __launch_bounds__(256) attention_backward_dq_convert(const AttentionBackwardParams p) {
  using Slot = PerRowSlot<Cfg::head_dim>;
  const int chunk = Slot::chunk();
  if (chunk >= Slot::chunks) return;
  QueryRow w[Slot::rows];
  DqChunk c[Slot::rows];
#pragma unroll
  for (int j = 0; j < Slot::rows; ++j) {
    w[j] = Slot::row(p, p.convert_row0, j);
    if (w[j].valid) c[j] = load_dq_chunk<Cfg::head_dim>(p, w[j].row, chunk);
  }
#pragma unroll
  for (int j = 0; j < Slot::rows; ++j)
    if (w[j].valid) store_dq_chunk<typename Cfg::T, Cfg::head_dim>(p, w[j], chunk, c[j]);
}

}  // namespace sjit_kernels

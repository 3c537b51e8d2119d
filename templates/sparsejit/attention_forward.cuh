// Attention forward: O = softmax(scale * Q K^T, over the keys a row may see) V, with the row's
// log-sum-exp, for dense and block-sparse patterns (FlashAttention-2, Dao 2023, Algorithm 1).
//
// One CTA computes one query tile of one head. Each warp owns 16 * m_tiles query rows and walks the
// key tiles of the CTA's list: S = Q K^T on tensor cores, an online softmax in the exp2 domain that
// rescales the running output, and O += P V with P taken straight from S's registers. K and V tiles
// arrive through a ring of `stages` shared-memory slots filled by cp.async, one barrier per tile.
//
// Sparsity never costs work on inactive tiles: the list of key tiles is known before any load (the
// dense range, or the block-sparse schedule built on the host), so an inactive tile is never loaded,
// waited for or synchronized on. Element masks are applied only to tiles that need them (the causal
// edge, the sequence end, pattern blocks smaller than the tile), and a warp skips the math of a tile
// that none of its rows may see (pattern blocks shorter than the query tile).
#pragma once

#include "sparsejit/attention_params.cuh"
#include "sparsejit/attention_tiles.cuh"
#include "sparsejit/element.cuh"

namespace sjit_kernels {

enum CausalMode { kNotCausal = 0, kCausalTopLeft = 1, kCausalBottomRight = 2 };
enum SparsityMode { kDense = 0, kScheduleAtLaunch = 1, kScheduleBaked = 2 };

// Cfg: T, head_dim, warps, m_tiles (16-row mma tiles per warp), block_n, stages, q_in_registers,
//      causal (CausalMode), sparsity (SparsityMode), pattern_block; baked kernels also provide the
//      schedule arrays as static functions and pattern_heads, q_tiles.
template <class Cfg>
struct AttentionForwardTraits {
  using T = typename Cfg::T;
  static constexpr int head_dim = Cfg::head_dim;
  static constexpr int warps = Cfg::warps;
  static constexpr int threads = 32 * warps;
  static constexpr int m_tiles = Cfg::m_tiles;
  // Query rows of an item: 16 * m_tiles * warps, or on the gathered-key kernel one pattern block.
  static constexpr int block_m = Cfg::block_m;
  static constexpr int block_n = Cfg::block_n;
  static constexpr int n_tiles = block_n / 8;   // 8-key mma tiles of S per row block
  static constexpr int d_tiles = head_dim / 8;  // 8-column mma tiles of O
  static constexpr int k_steps = head_dim / 16;
  static constexpr int row_elems = TileGeometry<head_dim>::row_elems;
  static constexpr int q_tile_elems = block_m * row_elems;
  static constexpr int kv_tile_elems = block_n * row_elems;
  static constexpr int shared_bytes = (q_tile_elems + 2 * Cfg::stages * kv_tile_elems) * int(sizeof(T));
  // Pattern blocks inside one tile: a tile covers (block_m / group_rows) x (block_n / group_cols)
  // pattern blocks when they are smaller than the tile, and lies inside one block otherwise.
  static constexpr int group_rows = Cfg::pattern_block < block_m ? Cfg::pattern_block : block_m;
  static constexpr int group_cols = Cfg::pattern_block < block_n ? Cfg::pattern_block : block_n;
  static constexpr int groups_per_tile_row = block_n / group_cols;

  static_assert(block_n % 16 == 0, "block_n must be a multiple of 16: P feeds k-steps of 16 keys");
  static_assert(block_m == 16 * m_tiles * warps || block_m == block_n, "block_m: the warps' rows, or one pattern block");
  static_assert(Cfg::stages >= 2, "the K/V ring needs at least two slots to overlap loads and math");
  static_assert((block_m / group_rows) * groups_per_tile_row <= 64, "a tile's pattern mask is one 64-bit word");
};

// The key tiles one CTA visits: all of [0, count) for dense kernels, else a slice of the schedule.
struct KeyTiles {
  int count = 0;
  const int* index = nullptr;                 // null: tile j is key tile j
  const unsigned long long* mask = nullptr;   // null: every tile whole
  __device__ int tile(int j) const { return index ? index[j] : j; }
  __device__ unsigned long long pattern_mask(int j) const { return mask ? mask[j] : kWholeTile; }
};

struct WorkItem {
  int batch, head_q, q_tile;
  KeyTiles tiles;
};

struct Schedule {
  const int* item_tile_begin;
  const int* tile_index;
  const unsigned long long* tile_mask;
  const int* item_order;
  int pattern_heads, q_tiles;
};

template <class Cfg>
__device__ __forceinline__ Schedule schedule_of(const AttentionForwardParams& p) {
  if constexpr (Cfg::sparsity == kScheduleBaked)
    return {Cfg::item_tile_begin(), Cfg::tile_index(), Cfg::tile_mask(), Cfg::item_order(), Cfg::pattern_heads,
            Cfg::q_tiles};
  else
    return {p.item_tile_begin, p.tile_index, p.tile_mask, p.item_order, p.pattern_heads, p.q_tiles};
}

// The last key a query tile may see under causality (or seq_k - 1), as a key tile number; -1 if none.
template <class Cfg>
__device__ __forceinline__ int last_key_tile(const AttentionForwardParams& p, int q_tile) {
  using Tr = AttentionForwardTraits<Cfg>;
  int last_key = p.seq_k - 1;
  if constexpr (Cfg::causal != kNotCausal) {
    const int last_row = min(q_tile * Tr::block_m + Tr::block_m - 1, p.seq_q - 1);
    const int offset = Cfg::causal == kCausalBottomRight ? p.seq_k - p.seq_q : 0;
    last_key = min(last_key, last_row + offset);
  }
  return last_key < 0 ? -1 : last_key / Tr::block_n;
}

// Query tiles per head (dense), or schedule items (pattern head x query tile) per group of heads that
// share a pattern head: the `rank`s of work_item.
template <class Cfg>
__device__ __forceinline__ int ranks_per_group(const AttentionForwardParams& p) {
  if constexpr (Cfg::sparsity == kDense) {
    return (p.seq_q + AttentionForwardTraits<Cfg>::block_m - 1) / AttentionForwardTraits<Cfg>::block_m;
  } else {
    const Schedule s = schedule_of<Cfg>(p);
    return s.pattern_heads * s.q_tiles;
  }
}

// The work item of launch rank `rank` (heaviest first: the query tile, or the schedule's item order)
// for group `group` (batch x the heads that share a pattern head). Dense causal kernels start with the
// last query tiles, which see the most keys.
template <class Cfg>
__device__ __forceinline__ WorkItem work_item(const AttentionForwardParams& p, int rank, int group) {
  WorkItem w;
  if constexpr (Cfg::sparsity == kDense) {
    const int q_tiles = ranks_per_group<Cfg>(p);
    w.q_tile = Cfg::causal != kNotCausal ? q_tiles - 1 - rank : rank;
    w.batch = group / p.heads_q;
    w.head_q = group % p.heads_q;
    w.tiles.count = last_key_tile<Cfg>(p, w.q_tile) + 1;
  } else {
    const Schedule s = schedule_of<Cfg>(p);
    const int heads_per_pattern = p.heads_q / s.pattern_heads;
    const int item = s.item_order[rank];
    const int pattern_head = item / s.q_tiles;
    w.q_tile = item % s.q_tiles;
    w.batch = group / heads_per_pattern;
    w.head_q = pattern_head * heads_per_pattern + group % heads_per_pattern;
    const int begin = s.item_tile_begin[item];
    int end = s.item_tile_begin[item + 1];
    // Tiles past the causal edge form a suffix of the ascending list: drop them before any load.
    const int last = last_key_tile<Cfg>(p, w.q_tile);
    while (end > begin && s.tile_index[end - 1] > last) --end;
    w.tiles = {end - begin, s.tile_index + begin, s.tile_mask + begin};
  }
  return w;
}

// Work item `index`, head-major: consecutive indices take the query tiles of one (batch, head),
// heaviest first, before the next one. The CTAs resident at one time then share a few heads' K/V,
// which L2 serves: rank-major (every head's heaviest tile first), the ~132 resident CTAs of an H100
// read ~132 different heads' key blocks, and a sparse forward reads each K/V tile once per query tile
// that visits it (0.94 GB from DRAM at density 0.1, B2 H16 S8192 D128, against 0.26 GB head-major).
template <class Cfg>
__device__ __forceinline__ WorkItem work_item_head_major(const AttentionForwardParams& p, unsigned index) {
  const int ranks = ranks_per_group<Cfg>(p);
  return work_item<Cfg>(p, index % ranks, index / ranks);
}

// Which (batch, head, query tile) this CTA of the mma.sync kernel computes: head-major, except for
// dense causal specs, whose items differ most in length: there rank-major (every head's heaviest
// item first, longest-processing-time scheduling) keeps the long rows from starting last. On the H100
// (path=mma, same-run A/B, 2026-11-23, fifteenth session) head-major took density 0.1 from 0.416-0.446
// to 0.393-0.405 ms at d = 128, pattern blocks of 64 from 0.544-0.577 to 0.477-0.487 (dense 4.63 to
// 4.13-4.16), and made dense causal 12% slower (1.74 to 1.95 ms).
template <class Cfg>
__device__ __forceinline__ WorkItem locate_work(const AttentionForwardParams& p) {
  if constexpr (Cfg::sparsity == kDense && Cfg::causal != kNotCausal) {
    const int groups = p.batch * p.heads_q;
    return work_item<Cfg>(p, blockIdx.x / groups, blockIdx.x % groups);
  } else {
    return work_item_head_major<Cfg>(p, blockIdx.x);
  }
}

// The item's Q rows, and the K and V of its key/value head (GQA: heads_q / heads_kv query heads each).
template <class T>
struct ItemInputs {
  const T* q;
  const T* k;
  const T* v;
};
template <class T>
__device__ __forceinline__ ItemInputs<T> item_inputs(const AttentionForwardParams& p, const WorkItem& w) {
  const int kv_head = w.head_q / (p.heads_q / p.heads_kv);
  return {static_cast<const T*>(p.q) + w.batch * p.q_batch_stride + w.head_q * p.q_head_stride,
          static_cast<const T*>(p.k) + w.batch * p.k_batch_stride + kv_head * p.k_head_stride,
          static_cast<const T*>(p.v) + w.batch * p.v_batch_stride + kv_head * p.v_head_stride};
}

// Whether the key tile at key0 of the query tile at q_row0 needs an element mask: the sequence end,
// the causal edge, or pattern blocks smaller than the tile. Other tiles skip mask_tile entirely.
template <class Cfg>
__device__ __forceinline__ bool tile_needs_mask(const AttentionForwardParams& p, int q_row0, int key0,
                                                unsigned long long pattern_mask) {
  constexpr int block_n = AttentionForwardTraits<Cfg>::block_n;
  const bool partial = key0 + block_n > p.seq_k;
  const bool causal_edge =
      Cfg::causal != kNotCausal &&
      key0 + block_n - 1 > q_row0 + (Cfg::causal == kCausalBottomRight ? p.seq_k - p.seq_q : 0);
  return partial || causal_edge || pattern_mask != kWholeTile;
}

// A tile's pattern mask has groups_per_tile_row bits for each pattern row of the tile, row-major
// (Tr: the forward's or the backward's traits). The bits of rows [row0, row0 + ROWS), where ROWS is a
// whole number of pattern rows or lies inside one:
template <class Tr, int ROWS>
__device__ __forceinline__ unsigned long long tile_mask_rows(int row0) {
  constexpr int rows = ROWS > Tr::group_rows ? ROWS / Tr::group_rows : 1;
  constexpr int bits = rows * Tr::groups_per_tile_row;
  constexpr unsigned long long row_bits = bits >= 64 ? ~0ull : (1ull << bits) - 1;
  return row_bits << (row0 / Tr::group_rows * Tr::groups_per_tile_row);
}
// The first bit of a row's pattern blocks; a pattern block holds whole 8-column mma tiles, so the bit
// of the row's scores in mma tile nt is that plus a constant of the unrolled loop (tile_mask_active).
template <class Tr>
__device__ __forceinline__ int tile_mask_row_bit(int row) {
  static_assert(Tr::group_cols % 8 == 0, "a pattern block holds whole 8-column mma tiles");
  return row / Tr::group_rows * Tr::groups_per_tile_row;
}
template <class Tr>
__device__ __forceinline__ bool tile_mask_active(unsigned long long pattern_mask, int row_bit, int nt) {
  return (pattern_mask >> (row_bit + nt * 8 / Tr::group_cols)) & 1ull;
}

// Whether any row of the warp may see a key of the tile: with pattern blocks shorter than the tile the
// tile is in the CTA's list for the union of its rows' key blocks, and a warp whose own rows have no
// active block in it skips the tile's math (its scores would all be masked: the same output, bit for
// bit).
template <class Tr>
__device__ __forceinline__ bool warp_sees_tile(unsigned long long pattern_mask, int warp_row0) {
  return (pattern_mask & tile_mask_rows<Tr, 16 * Tr::m_tiles>(warp_row0)) != 0;
}

// S = Q K^T for the warp's rows and one key tile.
template <class Tr, bool kQInRegisters, class QFrag>
__device__ __forceinline__ void score_tile(float (&s)[Tr::m_tiles][Tr::n_tiles][4], const QFrag& q_frag,
                                           const typename Tr::T* q_tile, const typename Tr::T* k_tile,
                                           int warp_row0) {
#pragma unroll
  for (int mt = 0; mt < Tr::m_tiles; ++mt)
#pragma unroll
    for (int nt = 0; nt < Tr::n_tiles; ++nt) s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.f;
#pragma unroll
  for (int ks = 0; ks < Tr::k_steps; ++ks) {
    unsigned a[Tr::m_tiles][4];
#pragma unroll
    for (int mt = 0; mt < Tr::m_tiles; ++mt) {
      if constexpr (kQInRegisters) {
#pragma unroll
        for (int r = 0; r < 4; ++r) a[mt][r] = q_frag[mt][ks][r];
      } else {
        load_a_fragment<Tr::head_dim>(a[mt], q_tile, warp_row0 + mt * 16, ks * 16);
      }
    }
#pragma unroll
    for (int np = 0; np < Tr::n_tiles / 2; ++np) {
      unsigned b[4];
      load_k_fragments<Tr::head_dim>(b, k_tile, np * 16, ks * 16);
#pragma unroll
      for (int mt = 0; mt < Tr::m_tiles; ++mt) {
        mma_16x8x16<typename Tr::T>(s[mt][2 * np], a[mt], b[0], b[1]);
        mma_16x8x16<typename Tr::T>(s[mt][2 * np + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

// Sets the scores of keys a row may not see to -inf: past the sequence end, past the causal edge,
// or in an inactive pattern block of this tile (a whole tile's mask is all ones).
template <class Cfg>
__device__ __forceinline__ void mask_tile(float (&s)[AttentionForwardTraits<Cfg>::m_tiles][AttentionForwardTraits<Cfg>::n_tiles][4],
                                          const AttentionForwardParams& p, int q_row0, int warp_row0, int key0,
                                          unsigned long long pattern_mask) {
  using Tr = AttentionForwardTraits<Cfg>;
  const int lane = threadIdx.x % 32;
  const int offset = Cfg::causal == kCausalBottomRight ? p.seq_k - p.seq_q : 0;
#pragma unroll
  for (int mt = 0; mt < Tr::m_tiles; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row_local = warp_row0 + mt * 16 + lane / 4 + h * 8;
      const int row_bit = tile_mask_row_bit<Tr>(row_local);
#pragma unroll
      for (int nt = 0; nt < Tr::n_tiles; ++nt) {
        const bool block_active = tile_mask_active<Tr>(pattern_mask, row_bit, nt);
#pragma unroll
        for (int e = 2 * h; e < 2 * h + 2; ++e) {
          const int col_local = nt * 8 + 2 * (lane % 4) + (e % 2);
          bool allowed = block_active && key0 + col_local < p.seq_k;
          if constexpr (Cfg::causal != kNotCausal) allowed = allowed && key0 + col_local <= q_row0 + row_local + offset;
          if (!allowed) s[mt][nt][e] = -infinity();
        }
      }
    }
}

// Row h (g or g + 8) of mma tile mt: its maximum score over the tile (the warp's 4 lanes of the row).
template <class Tr>
__device__ __forceinline__ float tile_row_max(const float (&s)[Tr::m_tiles][Tr::n_tiles][4], int mt, int h) {
  float row = -infinity();
#pragma unroll
  for (int nt = 0; nt < Tr::n_tiles; ++nt) row = fmaxf(row, fmaxf(s[mt][nt][2 * h], s[mt][nt][2 * h + 1]));
  row = fmaxf(row, __shfl_xor_sync(0xffffffffu, row, 1));
  return fmaxf(row, __shfl_xor_sync(0xffffffffu, row, 2));
}
// The exponent of a row whose running maximum is row_max: 0 for a row that has seen only masked keys.
__device__ __forceinline__ float exponent_base(float row_max) { return row_max == -infinity() ? 0.f : row_max; }
// The same row's scores turned into P = exp2(S*c - base), and added to its running sum.
template <class Tr>
__device__ __forceinline__ void exponentiate_row(float (&s)[Tr::m_tiles][Tr::n_tiles][4], int mt, int h,
                                                 float base, float& row_sum, float scale_log2) {
#pragma unroll
  for (int nt = 0; nt < Tr::n_tiles; ++nt)
#pragma unroll
    for (int e = 2 * h; e < 2 * h + 2; ++e) {
      const float prob = fast_exp2(fmaf(s[mt][nt][e], scale_log2, -base));
      row_sum += prob;
      s[mt][nt][e] = prob;
    }
}

// How far (log2 domain) a row's maximum may rise above its exponent base before the base moves, where
// the caller lets bases lag (softmax_scores): P then stays at most 2^8, which T, the fp32 sums and the
// fp32 outputs hold without loss.
constexpr float kBaseLag = 8.f;

// Online softmax step (Milakov & Gimelshein 2018) for the warp's rows, scores only: raises the
// exponent bases (the running maxima), rescales the running sums, turns S into P = exp2(S*c - base),
// and returns whether the bases moved; where they did, `correction` holds the factor
// exp2(old base - new base) the running outputs must still be multiplied by (else it is not written).
// With kLagBase (FlashAttention-4's conditional rescaling) the bases move only where a row of the warp
// rose more than kBaseLag above its base, and then all of the warp's at once: after a row's first
// tiles few tiles move them, and the caller skips the rescale of the outputs (a multiply an element).
// The math is unchanged: the output and the sum share the base, and the log-sum-exp adds it back.
// A row that has seen only masked keys keeps base -inf; it exponentiates against 0 instead, so
// -inf - -inf never produces NaN and its P, sum and output stay exactly 0.
template <class Tr, bool kLagBase = false>
__device__ __forceinline__ bool softmax_scores(float (&s)[Tr::m_tiles][Tr::n_tiles][4],
                                               float (&row_max)[Tr::m_tiles][2], float (&row_sum)[Tr::m_tiles][2],
                                               float (&correction)[Tr::m_tiles][2], float scale_log2) {
  auto move_base = [&](int mt, int h, float tile_max) {  // returns the new base
    const float new_max = fmaxf(row_max[mt][h], tile_max);
    const float base = exponent_base(new_max);
    correction[mt][h] = fast_exp2(row_max[mt][h] - base);
    row_max[mt][h] = new_max;
    row_sum[mt][h] *= correction[mt][h];
    return base;
  };
  if constexpr (!kLagBase) {
#pragma unroll
    for (int mt = 0; mt < Tr::m_tiles; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float base = move_base(mt, h, tile_row_max<Tr>(s, mt, h) * scale_log2);
        exponentiate_row<Tr>(s, mt, h, base, row_sum[mt][h], scale_log2);
      }
    return true;
  } else {
    float tile_max[Tr::m_tiles][2];
    bool rises = false;
#pragma unroll
    for (int mt = 0; mt < Tr::m_tiles; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        tile_max[mt][h] = tile_row_max<Tr>(s, mt, h) * scale_log2;
        rises = rises || tile_max[mt][h] > row_max[mt][h] + kBaseLag;  // a -inf base: any finite score
      }
    const bool move = __any_sync(0xffffffffu, rises);
#pragma unroll
    for (int mt = 0; mt < Tr::m_tiles; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float base = move ? move_base(mt, h, tile_max[mt][h]) : exponent_base(row_max[mt][h]);
        exponentiate_row<Tr>(s, mt, h, base, row_sum[mt][h], scale_log2);
      }
    return move;
  }
}

// Multiplies the running outputs of each row by its softmax correction.
template <class Tr>
__device__ __forceinline__ void rescale_output(float (&o)[Tr::m_tiles][Tr::d_tiles][4],
                                               const float (&correction)[Tr::m_tiles][2]) {
#pragma unroll
  for (int mt = 0; mt < Tr::m_tiles; ++mt)
#pragma unroll
    for (int dt = 0; dt < Tr::d_tiles; ++dt) {
      o[mt][dt][0] *= correction[mt][0];
      o[mt][dt][1] *= correction[mt][0];
      o[mt][dt][2] *= correction[mt][1];
      o[mt][dt][3] *= correction[mt][1];
    }
}

// The mma.sync kernel's online softmax step: scores to probabilities, then the running outputs
// rescaled where a base moved. At d >= 128 its bases lag (softmax_scores): each warp runs its tiles
// one after the other, so the rescale it skips, 64 to 128 multiplies a thread, comes off every tile's
// path. On the H100 (Nsight Compute, same-run A/B, 2026-11-24, twenty-third session): d = 256 dense
// 4.5% faster, d = 128 dense 2.3%, pattern blocks of 32 at density 0.1 3.2%; at d = 96 and 64, where
// the rescale is shorter, the vote cost more than it saved (dense d = 96 3.6% slower, d = 64 1%).
template <class Tr>
__device__ __forceinline__ void online_softmax(float (&s)[Tr::m_tiles][Tr::n_tiles][4],
                                               float (&row_max)[Tr::m_tiles][2], float (&row_sum)[Tr::m_tiles][2],
                                               float (&o)[Tr::m_tiles][Tr::d_tiles][4], float scale_log2) {
  constexpr bool lag_base = Tr::head_dim >= 128;
  float correction[Tr::m_tiles][2];
  if (softmax_scores<Tr, lag_base>(s, row_max, row_sum, correction, scale_log2)) rescale_output<Tr>(o, correction);
}

// O += P V for the warp's rows and one key tile; P (in s) is rounded to T for the tensor cores.
template <class Tr>
__device__ __forceinline__ void accumulate_values(float (&o)[Tr::m_tiles][Tr::d_tiles][4],
                                                  const float (&s)[Tr::m_tiles][Tr::n_tiles][4],
                                                  const typename Tr::T* v_tile) {
  using T = typename Tr::T;
#pragma unroll
  for (int kk = 0; kk < Tr::block_n / 16; ++kk) {
    unsigned a[Tr::m_tiles][4];
#pragma unroll
    for (int mt = 0; mt < Tr::m_tiles; ++mt) pack_a_fragment<T>(s[mt], kk, a[mt]);
#pragma unroll
    for (int dp = 0; dp < Tr::head_dim / 16; ++dp) {
      unsigned b[4];
      load_v_fragments<Tr::head_dim>(b, v_tile, kk * 16, dp * 16);
#pragma unroll
      for (int mt = 0; mt < Tr::m_tiles; ++mt) {
        mma_16x8x16<T>(o[mt][2 * dp], a[mt], b[0], b[1]);
        mma_16x8x16<T>(o[mt][2 * dp + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

// The warp's rows of the output, normalized and rounded to T (two per register, in the accumulator's
// layout), and their log-sum-exp: what stage_output writes.
template <class Tr>
struct PackedOutput {
  unsigned o[Tr::m_tiles][2][Tr::d_tiles];
  float lse[Tr::m_tiles][2];
};
template <class Tr>
__device__ __forceinline__ PackedOutput<Tr> pack_output(const float (&o)[Tr::m_tiles][Tr::d_tiles][4],
                                                        const float (&row_max)[Tr::m_tiles][2],
                                                        const float (&row_sum)[Tr::m_tiles][2]) {
  constexpr float ln2 = 0.6931471805599453f;
  PackedOutput<Tr> out;
#pragma unroll
  for (int mt = 0; mt < Tr::m_tiles; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float sum = row_sum[mt][h];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      // A row that saw no key: output 0 and log-sum-exp -inf (the log of an empty sum), never NaN.
      const float inv = sum > 0.f ? 1.f / sum : 0.f;
      out.lse[mt][h] = sum > 0.f ? (row_max[mt][h] + __log2f(sum)) * ln2 : -infinity();
#pragma unroll
      for (int dt = 0; dt < Tr::d_tiles; ++dt)
        out.o[mt][h][dt] = pack2<typename Tr::T>(o[mt][dt][2 * h] * inv, o[mt][dt][2 * h + 1] * inv);
    }
  return out;
}

// Writes the log-sum-exp of the warp's rows, and their output into the warp's own rows of a staging
// tile in shared memory. `staged(row, col)` is the staging address of element (row, col) of the query
// tile, in the caller's layout (padded rows, or the wgmma swizzle); 8 consecutive columns from a
// multiple of 8 must be one 16-byte chunk.
template <class Tr, class Staged>
__device__ __forceinline__ void write_output(const PackedOutput<Tr>& out, Staged staged, float* lse_row0, int q_row0,
                                             int warp_row0, int seq_q) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int mt = 0; mt < Tr::m_tiles; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row_local = warp_row0 + mt * 16 + lane / 4 + h * 8;
      if (lse_row0 != nullptr && lane % 4 == 0 && q_row0 + row_local < seq_q) lse_row0[row_local] = out.lse[mt][h];
#if __CUDA_ARCH__ < 900
#pragma unroll
      for (int dt = 0; dt < Tr::d_tiles; ++dt)
        *reinterpret_cast<unsigned*>(staged(row_local, dt * 8 + 2 * (lane % 4))) = out.o[mt][h][dt];
#endif
    }
#if __CUDA_ARCH__ >= 900
    // Four 8 x 8 matrices a stmatrix, a quarter of the stores: rows 0-7 and 8-15 of the warp's 16 (h),
    // columns of d-tiles dt and dt + 1. Lane 8j + r names row r of matrix j.
    static_assert(Tr::d_tiles % 2 == 0, "stmatrix stores d-tiles in pairs");
    const int row = warp_row0 + mt * 16 + (lane & 7) + (lane & 8);
#pragma unroll
    for (int dt = 0; dt < Tr::d_tiles; dt += 2)
      stmatrix_x4(smem_address(staged(row, (dt + lane / 16) * 8)), out.o[mt][0][dt], out.o[mt][1][dt],
                  out.o[mt][0][dt + 1], out.o[mt][1][dt + 1]);
#endif
  }
}

// Normalizes the warp's rows, writes their log-sum-exp, and writes O (rounded to T) into the warp's
// own rows of a staging tile (write_output).
template <class Tr, class Staged>
__device__ __forceinline__ void stage_output(const float (&o)[Tr::m_tiles][Tr::d_tiles][4],
                                             const float (&row_max)[Tr::m_tiles][2],
                                             const float (&row_sum)[Tr::m_tiles][2], Staged staged, float* lse_row0,
                                             int q_row0, int warp_row0, int seq_q) {
  write_output<Tr>(pack_output<Tr>(o, row_max, row_sum), staged, lse_row0, q_row0, warp_row0, seq_q);
}

// stage_output, then the warp's staged rows to global memory with 16-byte coalesced stores (no other
// warp reads them).
template <class Tr, class Staged>
__device__ __forceinline__ void store_output(float (&o)[Tr::m_tiles][Tr::d_tiles][4], float (&row_max)[Tr::m_tiles][2],
                                             float (&row_sum)[Tr::m_tiles][2], Staged staged, typename Tr::T* out,
                                             long long out_row_stride, float* lse_row0, int q_row0, int warp_row0,
                                             int seq_q) {
  stage_output<Tr>(o, row_max, row_sum, staged, lse_row0, q_row0, warp_row0, seq_q);
  __syncwarp();
  const int lane = threadIdx.x % 32;
  constexpr int chunks_per_row = Tr::head_dim / 8, warp_rows = 16 * Tr::m_tiles;
#pragma unroll
  for (int i = lane; i < warp_rows * chunks_per_row; i += 32) {
    const int row_local = warp_row0 + i / chunks_per_row, c = i % chunks_per_row;
    if (q_row0 + row_local < seq_q)
      *reinterpret_cast<uint4*>(out + (q_row0 + row_local) * out_row_stride + c * 8) =
          *reinterpret_cast<const uint4*>(staged(row_local, c * 8));
  }
}

// The staging address function of a tile of padded rows (attention_tiles.cuh).
template <class Tr>
struct PaddedRows {
  typename Tr::T* tile;
  __device__ typename Tr::T* operator()(int row, int col) const { return tile + row * Tr::row_elems + col; }
};

template <class Cfg>
__global__ void __launch_bounds__(AttentionForwardTraits<Cfg>::threads)
    attention_forward(const AttentionForwardParams p) {
  using Tr = AttentionForwardTraits<Cfg>;
  using T = typename Tr::T;
  constexpr int stages = Cfg::stages;
  extern __shared__ __align__(16) unsigned char shared_raw[];
  T* q_tile = reinterpret_cast<T*>(shared_raw);
  T* k_ring = q_tile + Tr::q_tile_elems;
  T* v_ring = k_ring + stages * Tr::kv_tile_elems;

  const WorkItem w = locate_work<Cfg>(p);
  const int q_row0 = w.q_tile * Tr::block_m;
  if (q_row0 >= p.seq_q) return;  // a schedule item past the end of a short sequence: nothing to do
  const ItemInputs<T> in = item_inputs<T>(p, w);
  const T *q = in.q, *k = in.k, *v = in.v;
  const KeyTiles& tiles = w.tiles;

  auto load_key_tile = [&](int j) {  // the j-th tile of the list into ring slot j % stages
    const int key0 = tiles.tile(j) * Tr::block_n;
    const int slot = j % stages;
    load_tile_async<T, Tr::head_dim, Tr::block_n, Tr::threads>(k_ring + slot * Tr::kv_tile_elems, k, p.k_row_stride,
                                                                key0, p.seq_k);
    load_tile_async<T, Tr::head_dim, Tr::block_n, Tr::threads>(v_ring + slot * Tr::kv_tile_elems, v, p.v_row_stride,
                                                                key0, p.seq_k);
  };

  // Prologue: Q and the first stages - 1 key tiles, one commit group per tile (empty groups keep
  // the count uniform so that wait_group<stages - 2> always means "tile j has landed").
  load_tile_async<T, Tr::head_dim, Tr::block_m, Tr::threads>(q_tile, q, p.q_row_stride, q_row0, p.seq_q);
#pragma unroll
  for (int j = 0; j < stages - 1; ++j) {
    if (j < tiles.count) load_key_tile(j);
    cp_async_commit();
  }

  const int warp_row0 = (threadIdx.x / 32) * 16 * Tr::m_tiles;
  float o[Tr::m_tiles][Tr::d_tiles][4];
  float row_max[Tr::m_tiles][2], row_sum[Tr::m_tiles][2];
#pragma unroll
  for (int mt = 0; mt < Tr::m_tiles; ++mt) {
#pragma unroll
    for (int dt = 0; dt < Tr::d_tiles; ++dt) o[mt][dt][0] = o[mt][dt][1] = o[mt][dt][2] = o[mt][dt][3] = 0.f;
    row_max[mt][0] = row_max[mt][1] = -infinity();
    row_sum[mt][0] = row_sum[mt][1] = 0.f;
  }
  unsigned q_frag[Cfg::q_in_registers ? Tr::m_tiles : 1][Cfg::q_in_registers ? Tr::k_steps : 1][4];

  for (int j = 0; j < tiles.count; ++j) {
    cp_async_wait<stages - 2>();
    __syncthreads();  // tile j visible to all; every warp is done with slot (j - 1) % stages
    if (j + stages - 1 < tiles.count) load_key_tile(j + stages - 1);
    cp_async_commit();
    if constexpr (Cfg::q_in_registers) {
      if (j == 0)
#pragma unroll
        for (int mt = 0; mt < Tr::m_tiles; ++mt)
#pragma unroll
          for (int ks = 0; ks < Tr::k_steps; ++ks)
            load_a_fragment<Tr::head_dim>(q_frag[mt][ks], q_tile, warp_row0 + mt * 16, ks * 16);
    }
    const int slot = j % stages;
    const int key0 = tiles.tile(j) * Tr::block_n;
    const unsigned long long pattern_mask = tiles.pattern_mask(j);
    if (!warp_sees_tile<Tr>(pattern_mask, warp_row0)) continue;  // the same for every lane of the warp

    float s[Tr::m_tiles][Tr::n_tiles][4];
    score_tile<Tr, Cfg::q_in_registers>(s, q_frag, q_tile, k_ring + slot * Tr::kv_tile_elems, warp_row0);
    if (tile_needs_mask<Cfg>(p, q_row0, key0, pattern_mask)) mask_tile<Cfg>(s, p, q_row0, warp_row0, key0, pattern_mask);
    online_softmax<Tr>(s, row_max, row_sum, o, p.scale_log2);
    accumulate_values<Tr>(o, s, v_ring + slot * Tr::kv_tile_elems);
  }

  // A CTA with no key tile still has Q in flight, loaded by every thread: drain and meet before
  // the warps reuse their rows of the Q tile for the output.
  cp_async_wait<0>();
  __syncthreads();
  T* out = static_cast<T*>(p.o) + w.batch * p.o_batch_stride + w.head_q * p.o_head_stride;
  float* lse_row0 =
      p.lse ? p.lse + (static_cast<long long>(w.batch) * p.heads_q + w.head_q) * p.seq_q + q_row0 : nullptr;
  store_output<Tr>(o, row_max, row_sum, PaddedRows<Tr>{q_tile}, out, p.o_row_stride, lse_row0, q_row0, warp_row0,
                   p.seq_q);
}

// The gathered kernels' masks (path=wgmma_gather): each score of a warpgroup's accumulator tile to
// -inf where its key is padding (a step's positions past the walk's last block), lies past Sk, or
// (causal) comes after its query. key_of(c, e) and query_of(c, e) name element e of chunk c's key and
// query: the kernels lay keys and queries out as rows or columns.
template <int CAUSAL, int CHUNKS, class KeyOf, class QueryOf>
__device__ __forceinline__ void mask_gathered_scores(float (&s)[CHUNKS][4], bool padding, int seq_q, int seq_k,
                                                     KeyOf key_of, QueryOf query_of) {
  const int causal_offset = CAUSAL == kCausalBottomRight ? seq_k - seq_q : 0;
#pragma unroll
  for (int c = 0; c < CHUNKS; ++c)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = key_of(c, e);
      bool allowed = !padding && key < seq_k;
      if constexpr (CAUSAL != kNotCausal) allowed = allowed && key <= query_of(c, e) + causal_offset;
      if (!allowed) s[c][e] = -infinity();
    }
}

}  // namespace sjit_kernels

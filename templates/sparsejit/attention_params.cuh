// The arguments of one attention launch. Plain types only: this header is compiled by NVRTC for the
// kernels and by the host compiler for the front end, and both must agree on the layout.
#pragma once

namespace sjit_kernels {

// Sentinel of a tile's sub-block mask: every element of the tile is allowed by the pattern.
constexpr unsigned long long kWholeTile = ~0ull;

struct AttentionForwardParams {
  const void* q;  // [B, Hq, Sq, D] by the strides below (elements), unit stride along D
  const void* k;  // [B, Hkv, Sk, D]
  const void* v;  // [B, Hkv, Sk, D]
  void* o;        // [B, Hq, Sq, D]
  float* lse;     // [B, Hq, Sq] contiguous, natural log; -inf for a row that sees no key
  long long q_batch_stride, q_head_stride, q_row_stride;
  long long k_batch_stride, k_head_stride, k_row_stride;
  long long v_batch_stride, v_head_stride, v_row_stride;
  long long o_batch_stride, o_head_stride, o_row_stride;
  int batch, heads_q, heads_kv, seq_q, seq_k;
  float scale_log2;  // softmax scale times log2(e): scores live in the exp2 domain

  // Block-sparse schedule (ignored by dense kernels; baked kernels carry their own): for each work
  // item (pattern head, query tile), the key tiles it visits and which pattern blocks of each tile are
  // active. Built on the host from the pattern once per tile shape; see docs/attention.md.
  const int* item_tile_begin;               // [items + 1] into tile_index / tile_mask
  const int* tile_index;                    // key tile numbers, ascending within an item
  const unsigned long long* tile_mask;      // bit (row group * groups per tile row + column group)
  const int* item_order;                    // launch rank -> item, heaviest first
  int pattern_heads;                        // 1 (shared by every head) or heads_q
  int q_tiles;                              // query tiles per head: ceil(Sq / block_m)
  int work_items;                           // (batch, head, query tile) items: one CTA each, or shared
                                            // out among the persistent kernel's CTAs
  // The persistent kernel's last round split across CTAs (attention_forward_sm90_ws.cuh, LastRound):
  // the last tail_items items are shared out by key tiles among CTAs 0 .. tail_ctas - 1, and each
  // split item's pieces merged by the piece that ends it. 0: every item whole.
  int tail_items, tail_ctas;
  void* tail_partials;       // [gridDim.x slots] of a staged output tile and block_m fp32 log-sum-exps
  unsigned* tail_counters;   // [tail_items], zero on entry and left zero
};

// The driver's CUtensorMap (a copy descriptor for the Tensor Memory Accelerator): 128 opaque bytes,
// 64-byte aligned, encoded on the host by cuTensorMapEncodeTiled.
struct alignas(64) TensorMap {
  unsigned long long opaque[16];
};

// The Hopper forward's second parameter (passed as __grid_constant__ so the copy engine can read the
// maps in parameter space): Q, K and V as 4-d tensors [B, H, S, D] of 64-column, 128-byte-swizzled
// boxes, block_m rows for Q and O (which the persistent kernel stores by bulk copies) and block_n
// rows for K and V.
struct AttentionForwardTensorMaps {
  TensorMap q, k, v, o;
};

// The Hopper dK/dV pass's: Q and dO in boxes of the query tile's rows, K and V of the key tile's; with
// atomic dQ the fp32 accumulator, which the pass adds to with bulk reductions (32-column boxes). Where
// its tiles are packed from query runs (PackedQueries), the *_runs maps have boxes of a run's rows,
// for the tiles whose runs do not lie end to end.
struct AttentionBackwardTensorMaps {
  TensorMap q, d_o, k, v, dq_accum;
  TensorMap q_runs, d_o_runs, dq_accum_runs;
};

}  // namespace sjit_kernels

namespace sjit_kernels {

// The backward's per-row kernels (prep, dq_convert) run CTAs of 256 threads. A row's 8-element chunks
// lie on a segment of a warp, D / 8 lanes rounded up to a power of two (a warp a row left half the
// lanes idle), and each thread takes one row: at D = 128 a CTA has 16 rows, 8 KB of loads, in flight,
// and with 28 registers a thread an SM holds 8 CTAs. More rows a thread meant more registers and
// fewer CTAs: the pre-pass at B2 H16 S8192 took 55-56 us with one row, 65-66 with two, 78-79 with
// four (H100, ncu).
constexpr int per_row_lanes(int head_dim) {
  return head_dim <= 32 ? 4 : head_dim <= 64 ? 8 : head_dim <= 128 ? 16 : 32;
}
constexpr int kPerRowRowsPerThread = 1;
constexpr int per_row_cta_rows(int head_dim) { return 256 / per_row_lanes(head_dim) * kPerRowRowsPerThread; }

// The arguments of the backward kernels (dQ; dK and dV; and the pre-pass that computes each row's
// delta = rowsum(dO * O) and its log-sum-exp in the exp2 domain).
struct AttentionBackwardParams {
  const void* q;
  const void* k;
  const void* v;
  const void* o;
  const void* d_o;
  const float* lse;  // [B, Hq, Sq] from the forward, natural log
  float* delta;      // [B, Hq, Sq] scratch, written by the pre-pass
  float* lse2;       // [B, Hq, Sq] scratch: lse * log2(e), +inf for a row that saw no key
  void* dq;
  float* dq_accum;   // atomic dQ only: [B, Hq, Sq, head_dim] fp32 scratch, zero on entry and left zero
                     // by whatever converts it to dQ (zeroed once, when allocated)
  void* dk;
  void* dv;
  long long q_batch_stride, q_head_stride, q_row_stride;
  long long k_batch_stride, k_head_stride, k_row_stride;
  long long v_batch_stride, v_head_stride, v_row_stride;
  long long o_batch_stride, o_head_stride, o_row_stride;
  long long do_batch_stride, do_head_stride, do_row_stride;
  long long dq_batch_stride, dq_head_stride, dq_row_stride;
  long long dk_batch_stride, dk_head_stride, dk_row_stride;
  long long dv_batch_stride, dv_head_stride, dv_row_stride;
  int batch, heads_q, heads_kv, seq_q, seq_k;
  float scale, scale_log2;

  // Query-major schedule (the forward's, for the dQ kernel) and key-major schedule (the transposed
  // pattern's, for the dK/dV kernel); same layout as AttentionForwardParams' schedule.
  const int* q_item_tile_begin;
  const int* q_tile_index;
  const unsigned long long* q_tile_mask;
  const int* q_item_order;
  int q_items_per_head;  // query tiles per head in the query-major schedule
  const int* k_item_tile_begin;
  const int* k_tile_index;
  const unsigned long long* k_tile_mask;
  const int* k_item_order;  // each pattern head's key tiles, heaviest first
  int k_items_per_head;  // key tiles per head in the key-major schedule
  int k_query_rows;      // its query tiles' rows: one pattern block where the Hopper dK/dV pass packs them
  int pattern_heads;

  // Atomic dQ's conversion. The Hopper dK/dV pass converts a group's rows (the query heads of one
  // (batch, K/V head), contiguous in the accumulator) in the CTAs `convert_lag` groups later, once all
  // of the group's CTAs have counted themselves in groups_done; dq_convert converts the rows from
  // convert_row0 on (all of them after the mma.sync dK/dV pass, the last groups after the Hopper one).
  unsigned* groups_done;    // [B * Hkv], reset by the pre-pass
  int convert_lag;          // groups
  long long convert_row0;   // flat query row
  // The dK/dV pass's last groups, whose CTAs take turns (key_tile_owner); at most convert_lag.
  int tail_groups;
};

}  // namespace sjit_kernels

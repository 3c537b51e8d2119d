// Fused softmax attention, dense or block-sparse: what a kernel is specialized for.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "sparsejit/dtype.h"
#include "sparsejit/rownorm_spec.h"  // Pass

namespace sjit {

// Causal masking: query i sees key j iff j <= i (top_left) or j <= i + seq_k - seq_q (bottom_right,
// the alignment of a decoder whose queries are the last seq_q positions).
enum class Causal { none, top_left, bottom_right };

// dense: every key tile. block_sparse: a BSR pattern given at launch (one kernel serves every pattern
// of that block size). baked: the pattern is compiled into the kernel as constants (one kernel per
// pattern, named by its digest; for learned patterns that stay fixed).
enum class Sparsity { dense, block_sparse, baked };

struct AttentionSpec {
  int head_dim = 128;               // 32, 64, 96, 128 or 256
  DType dtype = DType::bf16;        // f16 or bf16 in and out; fp32 accumulation
  Causal causal = Causal::none;
  Sparsity sparsity = Sparsity::dense;
  int block_size = 0;               // pattern block size (16, 32, 64, 128); 0 for dense
  std::uint64_t pattern_digest = 0; // baked only: BlockPattern::digest() of the baked pattern
  Pass pass = Pass::forward;
  // Backward only. true: dQ has a pass of its own that owns its rows (no atomics: the same inputs give
  // the same bits). false: whichever is faster for the call, which is mostly dQ accumulated with fp32
  // atomics inside the dK/dV pass (one pass over the tiles; the summation order, and so the last bits
  // of dQ, vary from run to run), but on Hopper the dQ pass where query rows see few key tiles, at
  // head_dim 64, with 2 or 3 query heads a K/V head below 8 key tiles of 128 a query row, and with 4
  // or more below 20 (docs/attention.md; AttentionBackwardArgs::dq_summation,
  // SJIT_BACKWARD_DQ=atomic or pass, or a stored tune_dq_summation result override the choice).
  bool deterministic = false;

  friend bool operator==(const AttentionSpec&, const AttentionSpec&) = default;
};

// Checks every field (throws InvalidSpec naming the field, its value and what is allowed) and returns
// the canonical form (block_size and digest cleared where they do not apply).
AttentionSpec canonical(const AttentionSpec& spec);

// "attention:d=128,dtype=bf16,causal=none,sparsity=bsr,block=64,pass=fwd"; a deterministic spec adds
// ",det=1" and a baked one ends with ",pattern=<16 hex digits>". parse_attention is the inverse.
std::string key(const AttentionSpec& spec);
AttentionSpec parse_attention(std::string_view text);

std::string_view name(Causal causal);      // none | tl | br
std::string_view name(Sparsity sparsity);  // dense | bsr | baked

}  // namespace sjit

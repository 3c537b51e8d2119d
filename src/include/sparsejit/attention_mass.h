// How much attention each tile of blocks holds: the scores that patterns::from_scores learns a
// block-sparse pattern from (docs/patterns.md, "Learned patterns").
#pragma once

#include <vector>

#include "sparsejit/attention.h"

namespace sjit {

// The attention mass of every (query block, key block) tile of blocks of `block_size`: for each query
// head, the sum over the batch and over the tile's (query, key) pairs of the softmax probabilities of
// `spec`'s attention of args.q and args.k (dense, or causal as the spec says). Returned as floats
// [heads_q][ceil(seq_q / block_size)][ceil(seq_k / block_size)]; a block row's masses sum to its
// query rows that see a key, times the batch.
//
// Measured on the GPU with this library's own kernels (a forward, then backwards whose dO picks out
// the query blocks: dV = P^T dO holds, key by key, the probabilities summed over a block's rows), so
// it costs about a dense forward and backward per query head of a K/V group and per head_dim query
// blocks; the masses come out of bf16 or f16 gradients, to about 0.5%. It reads args.q, args.k, the
// shape, strides and scale; args.v, o, lse, pattern and last_round are not read (P needs no V).
// spec.sparsity must be dense. Throws InvalidArgument as forward() does, and for a block size other
// than 16, 32, 64 or 128. Synchronizes `stream`.
std::vector<float> attention_block_mass(const AttentionSpec& spec, const AttentionForwardArgs& args, int block_size,
                                        Stream stream = nullptr);

}  // namespace sjit

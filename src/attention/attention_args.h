// Argument checks of the attention launches: every refusal names the argument, its value, and what is
// allowed. Also fills defaulted strides and the scale.
#pragma once

#include "sparsejit/attention.h"

namespace sjit::attention {

// Returns the arguments with zero strides replaced by contiguous [B, H, S, D] and scale defaulted.
// `baked` is the baked pattern of a baked spec (null otherwise). Throws InvalidArgument.
AttentionForwardArgs checked_forward_args(const AttentionSpec& spec, const AttentionForwardArgs& args,
                                          const BlockPattern* baked);

// The same checks for the backward; outputs (dq, dk, dv) must not overlap any input or each other.
AttentionBackwardArgs checked_backward_args(const AttentionSpec& spec, const AttentionBackwardArgs& args,
                                            const BlockPattern* baked);

// Checks that the spec takes a pattern (it is not dense) of this pattern's block size.
void check_pattern_fits_spec(const AttentionSpec& spec, const BlockPattern& pattern);

// Checks that a pattern fits the spec and the sequence lengths.
void check_pattern(const AttentionSpec& spec, const BlockPattern& pattern, std::int64_t heads_q, std::int64_t seq_q,
                   std::int64_t seq_k);

}  // namespace sjit::attention

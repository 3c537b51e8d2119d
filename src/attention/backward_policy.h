// The backward's choices that depend on the problem, not on the kernels (backward_policy.cpp has the
// measurements behind them).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "sparsejit/attention.h"

namespace sjit::attention {

// Whether the Hopper dK/dV pass converts atomic dQ's accumulator itself, given the mean number of
// active key tiles a query row sees, rather than leaving it all to dq_convert.
bool worth_converting_in_pass(double key_tiles_per_row);

// Whether atomic dQ's working set for one K/V group outgrows the device's L2 (`l2_bytes`): the fp32
// accumulator of the group's query rows with their Q and dO, group * seq_q * head_dim * 8 bytes, which
// the resident dK/dV CTAs (a group's key tiles at a time) add to and read. Then the adds of a sparse
// pattern, which land on any row of the group, miss the L2 and each costs DRAM traffic.
bool accumulator_spills(std::int64_t group, std::int64_t seq_q, int head_dim, std::int64_t l2_bytes);

// Where the Hopper backward's dQ pass beats atomic dQ at `head_dim` (choose_dq_summation's rule; d = 64
// on 128-query dK/dV tiles, its own figures; d = 96 as 128), on a device whose DRAM moves
// `memory_bandwidth` bytes a second (0: unknown, taken as the H100's
// 3.35 TB/s): the faster the DRAM, the cheaper atomic dQ's reductions, and the fewer the tiles where
// the pass wins. In mean active key tiles a query row (counted before the causal cut), below which
// the pass is taken, by query heads a K/V head (four or more, with causal masking apart; two or
// three; one; and where the dK/dV walks make a band, whatever the group: attention::contiguous_walks);
// and where the accumulator spills out of the L2, the share of the sequence's key tiles below which it
// is taken whatever the group.
struct DqPassThresholds {
  double four_heads, four_heads_causal, two_heads, one_head, band;
  double beyond_l2_share;
};
DqPassThresholds dq_pass_thresholds(double memory_bandwidth, int head_dim = 128);

// How the backward of `spec` sums dQ on a device (sm90: the Hopper kernels), for a problem whose query
// rows see `key_tiles_per_row` active key tiles on average, with `group` query heads a K/V head;
// `spilled_key_tiles`: where accumulator_spills, the sequence's key tiles (of the 128-key dK/dV pass),
// else 0; `memory_bandwidth`: the device's (DeviceInfo::memory_bandwidth, 0 if unknown);
// `dkdv_query_cols`: the queries a tile of the dK/dV pass the pattern runs (0: the spec's default
// tiling's; at d = 64 on 64-query tiles the rule takes the pass); `banded`: the dK/dV pass's walks make
// a band (attention::contiguous_walks), which has a threshold of its own whatever the group, and whose
// accumulator is not taken to spill (its running CTAs add to the same rows).
// The first that applies decides:
//   - `asked` (AttentionBackwardArgs::dq_summation): the way asked for; atomic where the spec needs the
//     pass (deterministic, or d = 256) is refused (InvalidArgument);
//   - the spec needs the pass;
//   - `forced`, SJIT_BACKWARD_DQ's value: "atomic" or "pass" forces that way; "" or "auto" does not;
//     anything else is refused (InvalidArgument), whatever the spec;
//   - `tuned`, the way a tuning stored for this problem (tuning::tuned_dq_summation);
//   - the rule measured on the H100 and the H200 (dq_pass_thresholds); `gathered` says the pattern
//     runs the gathered backward (pattern blocks of 16, 32 and 64: attention/packed_queries.h), which has
//     a rule of its own: the pass with four or more query heads a K/V head or an accumulator beyond
//     the L2, atomic otherwise.
DqSummation choose_dq_summation(const AttentionSpec& spec, bool sm90, double key_tiles_per_row, std::int64_t group,
                                std::string_view forced, std::optional<DqSummation> asked = std::nullopt,
                                std::optional<DqSummation> tuned = std::nullopt, bool gathered = false,
                                std::int64_t spilled_key_tiles = 0, double memory_bandwidth = 0,
                                int dkdv_query_cols = 0, bool banded = false);

// SJIT_BACKWARD_DQ's value, or "" when unset.
std::string_view forced_dq_summation();

}  // namespace sjit::attention

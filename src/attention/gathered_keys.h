// Pattern blocks of 16 on Hopper: whether a pattern that would run on the narrow tiles runs faster on
// the gathered-key kernel (path=wgmma_gather: a warpgroup a query block, 64 of its keys a step,
// attention_forward_sm90_gather.cuh). The narrow tiles compute every key block any of a tile's four
// query blocks sees, for all four; the gathered kernel computes only each block's own, but reads K and
// V once a query block of 16 (the narrow tiles: once a 64-row tile), which bounds it by the L2's
// bandwidth and gives each item a fixed cost. So it wins where the narrow tiles would compute
// several times the active blocks and the rows hold enough blocks to pay for an item
// (docs/attention.md, "Blocks of 16: the gathered-key kernel").
#pragma once

#include <cstdint>
#include <optional>

#include "sparsejit/attention.h"

namespace sjit::attention {

// The gathered-key tiling a forward with this spec may run instead of the narrow or wide tiles, with
// `heads` query heads a CTA (GQA heads sharing the pattern, their blocks side by side): pattern
// blocks of 16 at head_dim 64, 96 or 128 with 1, 2 or 4 heads, blocks of 32 there with 2; nullopt
// elsewhere (blocks of 32 with one head, and d = 256, were measured slower on it at every density).
std::optional<AttentionConfig> gathered_config(const AttentionSpec& spec, int heads = 1);

// Whether `heads` query heads a CTA of the gathered kernel may share this pattern's reads in some call:
// a pattern of one head, and a gathered tiling for that many (one head always may, where the spec has
// a gathered tiling for it).
bool heads_may_share(const AttentionSpec& spec, const BlockPattern& pattern, int heads);

// The query heads a CTA of the gathered kernel can take in a call with this pattern and these heads:
// the most of 4 and 2 (at most 64 queries) that divide the query heads of a K/V head, where the
// pattern is shared by every head; else 1.
int gathered_heads(const AttentionSpec& spec, const BlockPattern& pattern, std::int64_t heads_q,
                   std::int64_t heads_kv);

// A pattern's rows as a gathered kernel walks them, `blocks_per_step` blocks a step: the steps (each
// row's last one padded) and the blocks a causal mask of the spec leaves (key <= query + offset), the
// rows being query blocks, or key blocks where `rows_are_keys` (the backward's transposed pattern).
struct GatheredWalk {
  std::int64_t steps = 0, seen = 0;
};
GatheredWalk gathered_walk(const AttentionSpec& spec, const BlockPattern& rows, int blocks_per_step, bool rows_are_keys);

// Whether a forward with `pattern` is expected to run faster on gathered_config(spec, heads) than on
// the narrow tiles `narrow` (64 x 16 or 64 x 32) and, with several heads, than on the wide tiles.
bool gathering_pays(const AttentionSpec& spec, const BlockPattern& pattern, const AttentionConfig& narrow,
                    int heads = 1);

}  // namespace sjit::attention

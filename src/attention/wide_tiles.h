// Pattern blocks of 16 and 32 on Hopper: which forward kernel a pattern runs on. The default, one
// warpgroup on 64-row tiles one key block wide, visits little more than the active blocks but pays
// 1.45-2.35 times as much a score as two warpgroups on 128-row tiles that span 8 or 4 key blocks,
// which visit every tile holding any active block. Sparse patterns run faster on the first, dense-ish
// ones on the second, so the choice is made per pattern from the tiles each would visit
// (docs/attention.md, "Small pattern blocks").
#pragma once

#include <optional>

#include "sparsejit/attention.h"

namespace sjit::attention {

// The wide tiling a forward with this spec may run instead of its default on Hopper: two math
// warpgroups on 128-row tiles, on wgmma_ws with 128-key tiles, or at head_dim 256 (which wgmma_ws does
// not take) on wgmma with 64-key tiles, the dense default there. nullopt where the spec has no such
// choice: dense and baked specs, pattern blocks of 64 or more, head_dim 32 (no wgmma kernel).
std::optional<AttentionConfig> wide_tile_config(const AttentionSpec& spec);

// What a score of an active tile costs on the narrow tiles (the spec's default on Hopper) over what it
// costs on the wide ones, as measured on the H100.
double narrow_cost_per_score(const AttentionSpec& spec);

// Whether a forward with `pattern` is expected to run faster on wide_tile_config(spec) than on
// `narrow` (the spec's default on Hopper): the tiles each visits, times what a score costs on each.
bool wide_tiles_pay(const AttentionSpec& spec, const BlockPattern& pattern, const AttentionConfig& narrow);

}  // namespace sjit::attention

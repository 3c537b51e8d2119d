// Pattern blocks of 16 and 32 on Hopper: whether the backward's dK/dV pass packs its query tiles from
// runs of one active block each (PackedQueries in templates/sparsejit/attention_backward.cuh) or walks
// contiguous tiles. Packing visits only the blocks a CTA's keys see, but a packed tile whose runs do
// not lie end to end moves a run at a time (a copy and a reduction per run instead of per tile), so it
// pays only where it visits clearly fewer tiles: random blocks of 32 below a density of about 0.45 and
// of 16 below about 0.27, not a sliding window or a dense-ish pattern, whose blocks fill the
// contiguous tiles already
// (docs/attention.md, "Small pattern blocks in the backward").
#pragma once

#include "sparsejit/pattern.h"

namespace sjit::attention {

// Whether a dK/dV pass of `key_rows` keys a CTA and `tile_cols` queries a tile should pack `pattern`'s
// query blocks (block_size < tile_cols) into its tiles: the tiles packed runs would fill, over the
// contiguous tiles holding an active block, below kPackedTilesAtMost.
bool packing_queries_pays(const BlockPattern& pattern, int key_rows, int tile_cols);

// Measured on the H100 (B2 H16 S8192 d = 128): random blocks of 16 at 0.25 (0.90 of the tiles) were
// 5-9% faster packed, blocks of 32 at 0.5 (0.94) and blocks of 16 at 0.5 (1.0) 0-2% and 5% slower,
// windows (1.0) 1-3% slower.
constexpr double kPackedTilesAtMost = 0.92;

}  // namespace sjit::attention

// The persistent forward's last round split across CTAs: how many CTAs it launches, and which of its
// items it shares out by key tiles (templates/sparsejit/last_round.cuh).
#pragma once

#include <cstddef>
#include <cstdint>

#include "sparsejit/attention.h"

namespace sjit::attention {

struct LastRoundSplit {
  std::int64_t grid = 0;  // CTAs to launch
  int tail_items = 0;     // the last items, shared out by key tiles; 0: every item whole
  int tail_ctas = 0;      // among CTAs 0 .. tail_ctas - 1
};

// Whole shares of CTAs an item of the last round is cut into at most (so at most this many pieces
// and one more): the piece that ends the item reads every other one back.
constexpr int kMaxLastRoundPieces = 8;

// What splitting costs, in key tiles of a CTA's time: a second item boundary in most CTAs, whole
// key tiles that leave some CTAs a tile more than the mean, and the merge (the other pieces' outputs,
// 33 KB a piece at d = 128, read back by the piece that ends the item). On the H200 at d = 128 the
// split gained 2.3% dense (31 idle tiles a CTA), 1.3% at density 0.25 (7.8), tied at 0.1 (2.9: 0.4%
// slower) and lost 4% at 0.05 (1.5) (docs/attention-log.md, "The last round's merge made cheaper").
constexpr int kLastRoundMergeTiles = 4;

// `work_items` items of at most `item_tiles` key tiles (all of that length where `same_length`) on a
// device of `multiprocessors` SMs, one CTA an SM, taking one item a round. The rounds leave the last
// one part full; `mode` says whether its items are split (the CTAs of the full rounds take
// `work_items - tail_items` items whole): whole never, split wherever the last round is part full,
// automatic only for items of the same length where the idle share of the last round outweighs the
// merge.
LastRoundSplit split_last_round(std::int64_t work_items, std::int64_t item_tiles, bool same_length,
                                int multiprocessors, LastRound mode);

// Bytes of the scratch a split's pieces write their outputs to: a slot a CTA, each a staged output
// tile (block_m rows of tile_dim 16-bit elements) and its rows' fp32 log-sum-exp (tail_slot in
// attention_forward_sm90_ws.cuh).
std::size_t last_round_scratch_bytes(std::int64_t grid, int block_m, int tile_dim);

}  // namespace sjit::attention

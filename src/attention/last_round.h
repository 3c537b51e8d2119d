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
// and one more): the piece that finishes last reads every other one back.
constexpr int kMaxLastRoundPieces = 8;

// What splitting costs, in key tiles of a CTA's time: the merge (every piece's partial output written
// and read back, 64 KB a piece at d = 128) and the pieces' extra item boundaries. On the H200 at
// d = 128 a split last round took 7-13 us more than its pieces alone (about 5-8 tiles at the dense
// kernel's 1.65 us a tile), nothing else running (docs/attention-log.md, "Landed: the last round split
// across CTAs").
constexpr int kLastRoundMergeTiles = 8;

// `work_items` items of at most `item_tiles` key tiles (all of that length where `same_length`) on a
// device of `multiprocessors` SMs, one CTA an SM, taking one item a round. The rounds leave the last
// one part full; `mode` says whether its items are split (the CTAs of the full rounds take
// `work_items - tail_items` items whole): whole never, split wherever the last round is part full,
// automatic only for items of the same length where the idle share of the last round outweighs the
// merge.
LastRoundSplit split_last_round(std::int64_t work_items, std::int64_t item_tiles, bool same_length,
                                int multiprocessors, LastRound mode);

// Bytes of the scratch a split's pieces write their partial outputs to: two pieces a CTA, each the
// unnormalized output, row maxima and partial row sums of every math warp's lanes.
std::size_t last_round_partial_bytes(std::int64_t grid, int warps, int head_dim);

}  // namespace sjit::attention

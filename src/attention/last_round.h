// The persistent forward's last round split across CTAs: how many CTAs it launches, and which of its
// items it shares out by key tiles (attention_forward_sm90_ws.cuh, LastRound).
#pragma once

#include <cstddef>
#include <cstdint>

namespace sjit::attention {

struct LastRoundSplit {
  std::int64_t grid = 0;  // CTAs to launch
  int tail_items = 0;     // the last items, shared out by key tiles; 0: every item whole
  int tail_ctas = 0;      // among CTAs 0 .. tail_ctas - 1
};

// Whole shares of CTAs an item of the last round is cut into at most (so at most this many pieces
// and one more): the piece that finishes last reads every other one back.
constexpr int kMaxLastRoundPieces = 8;

// `work_items` items of at most `item_tiles` key tiles on a device of `multiprocessors` SMs, one CTA
// an SM. Rounds of one item a CTA leave the last one part full; where it is at most three quarters
// full, its items are split (the CTAs of the full rounds take `work_items - tail_items` items whole),
// else every item is whole.
LastRoundSplit split_last_round(std::int64_t work_items, std::int64_t item_tiles, int multiprocessors);

// Bytes of the scratch a split's pieces write their partial outputs to: two pieces a CTA, each the
// unnormalized output, row maxima and partial row sums of every math warp's lanes.
std::size_t last_round_partial_bytes(std::int64_t grid, int warps, int head_dim);

}  // namespace sjit::attention

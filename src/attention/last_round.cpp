#include "attention/last_round.h"

#include <algorithm>

namespace sjit::attention {

LastRoundSplit split_last_round(std::int64_t work_items, std::int64_t item_tiles, bool same_length,
                                int multiprocessors, LastRound mode) {
  const std::int64_t ctas = multiprocessors;
  const LastRoundSplit whole{std::min(work_items, ctas), 0, 0};
  if (mode == LastRound::whole || (mode == LastRound::automatic && !same_length)) return whole;
  if (work_items <= 0 || item_tiles <= 0 || ctas <= 1) return whole;
  const std::int64_t tail = work_items % ctas;
  if (tail == 0) return whole;
  // The CTAs idle in the last round (ctas - tail) would each take a share of an item's tiles.
  if (mode == LastRound::automatic && (ctas - tail) * item_tiles < ctas * kLastRoundMergeTiles) return whole;
  const std::int64_t tail_ctas = std::min(ctas, tail * kMaxLastRoundPieces);
  // The kernel cuts an item's tiles in proportion with 32-bit products of tiles and CTAs.
  if (item_tiles * tail_ctas >= (std::int64_t(1) << 31)) return whole;
  return {work_items >= ctas ? ctas : tail_ctas, int(tail), int(tail_ctas)};
}

std::size_t last_round_scratch_bytes(std::int64_t grid, int block_m, int tile_dim) {
  return std::size_t(grid) * std::size_t(block_m) * (std::size_t(tile_dim) * 2 + sizeof(float));
}

}  // namespace sjit::attention

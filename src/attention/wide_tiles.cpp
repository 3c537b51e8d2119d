#include "attention/wide_tiles.h"

#include "attention/tile_schedule.h"

namespace sjit::attention {

// What a score of an active tile costs on the Hopper default (one warpgroup, 64-row tiles one key
// block wide) over what it costs on the wide tiles: the time over the scores of the tiles visited,
// measured on the H100 with random patterns near the densities where the two cross (thirty-first
// session, docs/attention-log.md, "Small pattern blocks on wgmma"). It rises as the density falls
// (the narrow kernel's fixed costs an item), by 10-20% from 0.5 to 0.1, where the narrow tiles win by
// far; causal masks and short problems that fill few SMs raise it too, so there the wide tiles would
// be chosen a little earlier than they are.
double narrow_cost_per_score(const AttentionSpec& spec) {
  const bool blocks_of_16 = spec.block_size == 16;
  switch (spec.head_dim) {
    case 64: return blocks_of_16 ? 2.07 : 1.45;
    case 96: return blocks_of_16 ? 2.3 : 1.6;
    case 256: return blocks_of_16 ? 2.35 : 1.5;  // against wgmma's 128 x 64 tiles
    default: return blocks_of_16 ? 2.15 : 1.65;  // d = 128
  }
}

std::optional<AttentionConfig> wide_tile_config(const AttentionSpec& spec) {
  const bool small_blocks = spec.sparsity == Sparsity::block_sparse && spec.block_size <= 32;
  const bool has_wgmma = spec.head_dim == 64 || spec.head_dim == 96 || spec.head_dim == 128 || spec.head_dim == 256;
  if (!small_blocks || !has_wgmma) return std::nullopt;
  const bool persistent = spec.head_dim != 256;
  AttentionConfig c;
  c.path = persistent ? AttentionPath::wgmma_ws : AttentionPath::wgmma;
  c.warps = 8;
  c.m_tiles = 1;
  c.block_n = persistent ? 128 : 64;
  c.stages = 2;
  c.q_in_registers = 0;
  return c;
}

bool wide_tiles_pay(const AttentionSpec& spec, const BlockPattern& pattern, const AttentionConfig& narrow) {
  const std::optional<AttentionConfig> wide = wide_tile_config(spec);
  if (!wide) return false;
  const double narrow_scores =
      double(count_active_tiles(pattern, narrow.block_m(), narrow.block_n)) * narrow.block_m() * narrow.block_n;
  const double wide_scores =
      double(count_active_tiles(pattern, wide->block_m(), wide->block_n)) * wide->block_m() * wide->block_n;
  return narrow_cost_per_score(spec) * narrow_scores > wide_scores;
}

}  // namespace sjit::attention

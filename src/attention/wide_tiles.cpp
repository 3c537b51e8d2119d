#include "attention/wide_tiles.h"

#include "attention/tile_schedule.h"

namespace sjit::attention {
namespace {

// What a score of an active tile costs on the mma.sync default (64-row tiles of 16 or 32 keys) over
// what it costs on the wide tiles: the time over the scores of the tiles visited, measured on the
// H100 with random patterns at densities 0.05 to 0.5 (thirty-first session, docs/attention-log.md,
// "Small pattern blocks: the kernel chosen per pattern"). It varies by about 10% with the density; a
// causal mask raises it (d = 128, blocks of 32: 2.85), and so does a short problem that fills few SMs
// (about 3): both would have the wide tiles chosen a little earlier than they are.
double narrow_cost_per_score(const AttentionSpec& spec) {
  const bool blocks_of_16 = spec.block_size == 16;
  switch (spec.head_dim) {
    case 64: return blocks_of_16 ? 2.15 : 1.75;
    case 96: return blocks_of_16 ? 2.35 : 2.1;
    case 256: return blocks_of_16 ? 2.45 : 2.05;  // against wgmma's 128 x 64 tiles
    default: return blocks_of_16 ? 2.5 : 2.4;     // d = 128
  }
}

}  // namespace

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

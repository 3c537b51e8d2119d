#include "attention/gathered_keys.h"

#include "attention/tile_schedule.h"

namespace sjit::attention {
namespace {

// The measured crossover (H100, random patterns, blocks of 16; thirty-third session, docs/attention-log.md,
// "Landed: the gathered-key forward for pattern blocks of 16"): the gathered kernel took 0.63-0.77 of
// the narrow tiles' time at density 0.1, where the narrow tiles compute 3.4 times the active scores
// (d = 64, 96, 128, causal or not), 0.92-1.06 at 0.02 (3.9 times, but 5-10 blocks a row: an item's
// fixed cost), and lost at 0.25 (2.7 times) to the wide tiles, which that density runs on anyway.
constexpr double kMinScoreRatio = 2.5;  // narrow tiles' scores over the gathered steps' scores
constexpr double kMinBlocksPerRow = 8;  // active blocks of a pattern row, on average

}  // namespace

std::optional<AttentionConfig> gathered_config(const AttentionSpec& spec) {
  const bool blocks_of_16 = spec.sparsity == Sparsity::block_sparse && spec.block_size == 16;
  if (!blocks_of_16 || (spec.head_dim != 64 && spec.head_dim != 96 && spec.head_dim != 128)) return std::nullopt;
  AttentionConfig c;
  c.path = AttentionPath::wgmma_gather;
  c.warps = 4;
  c.m_tiles = 1;
  c.block_n = spec.block_size;
  c.stages = 2;
  c.q_in_registers = 0;
  return c;
}

bool gathering_pays(const AttentionSpec& spec, const BlockPattern& pattern, const AttentionConfig& narrow) {
  if (!gathered_config(spec) || pattern.nnz() == 0) return false;
  // The gathered kernel's steps: 64 keys, the row's blocks four at a time (the last one padded); and the
  // blocks a causal mask leaves (the kernel drops those past the edge before any load).
  constexpr int blocks_per_step = 64 / 16;
  const std::int64_t offset = spec.causal == Causal::bottom_right ? pattern.block_cols() - pattern.block_rows() : 0;
  std::int64_t steps = 0, seen = 0;
  for (int head = 0; head < pattern.heads(); ++head)
    for (std::int64_t r = 0; r < pattern.block_rows(); ++r) {
      const auto row = pattern.row(head, r);
      steps += (std::int64_t(row.size()) + blocks_per_step - 1) / blocks_per_step;
      for (const std::int32_t c : row) seen += spec.causal == Causal::none || c <= r + offset;
    }
  const double gathered_scores = double(steps) * 64 * pattern.block_size();
  const double narrow_scores =
      double(count_active_tiles(pattern, narrow.block_m(), narrow.block_n)) * narrow.block_m() * narrow.block_n;
  const double rows = double(pattern.heads()) * double(pattern.block_rows());
  return narrow_scores >= kMinScoreRatio * gathered_scores && double(seen) >= kMinBlocksPerRow * rows;
}

}  // namespace sjit::attention

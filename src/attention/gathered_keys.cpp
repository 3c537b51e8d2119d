#include "attention/gathered_keys.h"

#include "attention/tile_schedule.h"
#include "attention/wide_tiles.h"

namespace sjit::attention {
namespace {

// The measured crossover (H100, random patterns, blocks of 16; thirty-third session, docs/attention-log.md,
// "Landed: the gathered-key forward for pattern blocks of 16"): the gathered kernel took 0.63-0.77 of
// the narrow tiles' time at density 0.1, where the narrow tiles compute 3.4 times the active scores
// (d = 64, 96, 128, causal or not), 0.92-1.06 at 0.02 (3.9 times, but 5-10 blocks a row: an item's
// fixed cost), and lost at 0.25 (2.7 times) to the wide tiles, which that density runs on anyway.
constexpr double kMinScoreRatio = 2.5;  // narrow tiles' scores over the gathered steps' scores, one head
constexpr double kMinBlocksPerRow = 8;  // active blocks of a pattern row, on average

// With several heads a CTA, what a gathered step's score costs over a score of the wide tiles: the
// time over the steps' scores at B2 H16 S8192 d = 128, densities 0.1-0.25 (same record, "Landed:
// several query heads a CTA"): blocks of 16 with 4 heads 2.7-3.0, with 2 heads 4.5; blocks of 32 with
// 2 heads 2.3-2.7 (one head: 5.6 and 3.6, reads for a single head).
double gathered_cost_per_score(int block, int heads) {
  if (block == 16) return heads == 4 ? 3.0 : 4.5;
  return 2.7;
}

}  // namespace

std::optional<AttentionConfig> gathered_config(const AttentionSpec& spec, int heads) {
  const bool small_blocks = spec.sparsity == Sparsity::block_sparse && (spec.block_size == 16 || spec.block_size == 32);
  if (!small_blocks || (spec.head_dim != 64 && spec.head_dim != 96 && spec.head_dim != 128)) return std::nullopt;
  const bool takes = spec.block_size == 16 ? heads == 1 || heads == 2 || heads == 4 : heads == 2;
  if (!takes) return std::nullopt;
  AttentionConfig c;
  c.path = AttentionPath::wgmma_gather;
  c.warps = 4;
  c.m_tiles = heads;
  c.block_n = spec.block_size;
  c.stages = 2;
  c.q_in_registers = 0;
  return c;
}

bool heads_may_share(const AttentionSpec& spec, const BlockPattern& pattern, int heads) {
  return (heads == 1 || pattern.heads() == 1) && gathered_config(spec, heads).has_value();
}

int gathered_heads(const AttentionSpec& spec, const BlockPattern& pattern, std::int64_t heads_q,
                   std::int64_t heads_kv) {
  if (heads_kv <= 0) return 1;
  const std::int64_t group = heads_q / heads_kv;
  for (const int heads : {4, 2})
    if (group % heads == 0 && heads_may_share(spec, pattern, heads)) return heads;
  return 1;
}

GatheredWalk gathered_walk(const AttentionSpec& spec, const BlockPattern& rows, int blocks_per_step, bool rows_are_keys) {
  // Causal bottom-right: key blocks may reach (key block rows - query block rows) past the query's.
  const std::int64_t key_blocks = rows_are_keys ? rows.block_rows() : rows.block_cols();
  const std::int64_t query_blocks = rows_are_keys ? rows.block_cols() : rows.block_rows();
  const std::int64_t offset = spec.causal == Causal::bottom_right ? key_blocks - query_blocks : 0;
  GatheredWalk walk;
  for (int head = 0; head < rows.heads(); ++head)
    for (std::int64_t r = 0; r < rows.block_rows(); ++r) {
      const auto row = rows.row(head, r);
      walk.steps += (std::int64_t(row.size()) + blocks_per_step - 1) / blocks_per_step;
      for (const std::int32_t c : row) {
        const std::int64_t key = rows_are_keys ? r : c, query = rows_are_keys ? c : r;
        walk.seen += spec.causal == Causal::none || key <= query + offset;
      }
    }
  return walk;
}

bool gathering_pays(const AttentionSpec& spec, const BlockPattern& pattern, const AttentionConfig& narrow, int heads) {
  if (!gathered_config(spec, heads) || pattern.nnz() == 0) return false;
  // The gathered kernel's steps: 64 keys, a row's blocks 64 / block at a time (the last step padded);
  // and the blocks a causal mask leaves (the kernel drops those past the edge before any load).
  const GatheredWalk walk = gathered_walk(spec, pattern, 64 / pattern.block_size(), false);
  const double rows = double(pattern.heads()) * double(pattern.block_rows());
  if (double(walk.seen) < kMinBlocksPerRow * rows) return false;
  const double gathered_scores = double(walk.steps) * 64 * pattern.block_size();
  const double narrow_scores =
      double(count_active_tiles(pattern, narrow.block_m(), narrow.block_n)) * narrow.block_m() * narrow.block_n;
  if (heads == 1) return narrow_scores >= kMinScoreRatio * gathered_scores;
  // Several heads: against both other tilings, by what their scores cost.
  const double gathered_cost = gathered_cost_per_score(pattern.block_size(), heads) * gathered_scores;
  double wide_cost = narrow_cost_per_score(spec) * narrow_scores;
  if (const std::optional<AttentionConfig> wide = wide_tile_config(spec))
    wide_cost = std::min(wide_cost, double(count_active_tiles(pattern, wide->block_m(), wide->block_n)) *
                                        wide->block_m() * wide->block_n);
  return gathered_cost < wide_cost;
}

}  // namespace sjit::attention

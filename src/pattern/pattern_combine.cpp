// Patterns made from other patterns, from a function of blocks or from scores of blocks: united,
// intersected, from_predicate, from_scores.
// Rules are stated in pattern.h.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <span>
#include <vector>

#include "pattern/pattern_internal.h"
#include "sparsejit/error.h"
#include "sparsejit/pattern.h"

namespace sjit {

using namespace pattern_detail;

namespace {

// The heads of a combination of a and b: equal counts, or one pattern shared by every head of the other.
int combined_heads(std::string_view context, const BlockPattern& a, const BlockPattern& b) {
  auto shape = [](const BlockPattern& p) {
    return fmt::format("block_size {}, {} x {} blocks, {} heads", p.block_size(), p.block_rows(), p.block_cols(),
                       p.heads());
  };
  if (a.block_size() == 0 || b.block_size() == 0)
    throw InvalidArgument(fmt::format("{}: {} pattern is empty (default-constructed): build it first", context,
                                      a.block_size() == 0 ? "the first" : "the second"));
  if (a.block_size() != b.block_size() || a.block_rows() != b.block_rows() || a.block_cols() != b.block_cols() ||
      (a.heads() != b.heads() && a.heads() != 1 && b.heads() != 1))
    throw InvalidArgument(fmt::format(
        "{}: the patterns differ ({} against {}): they need the same block size, block rows and block "
        "columns, and the same heads or one of them a single head",
        context, shape(a), shape(b)));
  return std::max(a.heads(), b.heads());
}

// a and b row by row (a one-head pattern's row 0 .. block_rows - 1 for every head), each result row
// written by `merge` (std::set_union or std::set_intersection over the two sorted rows).
template <class Merge>
BlockPattern combined(std::string_view context, const BlockPattern& a, const BlockPattern& b, Merge merge) {
  const int heads = combined_heads(context, a, b);
  BsrAssembler bsr(context);
  std::vector<std::int32_t> row;
  for (int head = 0; head < heads; ++head)
    for (std::int64_t r = 0; r < a.block_rows(); ++r) {
      const std::span<const std::int32_t> x = a.row(a.heads() == 1 ? 0 : head, r);
      const std::span<const std::int32_t> y = b.row(b.heads() == 1 ? 0 : head, r);
      row.clear();
      merge(x.begin(), x.end(), y.begin(), y.end(), std::back_inserter(row));
      for (const std::int32_t c : row) bsr.add(c);
      bsr.end_row();
    }
  return bsr.finish(a.block_size(), a.block_rows(), a.block_cols(), heads);
}

}  // namespace

namespace patterns {

BlockPattern from_predicate(int block_size, std::int64_t seq_q, std::int64_t seq_k,
                            const std::function<bool(int head, std::int64_t q_block, std::int64_t k_block)>& active,
                            int heads) {
  constexpr std::string_view context = "patterns::from_predicate";
  const BlockShape shape = checked_shape(context, block_size, seq_q, seq_k, heads);
  if (!active) throw InvalidArgument(fmt::format("{}: the predicate is empty (a null std::function)", context));
  BsrAssembler bsr(context);
  std::int64_t total = 0;
  for (int head = 0; head < heads; ++head)
    for (std::int64_t r = 0; r < shape.block_rows; ++r) {
      for (std::int64_t c = 0; c < shape.block_cols; ++c)
        if (active(head, r, c)) {
          check_total_blocks(context, ++total);  // (before the memory is taken)
          bsr.add(c);
        }
      bsr.end_row();
    }
  return bsr.finish(block_size, shape.block_rows, shape.block_cols, heads);
}

BlockPattern from_scores(int block_size, std::int64_t seq_q, std::int64_t seq_k, std::span<const float> scores,
                         const BlockSelection& keep, int heads) {
  constexpr std::string_view context = "patterns::from_scores";
  const BlockShape shape = checked_shape(context, block_size, seq_q, seq_k, heads);
  if (keep.top_k < 0) throw InvalidArgument(fmt::format("{}: top_k = {} must be 0 (no cap) or more", context, keep.top_k));
  if (!(keep.mass > 0 && keep.mass <= 1))
    throw InvalidArgument(fmt::format("{}: mass = {} must be in (0, 1]", context, keep.mass));
  if (keep.top_k == 0 && keep.mass == 1)
    throw InvalidArgument(fmt::format("{}: top_k = 0 and mass = 1 keep every tile: give a top_k, or a mass below 1",
                                      context));
  const std::int64_t cols = shape.block_cols, per_head = shape.block_rows * cols;
  if (std::int64_t(scores.size()) != heads * per_head)
    throw InvalidArgument(fmt::format("{}: {} scores for {} head(s) of {} x {} blocks: give {} ([heads][block_rows][block_cols])",
                                      context, scores.size(), heads, shape.block_rows, cols, heads * per_head));
  const bool by_mass = keep.mass < 1;
  for (std::size_t i = 0; i < scores.size(); ++i)
    if (!std::isfinite(scores[i]) || (by_mass && scores[i] < 0))
      throw InvalidArgument(fmt::format("{}: the score of head {}, block row {}, block column {} is {}: scores must be "
                                        "finite{}",
                                        context, std::int64_t(i) / per_head, std::int64_t(i) % per_head / cols,
                                        std::int64_t(i) % cols, scores[i],
                                        by_mass ? ", and at least 0 with a mass below 1 (a share of the row's total)" : ""));
  BsrAssembler bsr(context);
  std::vector<std::int64_t> order(static_cast<std::size_t>(cols)), taken;
  for (int head = 0; head < heads; ++head)
    for (std::int64_t r = 0; r < shape.block_rows; ++r) {
      const float* row = scores.data() + head * per_head + r * cols;
      // The tiles best first (ties: the smaller column), the diagonal ahead of them where asked.
      for (std::int64_t c = 0; c < cols; ++c) order[std::size_t(c)] = c;
      const bool diagonal_first = keep.diagonal && r < cols;
      std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
        if (diagonal_first && (a == r || b == r)) return a == r && b != r;
        return row[a] > row[b];
      });
      double total = 0;
      if (by_mass)
        for (std::int64_t c = 0; c < cols; ++c) total += row[c];
      taken.clear();
      double sum = 0;
      for (const std::int64_t c : order) {
        if (keep.top_k > 0 && std::int64_t(taken.size()) >= keep.top_k) break;
        const bool forced = diagonal_first && c == r;
        if (by_mass && !forced && (sum >= keep.mass * total || row[c] <= 0)) break;
        taken.push_back(c);
        sum += row[c];
      }
      std::sort(taken.begin(), taken.end());
      for (const std::int64_t c : taken) bsr.add(c);
      bsr.end_row();  // (which checks the running count)
    }
  return bsr.finish(block_size, shape.block_rows, shape.block_cols, heads);
}

BlockPattern united(const BlockPattern& a, const BlockPattern& b) {
  return combined("patterns::united", a, b, [](auto... args) { return std::set_union(args...); });
}

BlockPattern intersected(const BlockPattern& a, const BlockPattern& b) {
  return combined("patterns::intersected", a, b, [](auto... args) { return std::set_intersection(args...); });
}

}  // namespace patterns
}  // namespace sjit

// Patterns made from other patterns or from a function of blocks: from_predicate, united, intersected.
// Rules are stated in pattern.h.
#include <fmt/format.h>

#include <algorithm>
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
  std::vector<std::int32_t> row_ptr = {0}, col_idx;
  row_ptr.reserve(std::size_t(heads * a.block_rows()) + 1);
  for (int head = 0; head < heads; ++head)
    for (std::int64_t r = 0; r < a.block_rows(); ++r) {
      const std::span<const std::int32_t> x = a.row(a.heads() == 1 ? 0 : head, r);
      const std::span<const std::int32_t> y = b.row(b.heads() == 1 ? 0 : head, r);
      merge(x.begin(), x.end(), y.begin(), y.end(), std::back_inserter(col_idx));
      check_total_blocks(context, std::int64_t(col_idx.size()));  // (a row at most past the limit)
      row_ptr.push_back(static_cast<std::int32_t>(col_idx.size()));
    }
  return BlockPattern(a.block_size(), a.block_rows(), a.block_cols(), heads, std::move(row_ptr), std::move(col_idx));
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

BlockPattern united(const BlockPattern& a, const BlockPattern& b) {
  return combined("patterns::united", a, b, [](auto... args) { return std::set_union(args...); });
}

BlockPattern intersected(const BlockPattern& a, const BlockPattern& b) {
  return combined("patterns::intersected", a, b, [](auto... args) { return std::set_intersection(args...); });
}

}  // namespace patterns
}  // namespace sjit

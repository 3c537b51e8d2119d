// The deterministic pattern builders (dense, causal, sliding window, from a graph) and the row-by-row
// assembler they share with the random ones (pattern_random.cpp). Rules are stated in pattern.h.
#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "pattern/pattern_internal.h"
#include "sparsejit/error.h"
#include "sparsejit/pattern.h"

namespace sjit {

using namespace pattern_detail;

namespace pattern_detail {

void BsrAssembler::add_range(std::int64_t first, std::int64_t last) {
  if (first > last) return;
  // Checked before appending, so that an impossible pattern fails before it takes the memory.
  check_total_blocks(context_, static_cast<std::int64_t>(col_idx_.size()) + (last - first + 1));
  for (std::int64_t col = first; col <= last; ++col) col_idx_.push_back(static_cast<std::int32_t>(col));
}

void BsrAssembler::end_row() {
  check_total_blocks(context_, static_cast<std::int64_t>(col_idx_.size()));
  row_ptr_.push_back(static_cast<std::int32_t>(col_idx_.size()));
}

void BsrAssembler::repeat_for_heads(int heads) {
  const std::int64_t rows = static_cast<std::int64_t>(row_ptr_.size()) - 1;
  const std::int64_t nnz = static_cast<std::int64_t>(col_idx_.size());
  check_total_blocks(context_, nnz * heads);
  row_ptr_.reserve(rows * heads + 1);
  col_idx_.reserve(nnz * heads);
  for (int head = 1; head < heads; ++head) {
    for (std::int64_t row = 0; row < rows; ++row)
      row_ptr_.push_back(static_cast<std::int32_t>(row_ptr_[row + 1] + head * nnz));
    col_idx_.insert(col_idx_.end(), col_idx_.begin(), col_idx_.begin() + nnz);
  }
}

BlockPattern BsrAssembler::finish(int block_size, std::int64_t block_rows, std::int64_t block_cols, int heads) {
  return BlockPattern(block_size, block_rows, block_cols, heads, std::move(row_ptr_), std::move(col_idx_));
}

}  // namespace pattern_detail

namespace {

// The builders whose rows are one interval of key blocks: row_range(r) gives {first, last}, empty when
// first > last. The total is counted first, so that a pattern too large for int32 indices is refused
// before any memory is taken.
template <class RowRange>
BlockPattern from_row_ranges(std::string_view context, int block_size, const BlockShape& shape, int heads,
                             RowRange row_range) {
  std::int64_t per_head = 0;
  for (std::int64_t r = 0; r < shape.block_rows; ++r) {
    const auto [first, last] = row_range(r);
    per_head += std::max<std::int64_t>(0, last - first + 1);
  }
  check_total_blocks(context, per_head);  // then heads * per_head < 2^62: no overflow
  check_total_blocks(context, per_head * heads);
  BsrAssembler bsr(context);
  for (std::int64_t r = 0; r < shape.block_rows; ++r) {
    const auto [first, last] = row_range(r);
    bsr.add_range(first, last);
    bsr.end_row();
  }
  bsr.repeat_for_heads(heads);
  return bsr.finish(block_size, shape.block_rows, shape.block_cols, heads);
}

using Range = std::pair<std::int64_t, std::int64_t>;

}  // namespace

namespace patterns {

BlockPattern dense(int block_size, std::int64_t seq_q, std::int64_t seq_k, int heads) {
  constexpr std::string_view context = "patterns::dense";
  const BlockShape shape = checked_shape(context, block_size, seq_q, seq_k, heads);
  return from_row_ranges(context, block_size, shape, heads, [&](std::int64_t) {
    return Range{0, shape.block_cols - 1};
  });
}

BlockPattern causal(int block_size, std::int64_t seq_q, std::int64_t seq_k, CausalAlign align, int heads) {
  constexpr std::string_view context = "patterns::causal";
  const BlockShape shape = checked_shape(context, block_size, seq_q, seq_k, heads);
  // Query i sees key j iff j <= i + offset. The tile (r, c) has some visible pair iff its smallest key
  // c*bs is visible from its largest query, min((r+1)*bs, seq_q) - 1.
  const std::int64_t offset = align == CausalAlign::bottom_right ? seq_k - seq_q : 0;
  return from_row_ranges(context, block_size, shape, heads, [&](std::int64_t r) {
    const std::int64_t last_query = std::min((r + 1) * block_size, seq_q) - 1;
    const std::int64_t last_key = last_query + offset;
    return last_key < 0 ? Range{0, -1} : Range{0, std::min(shape.block_cols - 1, last_key / block_size)};
  });
}

BlockPattern sliding_window(int block_size, std::int64_t seq_q, std::int64_t seq_k, std::int64_t blocks_before,
                            std::int64_t blocks_after, int heads) {
  constexpr std::string_view context = "patterns::sliding_window";
  const BlockShape shape = checked_shape(context, block_size, seq_q, seq_k, heads);
  check_not_negative(context, "blocks_before", blocks_before);
  check_not_negative(context, "blocks_after", blocks_after);
  return from_row_ranges(context, block_size, shape, heads, [&](std::int64_t r) {
    const std::int64_t last_col = shape.block_cols - 1;
    const std::int64_t first = std::max<std::int64_t>(0, r - blocks_before);
    const std::int64_t last = blocks_after >= last_col - r ? last_col : r + blocks_after;  // no overflow
    return Range{first, last};
  });
}

BlockPattern from_graph(int block_size, std::int64_t seq_q, std::int64_t seq_k,
                        std::span<const std::pair<std::int64_t, std::int64_t>> edges, int top_k, int heads) {
  constexpr std::string_view context = "patterns::from_graph";
  const BlockShape shape = checked_shape(context, block_size, seq_q, seq_k, heads);
  if (top_k < 1) throw InvalidArgument(fmt::format("{}: top_k = {} must be at least 1", context, top_k));

  // Each edge as its block pair r * block_cols + c; sorted, equal pairs form runs whose length is the count.
  std::vector<std::int64_t> pairs;
  pairs.reserve(edges.size());
  for (std::size_t e = 0; e < edges.size(); ++e) {
    const auto [query, key] = edges[e];
    if (query < 0 || query >= seq_q || key < 0 || key >= seq_k)
      throw InvalidArgument(fmt::format(
          "{}: edges[{}] = ({}, {}) is out of range: queries must be in [0, {}) (seq_q) and keys in [0, {}) (seq_k)",
          context, e, query, key, seq_q, seq_k));
    pairs.push_back(query / block_size * shape.block_cols + key / block_size);
  }
  std::sort(pairs.begin(), pairs.end());

  struct Candidate {
    std::int64_t count, col;
  };
  std::vector<Candidate> row_candidates;
  BsrAssembler bsr(context);
  std::size_t next = 0;
  for (std::int64_t r = 0; r < shape.block_rows; ++r) {
    row_candidates.clear();
    while (next < pairs.size() && pairs[next] / shape.block_cols == r) {
      const std::size_t run_end = std::upper_bound(pairs.begin() + next, pairs.end(), pairs[next]) - pairs.begin();
      row_candidates.push_back({static_cast<std::int64_t>(run_end - next), pairs[next] % shape.block_cols});
      next = run_end;
    }
    // Highest counts first, ties to the smaller column; the kept ones back in column order.
    const std::size_t keep = std::min(row_candidates.size(), static_cast<std::size_t>(top_k));
    std::partial_sort(row_candidates.begin(), row_candidates.begin() + keep, row_candidates.end(),
                      [](const Candidate& a, const Candidate& b) {
                        return a.count != b.count ? a.count > b.count : a.col < b.col;
                      });
    std::sort(row_candidates.begin(), row_candidates.begin() + keep,
              [](const Candidate& a, const Candidate& b) { return a.col < b.col; });
    for (std::size_t k = 0; k < keep; ++k) bsr.add(row_candidates[k].col);
    bsr.end_row();
  }
  bsr.repeat_for_heads(heads);
  return bsr.finish(block_size, shape.block_rows, shape.block_cols, heads);
}

}  // namespace patterns
}  // namespace sjit

// BlockPattern: the checking constructor, row access, dense masks, statistics and the transpose.
#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "pattern/pattern_internal.h"
#include "sparsejit/error.h"
#include "sparsejit/pattern.h"

namespace sjit {

using namespace pattern_detail;

namespace {

// Checks a BSR against the rules stated in pattern.h, throwing for the first entry that breaks one.
void check_bsr(std::string_view context, int block_size, std::int64_t block_rows, std::int64_t block_cols, int heads,
               const std::vector<std::int32_t>& row_ptr, const std::vector<std::int32_t>& col_idx) {
  check_block_size(context, block_size);
  check_block_count(context, "block_rows", block_rows);
  check_block_count(context, "block_cols", block_cols);
  check_heads(context, heads);

  const std::int64_t rows = heads * block_rows;  // < 2^62
  if (static_cast<std::int64_t>(row_ptr.size()) != rows + 1)
    throw InvalidArgument(fmt::format(
        "{}: row_ptr has {} entries but must have heads * block_rows + 1 = {} (heads = {}, block_rows = {})", context,
        row_ptr.size(), rows + 1, heads, block_rows));
  if (row_ptr[0] != 0) throw InvalidArgument(fmt::format("{}: row_ptr[0] = {} must be 0", context, row_ptr[0]));
  for (std::int64_t row = 0; row < rows; ++row) {
    if (row_ptr[row + 1] < row_ptr[row])
      throw InvalidArgument(fmt::format(
          "{}: row_ptr[{}] = {} is less than row_ptr[{}] = {}: row_ptr must be non-decreasing (block row {} of "
          "head {} would have a negative length)",
          context, row + 1, row_ptr[row + 1], row, row_ptr[row], row % block_rows, row / block_rows));
  }
  if (static_cast<std::size_t>(row_ptr.back()) != col_idx.size())
    throw InvalidArgument(fmt::format(
        "{}: row_ptr[{}] = {} (the last entry) must equal the number of columns, col_idx.size() = {}", context, rows,
        row_ptr.back(), col_idx.size()));

  for (std::int64_t row = 0; row < rows; ++row) {
    for (std::int64_t k = row_ptr[row]; k < row_ptr[row + 1]; ++k) {
      const std::int32_t col = col_idx[k];
      if (col < 0 || col >= block_cols)
        throw InvalidArgument(fmt::format(
            "{}: col_idx[{}] = {} in block row {} (head {}) is out of range: columns must be in [0, {}) "
            "(block_cols)",
            context, k, col, row % block_rows, row / block_rows, block_cols));
      if (k > row_ptr[row] && col <= col_idx[k - 1])
        throw InvalidArgument(fmt::format(
            "{}: col_idx[{}] = {} in block row {} (head {}) is not greater than the previous column {}: columns "
            "of a row must be sorted and distinct",
            context, k, col, row % block_rows, row / block_rows, col_idx[k - 1]));
    }
  }
}

}  // namespace

BlockPattern::BlockPattern(int block_size, std::int64_t block_rows, std::int64_t block_cols, int heads,
                           std::vector<std::int32_t> row_ptr, std::vector<std::int32_t> col_idx)
    : BlockPattern("pattern", block_size, block_rows, block_cols, heads, std::move(row_ptr), std::move(col_idx)) {}

BlockPattern::BlockPattern(std::string_view context, int block_size, std::int64_t block_rows,
                           std::int64_t block_cols, int heads, std::vector<std::int32_t> row_ptr,
                           std::vector<std::int32_t> col_idx)
    : digest_(0) {
  check_bsr(context, block_size, block_rows, block_cols, heads, row_ptr, col_idx);
  digest_ = digest_of(block_size, block_rows, block_cols, heads, row_ptr, col_idx);
  block_size_ = block_size;
  block_rows_ = block_rows;
  block_cols_ = block_cols;
  heads_ = heads;
  row_ptr_ = std::move(row_ptr);
  col_idx_ = std::move(col_idx);
}

std::uint64_t BlockPattern::empty_digest() {
  static const std::uint64_t digest = digest_of(0, 0, 0, 0, {}, {});
  return digest;
}

bool BlockPattern::is_supported_block_size(int block_size) {
  return block_size == 16 || block_size == 32 || block_size == 64 || block_size == 128;
}

std::int64_t BlockPattern::row_index(int head, std::int64_t block_row) const {
  if (head < 0 || head >= heads_)
    throw InvalidArgument(fmt::format("pattern: head = {} is out of range: the pattern has heads 0 .. {}{}", head,
                                      heads_ - 1, heads_ == 1 ? " (one pattern shared by every head: use 0)" : ""));
  if (block_row < 0 || block_row >= block_rows_)
    throw InvalidArgument(
        fmt::format("pattern: block_row = {} is out of range: allowed 0 .. {}", block_row, block_rows_ - 1));
  return head * block_rows_ + block_row;
}

std::span<const std::int32_t> BlockPattern::row(int head, std::int64_t block_row) const {
  const std::int64_t r = row_index(head, block_row);
  return std::span<const std::int32_t>(col_idx_).subspan(row_ptr_[r], row_ptr_[r + 1] - row_ptr_[r]);
}

bool BlockPattern::active(int head, std::int64_t block_row, std::int64_t block_col) const {
  const std::span<const std::int32_t> cols = row(head, block_row);
  if (block_col < 0 || block_col >= block_cols_)
    throw InvalidArgument(
        fmt::format("pattern: block_col = {} is out of range: allowed 0 .. {}", block_col, block_cols_ - 1));
  return std::binary_search(cols.begin(), cols.end(), static_cast<std::int32_t>(block_col));
}

BlockPattern BlockPattern::from_block_mask(int block_size, int heads, std::int64_t block_rows,
                                           std::int64_t block_cols, std::span<const std::uint8_t> mask) {
  constexpr std::string_view context = "pattern::from_block_mask";
  check_block_size(context, block_size);
  check_heads(context, heads);
  check_block_count(context, "block_rows", block_rows);
  check_block_count(context, "block_cols", block_cols);
  // heads * block_rows < 2^62; a mask that large cannot exist, so only compare when the product fits.
  const std::int64_t rows = heads * block_rows;
  const bool fits = rows <= std::numeric_limits<std::int64_t>::max() / block_cols;
  if (!fits || static_cast<std::int64_t>(mask.size()) != rows * block_cols)
    throw InvalidArgument(fmt::format(
        "{}: mask has {} entries but heads * block_rows * block_cols = {} * {} * {} are needed", context,
        mask.size(), heads, block_rows, block_cols));

  const std::int64_t active_blocks = std::count_if(mask.begin(), mask.end(), [](std::uint8_t m) { return m != 0; });
  check_total_blocks(context, active_blocks);
  std::vector<std::int32_t> row_ptr(rows + 1, 0), col_idx;
  col_idx.reserve(active_blocks);
  for (std::int64_t row = 0; row < rows; ++row) {
    for (std::int64_t col = 0; col < block_cols; ++col)
      if (mask[row * block_cols + col] != 0) col_idx.push_back(static_cast<std::int32_t>(col));
    row_ptr[row + 1] = static_cast<std::int32_t>(col_idx.size());
  }
  return BlockPattern(block_size, block_rows, block_cols, heads, std::move(row_ptr), std::move(col_idx));
}

std::vector<std::uint8_t> BlockPattern::to_block_mask() const {
  const std::int64_t rows = heads_ * block_rows_;
  if (rows > 0 && static_cast<std::uint64_t>(rows) >
                      std::vector<std::uint8_t>().max_size() / static_cast<std::uint64_t>(block_cols_))
    throw InvalidArgument(fmt::format("pattern: a dense mask of heads * block_rows * block_cols = {} * {} * {} "
                                      "entries is too large to allocate",
                                      heads_, block_rows_, block_cols_));
  std::vector<std::uint8_t> mask(rows * block_cols_, 0);
  for (std::int64_t row = 0; row < rows; ++row)
    for (std::int64_t k = row_ptr_[row]; k < row_ptr_[row + 1]; ++k) mask[row * block_cols_ + col_idx_[k]] = 1;
  return mask;
}

PatternStats BlockPattern::stats() const {
  PatternStats s;
  const std::int64_t rows = heads_ * block_rows_;
  if (rows == 0) return s;
  s.nnz = nnz();
  s.density = static_cast<double>(s.nnz) / (static_cast<double>(rows) * static_cast<double>(block_cols_));
  s.min_per_row = std::numeric_limits<std::int64_t>::max();
  for (std::int64_t row = 0; row < rows; ++row) {
    const std::int64_t count = row_ptr_[row + 1] - row_ptr_[row];
    s.min_per_row = std::min(s.min_per_row, count);
    s.max_per_row = std::max(s.max_per_row, count);
    s.empty_rows += count == 0;
  }
  s.mean_per_row = static_cast<double>(s.nnz) / static_cast<double>(rows);
  return s;
}

BlockPattern BlockPattern::transposed() const {
  if (heads_ == 0) return {};
  // Per head, a counting sort of the entries by column; walking rows in order keeps each new row sorted.
  const std::int64_t new_rows = heads_ * block_cols_;
  std::vector<std::int32_t> row_ptr(new_rows + 1, 0), col_idx(col_idx_.size());
  for (int head = 0; head < heads_; ++head)
    for (std::int64_t k = row_ptr_[head * block_rows_]; k < row_ptr_[(head + 1) * block_rows_]; ++k)
      ++row_ptr[head * block_cols_ + col_idx_[k] + 1];
  for (std::int64_t row = 0; row < new_rows; ++row) row_ptr[row + 1] += row_ptr[row];
  std::vector<std::int32_t> next(row_ptr.begin(), row_ptr.end() - 1);
  for (int head = 0; head < heads_; ++head)
    for (std::int64_t block_row = 0; block_row < block_rows_; ++block_row) {
      const std::int64_t row = head * block_rows_ + block_row;
      for (std::int64_t k = row_ptr_[row]; k < row_ptr_[row + 1]; ++k)
        col_idx[next[head * block_cols_ + col_idx_[k]]++] = static_cast<std::int32_t>(block_row);
    }
  return BlockPattern(block_size_, block_cols_, block_rows_, heads_, std::move(row_ptr), std::move(col_idx));
}

}  // namespace sjit

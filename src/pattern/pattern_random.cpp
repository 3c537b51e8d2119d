// The builders with random blocks: BigBird-like and the benchmark pattern of a given density.
// Draws come from one std::mt19937_64(seed) stream, head by head and row by row, turned into bounded
// integers here rather than by a std:: distribution, whose algorithm each standard library picks: a seed
// names the same pattern everywhere (and head 0 of an H-head pattern is the 1-head pattern).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "pattern/pattern_internal.h"
#include "sparsejit/error.h"
#include "sparsejit/pattern.h"

namespace sjit {

using namespace pattern_detail;

namespace {

// Uniform in [0, n), n >= 1: rejects the 2^64 mod n lowest draws so that every residue is equally likely.
std::uint64_t uniform_below(std::mt19937_64& rng, std::uint64_t n) {
  const std::uint64_t rejected = (0 - n) % n;  // 2^64 mod n
  std::uint64_t x;
  do x = rng();
  while (x < rejected);
  return x % n;
}

// k distinct indices drawn uniformly from [0, m), sorted (Floyd's algorithm: Bentley & Floyd, "A sample of
// brilliance", CACM 1987): k draws, whatever m is. `taken` is an all-false scratch of size >= m, left so.
std::vector<std::int64_t> sample_sorted(std::mt19937_64& rng, std::int64_t m, std::int64_t k,
                                        std::vector<char>& taken) {
  std::vector<std::int64_t> chosen;
  chosen.reserve(k);
  for (std::int64_t j = m - k; j < m; ++j) {
    const auto t = static_cast<std::int64_t>(uniform_below(rng, static_cast<std::uint64_t>(j + 1)));
    const std::int64_t pick = taken[t] ? j : t;
    taken[pick] = 1;
    chosen.push_back(pick);
  }
  for (std::int64_t pick : chosen) taken[pick] = 0;
  std::sort(chosen.begin(), chosen.end());
  return chosen;
}

// The columns not in `active` (sorted), numbered 0, 1, ... in increasing order: the ones numbered `picks`
// (sorted). The t-th free column is t plus the number of active columns below it.
std::vector<std::int64_t> free_columns(const std::vector<std::int64_t>& active,
                                       const std::vector<std::int64_t>& picks) {
  std::vector<std::int64_t> columns;
  columns.reserve(picks.size());
  std::size_t below = 0;
  for (std::int64_t t : picks) {
    while (below < active.size() && active[below] <= t + static_cast<std::int64_t>(below)) ++below;
    columns.push_back(t + static_cast<std::int64_t>(below));
  }
  return columns;
}

void add_merged(BsrAssembler& bsr, const std::vector<std::int64_t>& a, const std::vector<std::int64_t>& b) {
  std::vector<std::int64_t> row(a.size() + b.size());
  std::merge(a.begin(), a.end(), b.begin(), b.end(), row.begin());
  for (std::int64_t col : row) bsr.add(col);
  bsr.end_row();
}

}  // namespace

namespace patterns {

BlockPattern bigbird(int block_size, std::int64_t seq_q, std::int64_t seq_k, int local_blocks, int global_blocks,
                     int random_blocks, std::uint64_t seed, int heads) {
  constexpr std::string_view context = "patterns::bigbird";
  const BlockShape shape = checked_shape(context, block_size, seq_q, seq_k, heads);
  check_not_negative(context, "local_blocks", local_blocks);
  check_not_negative(context, "global_blocks", global_blocks);
  check_not_negative(context, "random_blocks", random_blocks);
  const std::int64_t cols = shape.block_cols;

  // Row r's fixed blocks are [0, global_end) and [local_first, local_last]: global rows see everything,
  // other rows the global columns [0, global) and their window [r - local, r + local].
  auto global_end = [&](std::int64_t r) {
    return r < global_blocks ? cols : std::min<std::int64_t>(global_blocks, cols);
  };
  auto local_first = [&](std::int64_t r) { return std::max<std::int64_t>(global_end(r), r - local_blocks); };
  auto local_last = [&](std::int64_t r) { return std::min<std::int64_t>(cols - 1, r + local_blocks); };
  auto fixed_count = [&](std::int64_t r) {
    return global_end(r) + std::max<std::int64_t>(0, local_last(r) - local_first(r) + 1);
  };
  // Every row's size is known before drawing: refuse an impossible pattern before taking the memory.
  std::int64_t per_head = 0;
  for (std::int64_t r = 0; r < shape.block_rows; ++r)
    per_head += fixed_count(r) + std::min<std::int64_t>(random_blocks, cols - fixed_count(r));
  check_total_blocks(context, per_head);
  check_total_blocks(context, per_head * heads);

  std::mt19937_64 rng(seed);
  std::vector<char> taken(cols, 0);
  std::vector<std::int64_t> fixed;  // the row's local and global blocks, sorted
  BsrAssembler bsr(context);
  for (int head = 0; head < heads; ++head) {
    for (std::int64_t r = 0; r < shape.block_rows; ++r) {
      fixed.clear();
      for (std::int64_t c = 0; c < global_end(r); ++c) fixed.push_back(c);
      for (std::int64_t c = local_first(r); c <= local_last(r); ++c) fixed.push_back(c);
      const std::int64_t free = cols - static_cast<std::int64_t>(fixed.size());
      const std::int64_t draws = std::min<std::int64_t>(random_blocks, free);
      add_merged(bsr, fixed, free_columns(fixed, sample_sorted(rng, free, draws, taken)));
    }
  }
  return bsr.finish(block_size, shape.block_rows, cols, heads);
}

BlockPattern random(int block_size, std::int64_t seq_q, std::int64_t seq_k, double density, std::uint64_t seed,
                    int heads) {
  constexpr std::string_view context = "patterns::random";
  const BlockShape shape = checked_shape(context, block_size, seq_q, seq_k, heads);
  if (!(density >= 0.0 && density <= 1.0))  // NaN too
    throw InvalidArgument(fmt::format("{}: density = {} is out of range: allowed 0 .. 1", context, density));
  const std::int64_t cols = shape.block_cols;
  std::int64_t per_row = std::llround(density * static_cast<double>(cols));
  if (density > 0) per_row = std::max<std::int64_t>(per_row, 1);
  // Known in advance: refuse an impossible size before drawing anything.
  if (per_row > 0 && heads * shape.block_rows > kMaxIndex / per_row)
    check_total_blocks(context, kMaxIndex + 1);

  std::mt19937_64 rng(seed);
  std::vector<char> taken(cols, 0);
  BsrAssembler bsr(context);
  for (int head = 0; head < heads; ++head) {
    for (std::int64_t r = 0; r < shape.block_rows; ++r) {
      std::vector<std::int64_t> diagonal;
      if (per_row > 0 && r < cols) diagonal.push_back(r);
      const std::int64_t draws = per_row - static_cast<std::int64_t>(diagonal.size());
      const std::int64_t free = cols - static_cast<std::int64_t>(diagonal.size());
      add_merged(bsr, diagonal, free_columns(diagonal, sample_sorted(rng, free, draws, taken)));
    }
  }
  return bsr.finish(block_size, shape.block_rows, cols, heads);
}

}  // namespace patterns
}  // namespace sjit

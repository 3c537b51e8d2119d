// Block-sparse patterns: BSR against dense masks, validation naming the first bad entry, transpose and
// stats, every builder against its element- or block-level definition, and the file format (round trips,
// the byte layout, corrupt and truncated files).
#include <catch2/catch.hpp>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "sparsejit/error.h"
#include "sparsejit/pattern.h"
#include "support/temp_dir.h"
#include "support/test_support.h"

using namespace sjit;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

constexpr int kBlockSizes[] = {16, 32, 64, 128};

struct RandomMask {
  int block_size, heads;
  std::int64_t block_rows, block_cols;
  std::vector<std::uint8_t> mask;
};

// A mask of random shape whose rows range from empty to full (the density is drawn per mask).
RandomMask random_mask(std::mt19937_64& rng) {
  RandomMask m;
  m.block_size = kBlockSizes[rng() % 4];
  m.heads = 1 + static_cast<int>(rng() % 3);
  m.block_rows = 1 + static_cast<std::int64_t>(rng() % 9);
  m.block_cols = 1 + static_cast<std::int64_t>(rng() % 9);
  std::bernoulli_distribution on(std::uniform_real_distribution<double>(0, 1)(rng));
  m.mask.resize(m.heads * m.block_rows * m.block_cols);
  for (auto& v : m.mask) v = on(rng) ? static_cast<std::uint8_t>(1 + rng() % 255) : 0;
  return m;
}

BlockPattern pattern_of(const RandomMask& m) {
  return BlockPattern::from_block_mask(m.block_size, m.heads, m.block_rows, m.block_cols, m.mask);
}

// Little-endian field writers, for building files by hand.
template <class T>
void put(std::string& out, T value) {
  const auto bits = static_cast<std::uint64_t>(value);
  for (std::size_t i = 0; i < sizeof(T); ++i) out.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
}

// A version-1 file for the given fields, with a correct checksum unless told otherwise.
std::string handmade_file(std::uint32_t block_size, std::int64_t block_rows, std::int64_t block_cols,
                          std::uint32_t heads, const std::vector<std::int32_t>& row_ptr,
                          const std::vector<std::int32_t>& col_idx, std::uint32_t version = 1) {
  std::string out("SJITBSR\0", 8);
  put(out, version);
  put(out, block_size);
  put(out, block_rows);
  put(out, block_cols);
  put(out, heads);
  put(out, static_cast<std::int64_t>(col_idx.size()));
  for (std::int32_t v : row_ptr) put(out, v);
  for (std::int32_t v : col_idx) put(out, v);
  put(out, static_cast<std::uint64_t>(XXH3_64bits(out.data(), out.size())));
  return out;
}

struct TemporaryFolder : test::TempDir {
  TemporaryFolder() : TempDir("sjit-pattern-test-") {}
};

}  // namespace

TEST_CASE("a block mask round-trips through BSR, and BSR answers like the mask", "[pattern]") {
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 300; ++trial) {
    const RandomMask m = random_mask(rng);
    const BlockPattern p = pattern_of(m);
    std::vector<std::uint8_t> expected(m.mask.size());
    std::transform(m.mask.begin(), m.mask.end(), expected.begin(), [](std::uint8_t v) { return v != 0; });
    REQUIRE(p.to_block_mask() == expected);
    CHECK(p.nnz() == std::count(expected.begin(), expected.end(), 1));
    CHECK(p.row_ptr().size() == static_cast<std::size_t>(m.heads * m.block_rows + 1));
    for (int h = 0; h < m.heads; ++h)
      for (std::int64_t r = 0; r < m.block_rows; ++r)
        for (std::int64_t c = 0; c < m.block_cols; ++c)
          REQUIRE(p.active(h, r, c) == (expected[(h * m.block_rows + r) * m.block_cols + c] == 1));
  }
}

TEST_CASE("a mask of the wrong size is refused", "[pattern]") {
  std::vector<std::uint8_t> mask(2 * 3 * 4 - 1, 1);
  CHECK_THROWS_WITH(BlockPattern::from_block_mask(16, 2, 3, 4, mask), Contains("mask has 23 entries"));
  CHECK_THROWS_WITH(BlockPattern::from_block_mask(16, 0, 3, 4, mask), Contains("heads = 0"));
}

TEST_CASE("the constructor refuses a bad BSR, naming the first bad entry", "[pattern]") {
  auto make = [](std::vector<std::int32_t> row_ptr, std::vector<std::int32_t> col_idx, int heads = 1,
                 std::int64_t block_rows = 2, std::int64_t block_cols = 4, int block_size = 32) {
    return BlockPattern(block_size, block_rows, block_cols, heads, std::move(row_ptr), std::move(col_idx));
  };
  SECTION("a valid one passes: a row may start below where the previous one ended") {
    CHECK_NOTHROW(make({0, 2, 3}, {1, 3, 0}));
  }
  SECTION("block size") {
    CHECK_THROWS_WITH(make({0, 0, 0}, {}, 1, 2, 4, 24), Contains("block_size = 24") && Contains("16, 32, 64, 128"));
  }
  SECTION("shape and heads") {
    CHECK_THROWS_WITH(make({0}, {}, 1, 0), Contains("block_rows = 0"));
    CHECK_THROWS_WITH(make({0, 0, 0}, {}, 1, 2, std::int64_t{1} << 31), Contains("block_cols = 2147483648"));
    CHECK_THROWS_WITH(make({0}, {}, 0), Contains("heads = 0"));
  }
  SECTION("row_ptr length") {
    CHECK_THROWS_WITH(make({0, 0, 0}, {}, 2), Contains("row_ptr has 3 entries") && Contains("5"));
  }
  SECTION("row_ptr[0]") { CHECK_THROWS_WITH(make({1, 1, 1}, {}), Contains("row_ptr[0] = 1 must be 0")); }
  SECTION("decreasing row_ptr") {
    CHECK_THROWS_WITH(make({0, 2, 1, 0}, {0, 1}, 1, 3),
                      Contains("row_ptr[2] = 1 is less than row_ptr[1] = 2") && Contains("block row 1 of head 0"));
  }
  SECTION("row_ptr's last entry against col_idx") {
    CHECK_THROWS_WITH(make({0, 1, 2}, {0, 1, 2}), Contains("row_ptr[2] = 2") && Contains("col_idx.size() = 3"));
  }
  SECTION("a column out of range, the first one named") {
    CHECK_THROWS_WITH(make({0, 2, 4}, {0, 4, 5, 9}),
                      Contains("col_idx[1] = 4 in block row 0 (head 0) is out of range") && Contains("[0, 4)"));
    CHECK_THROWS_WITH(make({0, 1, 1}, {-1}), Contains("col_idx[0] = -1"));
  }
  SECTION("unsorted or repeated columns, the first one named") {
    // Rows 0-2 hold 16 blocks; row 3 repeats 9 at col_idx[17], then goes down at col_idx[18].
    std::vector<std::int32_t> row_ptr{0, 5, 10, 16, 19};
    std::vector<std::int32_t> cols;
    for (int c = 0; c < 5; ++c) cols.push_back(c);
    for (int c = 0; c < 5; ++c) cols.push_back(c);
    for (int c = 0; c < 6; ++c) cols.push_back(c);
    for (int c : {9, 9, 3}) cols.push_back(c);
    CHECK_THROWS_WITH(make(row_ptr, cols, 1, 4, 16),
                      "pattern: col_idx[17] = 9 in block row 3 (head 0) is not greater than the previous column 9: "
                      "columns of a row must be sorted and distinct");
    CHECK_THROWS_WITH(make({0, 2, 2}, {3, 1}), Contains("col_idx[1] = 1") && Contains("previous column 3"));
  }
  SECTION("rows are named within their head") {
    CHECK_THROWS_WITH(make({0, 1, 2, 3, 5}, {0, 1, 2, 2, 1}, 2),
                      Contains("col_idx[4] = 1 in block row 1 (head 1)"));
  }
  SECTION("every failure is an InvalidArgument") { CHECK_THROWS_AS(make({0, 0}, {}), InvalidArgument); }
}

TEST_CASE("rows, heads and columns out of range are refused by the accessors", "[pattern]") {
  const BlockPattern p = patterns::dense(16, 40, 40);  // 3 x 3 blocks, one head
  CHECK(p.row(0, 2).size() == 3);
  CHECK_THROWS_WITH(p.row(1, 0), Contains("head = 1") && Contains("use 0"));
  CHECK_THROWS_WITH(p.row(0, 3), Contains("block_row = 3"));
  CHECK_THROWS_WITH(p.active(0, 0, -1), Contains("block_col = -1"));
  CHECK(p.row_index(0, 2) == 2);
  CHECK(patterns::dense(16, 40, 40, 4).row_index(3, 1) == 3 * 3 + 1);
}

TEST_CASE("transposing swaps query and key blocks, and twice gives the pattern back", "[pattern]") {
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 200; ++trial) {
    const BlockPattern p = pattern_of(random_mask(rng));
    const BlockPattern t = p.transposed();
    REQUIRE(t.block_rows() == p.block_cols());
    REQUIRE(t.block_cols() == p.block_rows());
    REQUIRE(t.heads() == p.heads());
    REQUIRE(t.block_size() == p.block_size());
    REQUIRE(t.nnz() == p.nnz());
    for (int h = 0; h < p.heads(); ++h)
      for (std::int64_t r = 0; r < p.block_rows(); ++r)
        for (std::int64_t c = 0; c < p.block_cols(); ++c) REQUIRE(t.active(h, c, r) == p.active(h, r, c));
    REQUIRE(t.transposed() == p);
  }
}

TEST_CASE("stats count what is hand-countable", "[pattern]") {
  SECTION("two heads of 3 x 4 blocks") {
    // head 0: {0,1}, {}, {0,1,2,3}; head 1: {2}, {1,3}, {}
    const BlockPattern p(64, 3, 4, 2, {0, 2, 2, 6, 7, 9, 9}, {0, 1, 0, 1, 2, 3, 2, 1, 3});
    const PatternStats s = p.stats();
    CHECK(s.nnz == 9);
    CHECK(s.density == Approx(9.0 / 24.0));
    CHECK(s.min_per_row == 0);
    CHECK(s.max_per_row == 4);
    CHECK(s.mean_per_row == Approx(1.5));
    CHECK(s.empty_rows == 2);
  }
  SECTION("causal 4 x 4 blocks: 1 + 2 + 3 + 4") {
    const PatternStats s = patterns::causal(32, 128, 128).stats();
    CHECK(s.nnz == 10);
    CHECK(s.density == Approx(10.0 / 16.0));
    CHECK(s.min_per_row == 1);
    CHECK(s.max_per_row == 4);
    CHECK(s.mean_per_row == Approx(2.5));
    CHECK(s.empty_rows == 0);
  }
  SECTION("the empty pattern") {
    CHECK(BlockPattern().stats() == PatternStats{});
    CHECK(BlockPattern().nnz() == 0);
    CHECK(BlockPattern().block_size() == 0);
  }
}

TEST_CASE("the digest names a pattern: it is the XXH3-64 of the file body", "[pattern]") {
  const BlockPattern p(16, 2, 3, 1, {0, 1, 3}, {2, 0, 1});
  const std::string bytes = p.to_bytes();
  CHECK(p.digest() == XXH3_64bits(bytes.data() + 12, bytes.size() - 12 - 8));
  CHECK(BlockPattern(16, 2, 3, 1, {0, 1, 3}, {2, 0, 1}).digest() == p.digest());
  CHECK(BlockPattern(16, 2, 3, 1, {0, 1, 3}, {1, 0, 1}).digest() != p.digest());  // one column
  CHECK(BlockPattern(32, 2, 3, 1, {0, 1, 3}, {2, 0, 1}).digest() != p.digest());  // block size
  CHECK(BlockPattern(16, 2, 4, 1, {0, 1, 3}, {2, 0, 1}).digest() != p.digest());  // shape
  CHECK(BlockPattern(16, 1, 3, 2, {0, 1, 3}, {2, 0, 1}).digest() != p.digest());  // rows as heads
  CHECK(BlockPattern().digest() == BlockPattern().digest());
  CHECK(BlockPattern().digest() != p.digest());
}

TEST_CASE("dense: every block", "[pattern]") {
  const BlockPattern p = patterns::dense(64, 100, 300, 2);
  CHECK(p.block_rows() == 2);
  CHECK(p.block_cols() == 5);
  CHECK(p.heads() == 2);
  CHECK(p.stats().density == 1.0);
}

TEST_CASE("causal: a block is active iff some (query, key) in it satisfies the causal rule", "[pattern]") {
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  std::vector<std::tuple<int, std::int64_t, std::int64_t>> shapes = {
      {32, 100, 250}, {32, 250, 100}, {16, 100, 100}, {16, 1, 1}, {128, 1, 300}, {64, 300, 1}, {32, 64, 64}};
  for (int i = 0; i < 20; ++i)
    shapes.push_back({kBlockSizes[rng() % 4], 1 + static_cast<std::int64_t>(rng() % 400),
                      1 + static_cast<std::int64_t>(rng() % 400)});
  for (const auto& [bs, seq_q, seq_k] : shapes)
    for (CausalAlign align : {CausalAlign::top_left, CausalAlign::bottom_right}) {
      CAPTURE(bs, seq_q, seq_k, align == CausalAlign::top_left ? "top_left" : "bottom_right");
      const BlockPattern p = patterns::causal(bs, seq_q, seq_k, align);
      REQUIRE(p.block_rows() == (seq_q + bs - 1) / bs);
      REQUIRE(p.block_cols() == (seq_k + bs - 1) / bs);
      const std::int64_t offset = align == CausalAlign::bottom_right ? seq_k - seq_q : 0;
      for (std::int64_t r = 0; r < p.block_rows(); ++r)
        for (std::int64_t c = 0; c < p.block_cols(); ++c) {
          bool touched = false;
          for (std::int64_t i = r * bs; i < std::min((r + 1) * bs, seq_q); ++i)
            for (std::int64_t j = c * bs; j < std::min((c + 1) * bs, seq_k); ++j) touched |= j <= i + offset;
          CAPTURE(r, c);
          REQUIRE(p.active(0, r, c) == touched);
        }
    }
}

TEST_CASE("causal with several heads repeats the pattern for each", "[pattern]") {
  const BlockPattern one = patterns::causal(32, 100, 250, CausalAlign::bottom_right);
  const BlockPattern three = patterns::causal(32, 100, 250, CausalAlign::bottom_right, 3);
  CHECK(three.nnz() == 3 * one.nnz());
  for (int h = 0; h < 3; ++h)
    for (std::int64_t r = 0; r < one.block_rows(); ++r)
      CHECK(std::ranges::equal(three.row(h, r), one.row(0, r)));
}

TEST_CASE("sliding window: key blocks r - before .. r + after", "[pattern]") {
  for (auto [seq_q, seq_k] : {std::pair<std::int64_t, std::int64_t>{100, 250}, {250, 100}, {64, 64}})
    for (std::int64_t before : {0, 1, 3, 100})
      for (std::int64_t after : {std::int64_t{0}, std::int64_t{2}, std::numeric_limits<std::int64_t>::max()}) {
        CAPTURE(seq_q, seq_k, before, after);
        const BlockPattern p = patterns::sliding_window(16, seq_q, seq_k, before, after);
        for (std::int64_t r = 0; r < p.block_rows(); ++r)
          for (std::int64_t c = 0; c < p.block_cols(); ++c)
            REQUIRE(p.active(0, r, c) == (c >= r - before && c - r <= after));
      }
}

TEST_CASE("bigbird: local, global rows and columns, and exactly the random blocks asked for", "[pattern]") {
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  const int local = 1, global = 2, random_blocks = 3;
  const BlockPattern p = patterns::bigbird(32, 1000, 1200, local, global, random_blocks, seed, 4);
  REQUIRE(p.block_rows() == 32);
  REQUIRE(p.block_cols() == 38);
  bool heads_differ = false;
  for (int h = 0; h < p.heads(); ++h)
    for (std::int64_t r = 0; r < p.block_rows(); ++r) {
      std::int64_t fixed = 0, extra = 0;
      for (std::int64_t c = 0; c < p.block_cols(); ++c) {
        const bool must = std::abs(c - r) <= local || c < global || r < global;
        fixed += must;
        if (must) REQUIRE(p.active(h, r, c));
        else extra += p.active(h, r, c);
      }
      CAPTURE(h, r);
      REQUIRE(extra == std::min<std::int64_t>(random_blocks, p.block_cols() - fixed));
      if (h > 0 && !std::ranges::equal(p.row(h, r), p.row(0, r))) heads_differ = true;
    }
  CHECK(heads_differ);
  CHECK(patterns::bigbird(32, 1000, 1200, local, global, random_blocks, seed, 4) == p);
  CHECK(patterns::bigbird(32, 1000, 1200, local, global, random_blocks, seed + 1, 4) != p);
  CHECK_THROWS_WITH(patterns::bigbird(32, 100, 100, -1, 0, 0, 0), Contains("local_blocks = -1"));
  CHECK_THROWS_WITH(patterns::bigbird(32, 100, 100, 0, 0, -2, 0), Contains("random_blocks = -2"));
}

TEST_CASE("random: exact per-row counts, the diagonal kept, fixed by the seed", "[pattern]") {
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  for (double density : {0.0, 0.001, 0.1, 0.25, 0.5, 0.999, 1.0})
    for (auto [seq_q, seq_k] : {std::pair<std::int64_t, std::int64_t>{1000, 1000}, {2000, 600}, {300, 2000}}) {
      CAPTURE(density, seq_q, seq_k);
      const BlockPattern p = patterns::random(64, seq_q, seq_k, density, seed, 2);
      const std::int64_t cols = p.block_cols();
      std::int64_t per_row = std::llround(density * static_cast<double>(cols));
      if (density > 0) per_row = std::max<std::int64_t>(per_row, 1);
      for (int h = 0; h < 2; ++h)
        for (std::int64_t r = 0; r < p.block_rows(); ++r) {
          CAPTURE(h, r);
          REQUIRE(static_cast<std::int64_t>(p.row(h, r).size()) == per_row);
          if (density > 0 && r < cols) REQUIRE(p.active(h, r, r));
        }
      CHECK(patterns::random(64, seq_q, seq_k, density, seed, 2) == p);
    }
  // Another seed, another pattern; head 0 of a 3-head pattern is the 1-head pattern of the same seed.
  const BlockPattern three = patterns::random(16, 4096, 4096, 0.25, seed, 3);
  CHECK(patterns::random(16, 4096, 4096, 0.25, seed + 1, 3) != three);
  const std::vector<std::uint8_t> mask = three.to_block_mask();
  CHECK(patterns::random(16, 4096, 4096, 0.25, seed, 1) ==
        BlockPattern::from_block_mask(16, 1, 256, 256, std::span(mask).first(256 * 256)));
}

TEST_CASE("random: the other blocks of a row are drawn uniformly", "[pattern]") {
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  // 64 heads of 64 x 64 blocks, 16 a row: 15 drawn from the 63 off the diagonal. A column is off the
  // diagonal in 63 rows of a head, so it is drawn 64 * 63 * 15/63 = 960 times on average, standard
  // deviation about 27. Favouring low or high columns, or some distance from the diagonal, breaks +-20%.
  const int heads = 64;
  const BlockPattern p = patterns::random(16, 64 * 16, 64 * 16, 0.25, seed, heads);
  std::vector<double> by_column(64, 0), by_distance(64, 0);
  for (int h = 0; h < heads; ++h)
    for (std::int64_t r = 0; r < 64; ++r)
      for (std::int32_t c : p.row(h, r))
        if (c != r) {
          ++by_column[c];
          ++by_distance[(c - r + 64) % 64];
        }
  const double expected = heads * 15.0;
  for (int c = 0; c < 64; ++c) {
    CAPTURE(c);
    CHECK(std::abs(by_column[c] - expected) < 0.2 * expected);
    if (c > 0) CHECK(std::abs(by_distance[c] - expected * 64 / 63) < 0.2 * expected);
  }
}

TEST_CASE("from_graph: the top_k block pairs of a row by edge count, ties to the smaller column", "[pattern]") {
  using Edge = std::pair<std::int64_t, std::int64_t>;
  SECTION("by hand") {
    // 4 x 4 blocks of 16. Row 0: column 1 and 2 have 3 edges, column 3 two, column 0 one.
    std::vector<Edge> edges = {{0, 16}, {5, 17}, {15, 31}, {1, 32}, {2, 33}, {3, 47},
                               {4, 48}, {4, 49}, {0, 0},   {33, 60}, {40, 2}};
    // Row 2 (queries 32..47): column 3 and 0 one edge each.
    const BlockPattern two = patterns::from_graph(16, 64, 64, edges, 2);
    CHECK(std::ranges::equal(two.row(0, 0), std::vector<std::int32_t>{1, 2}));
    CHECK(two.row(0, 1).empty());
    CHECK(std::ranges::equal(two.row(0, 2), std::vector<std::int32_t>{0, 3}));
    const BlockPattern one = patterns::from_graph(16, 64, 64, edges, 1);
    CHECK(std::ranges::equal(one.row(0, 0), std::vector<std::int32_t>{1}));
    CHECK(std::ranges::equal(one.row(0, 2), std::vector<std::int32_t>{0}));
    const BlockPattern all = patterns::from_graph(16, 64, 64, edges, 10, 2);
    CHECK(std::ranges::equal(all.row(1, 0), std::vector<std::int32_t>{0, 1, 2, 3}));
    CHECK(all.nnz() == 2 * 6);
  }
  SECTION("random graphs against counting in a dense table") {
    const std::uint64_t seed = test::fresh_seed();
    CAPTURE(seed);
    std::mt19937_64 rng(seed);
    for (int trial = 0; trial < 30; ++trial) {
      const std::int64_t seq_q = 1 + rng() % 300, seq_k = 1 + rng() % 300;
      const int bs = 16, top_k = 1 + static_cast<int>(rng() % 6);
      std::vector<Edge> edges(rng() % 2000);
      for (auto& e : edges) e = {static_cast<std::int64_t>(rng() % seq_q), static_cast<std::int64_t>(rng() % seq_k)};
      const BlockPattern p = patterns::from_graph(bs, seq_q, seq_k, edges, top_k);
      std::vector<std::vector<int>> count(p.block_rows(), std::vector<int>(p.block_cols(), 0));
      for (auto [i, j] : edges) ++count[i / bs][j / bs];
      for (std::int64_t r = 0; r < p.block_rows(); ++r) {
        std::vector<std::pair<int, std::int64_t>> ranked;  // (-count, column): the order of the rule
        for (std::int64_t c = 0; c < p.block_cols(); ++c)
          if (count[r][c] > 0) ranked.push_back({-count[r][c], c});
        std::sort(ranked.begin(), ranked.end());
        std::vector<std::int32_t> expected;
        for (std::size_t k = 0; k < std::min<std::size_t>(top_k, ranked.size()); ++k)
          expected.push_back(static_cast<std::int32_t>(ranked[k].second));
        std::sort(expected.begin(), expected.end());
        CAPTURE(trial, r);
        REQUIRE(std::ranges::equal(p.row(0, r), expected));
      }
    }
  }
  SECTION("bad edges and top_k") {
    std::vector<Edge> edges = {{0, 0}, {5, 7}, {100, 3}, {-1, 0}};
    CHECK_THROWS_WITH(patterns::from_graph(16, 100, 250, edges, 2), Contains("edges[2] = (100, 3) is out of range"));
    edges[2] = {1, 250};
    CHECK_THROWS_WITH(patterns::from_graph(16, 100, 250, edges, 2), Contains("edges[2] = (1, 250)"));
    CHECK_THROWS_WITH(patterns::from_graph(16, 100, 250, {}, 0), Contains("top_k = 0"));
  }
}

TEST_CASE("builders refuse bad arguments, naming them", "[pattern]") {
  CHECK_THROWS_WITH(patterns::dense(48, 100, 100), Contains("patterns::dense: block_size = 48"));
  CHECK_THROWS_WITH(patterns::causal(32, -5, 100), Contains("seq_q = -5"));
  CHECK_THROWS_WITH(patterns::causal(32, 100, 0), Contains("seq_k = 0"));
  CHECK_THROWS_WITH(patterns::causal(32, 100, 100, CausalAlign::top_left, 0), Contains("heads = 0"));
  CHECK_THROWS_WITH(patterns::sliding_window(32, 100, 100, -1, 0), Contains("blocks_before = -1"));
  CHECK_THROWS_WITH(patterns::random(32, 100, 100, 1.5, 1), Contains("density = 1.5"));
  CHECK_THROWS_WITH(patterns::random(32, 100, 100, -0.1, 1), Contains("density = -0.1"));
  CHECK_THROWS_WITH(patterns::random(32, 100, 100, std::nan(""), 1), Contains("density = nan"));
  CHECK_THROWS_WITH(patterns::dense(16, std::int64_t{1} << 40, 16), Contains("seq_q"));
  // Patterns of more than 2^31 - 1 blocks do not fit int32 indices: refused before any memory is taken
  // (each of these would take 8 GiB or more).
  CHECK_THROWS_WITH(patterns::dense(16, std::int64_t{1} << 24, std::int64_t{1} << 24), Contains("active blocks"));
  CHECK_THROWS_WITH(patterns::causal(16, std::int64_t{1} << 24, std::int64_t{1} << 24), Contains("active blocks"));
  CHECK_THROWS_WITH(patterns::sliding_window(16, std::int64_t{1} << 30, std::int64_t{1} << 30, 64, 0),
                    Contains("active blocks"));
  CHECK_THROWS_WITH(patterns::random(16, std::int64_t{1} << 24, std::int64_t{1} << 24, 0.5, 1),
                    Contains("active blocks"));
  CHECK_THROWS_WITH(patterns::bigbird(16, std::int64_t{1} << 30, std::int64_t{1} << 30, 32, 2, 4, 1),
                    Contains("active blocks"));
}

TEST_CASE("to_bytes writes the documented layout, and from_bytes reads it back", "[pattern]") {
  const BlockPattern p(32, 2, 3, 2, {0, 1, 3, 3, 6}, {2, 0, 1, 0, 1, 2});
  const std::string bytes = p.to_bytes();
  CHECK(bytes == handmade_file(32, 2, 3, 2, {0, 1, 3, 3, 6}, {2, 0, 1, 0, 1, 2}));
  CHECK(bytes.size() == 44 + 4 * 5 + 4 * 6 + 8);
  CHECK(BlockPattern::from_bytes(bytes) == p);
  CHECK_THROWS_WITH(BlockPattern().to_bytes(), Contains("empty pattern"));
}

TEST_CASE("save and load round-trip random patterns", "[pattern]") {
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  TemporaryFolder folder;
  const fs::path file = folder.path() / "pattern.bsr";
  for (int trial = 0; trial < 50; ++trial) {
    const BlockPattern p = pattern_of(random_mask(rng));
    p.save(file);  // over the previous one
    const BlockPattern loaded = BlockPattern::load(file);
    REQUIRE(loaded == p);
    REQUIRE(loaded.digest() == p.digest());
  }
  const BlockPattern big = patterns::bigbird(64, 8192, 8192, 2, 1, 3, seed, 8);
  big.save(file);
  CHECK(BlockPattern::load(file) == big);
  CHECK(test::file_names_under(folder.path()) == std::vector<std::string>{"pattern.bsr"});  // no temporary left
  CHECK_THROWS_AS(big.save(folder.path() / "missing" / "p.bsr"), Error);
}

TEST_CASE("corrupt, truncated and foreign files give clear errors and never crash", "[pattern]") {
  TemporaryFolder folder;
  const fs::path file = folder.path() / "p.bsr";
  const BlockPattern p = patterns::causal(16, 100, 250, CausalAlign::bottom_right, 2);
  const std::string good = p.to_bytes();
  auto load_bytes = [&](const std::string& bytes) {
    test::write_file(file, bytes);
    return BlockPattern::load(file);
  };
  SECTION("a flipped byte in the arrays or the checksum fails the checksum") {
    for (std::size_t at : {std::size_t{44}, std::size_t{60}, good.size() - 20, good.size() - 1}) {
      std::string bad = good;
      bad[at] = static_cast<char>(bad[at] ^ 0x10);
      CAPTURE(at);
      CHECK_THROWS_WITH(load_bytes(bad), Contains("checksum mismatch") && Contains(file.string()));
    }
  }
  SECTION("every single flipped byte is refused") {
    for (std::size_t at = 0; at < good.size(); ++at) {
      std::string bad = good;
      bad[at] = static_cast<char>(~bad[at]);
      CAPTURE(at);
      CHECK_THROWS_AS(BlockPattern::from_bytes(bad), InvalidArgument);
    }
  }
  SECTION("every truncation is refused") {
    for (std::size_t length = 0; length < good.size(); ++length) {
      CAPTURE(length);
      CHECK_THROWS_AS(BlockPattern::from_bytes(std::string_view(good).substr(0, length)), InvalidArgument);
    }
    CHECK_THROWS_WITH(load_bytes(good.substr(0, good.size() - 4)), Contains("truncated"));
    CHECK_THROWS_WITH(load_bytes(good + "x"), Contains("truncated or corrupt"));
    CHECK_THROWS_WITH(load_bytes(""), Contains("not a sparsejit block pattern"));
  }
  SECTION("wrong magic") {
    CHECK_THROWS_WITH(load_bytes("SJITBSQ" + good.substr(7)), Contains("not a sparsejit block pattern"));
    CHECK_THROWS_WITH(load_bytes("{\"json\": true}"), Contains("not a sparsejit block pattern"));
  }
  SECTION("another version") {
    CHECK_THROWS_WITH(load_bytes(handmade_file(16, 1, 1, 1, {0, 1}, {0}, 2)),
                      Contains("format version 2 is not supported") && Contains("version 1"));
  }
  SECTION("a header promising a huge pattern is refused from the file size, before allocating") {
    const std::int64_t max = std::numeric_limits<std::int32_t>::max();
    CHECK_THROWS_WITH(load_bytes(handmade_file(16, max, max, static_cast<std::uint32_t>(max), {0}, {})),
                      Contains("truncated or corrupt") && Contains("heads = 2147483647"));
    CHECK_THROWS_WITH(load_bytes(handmade_file(16, max + 1, 1, 1, {0}, {})), Contains("block_rows = 2147483648"));
  }
  SECTION("a correct checksum over an invalid BSR names the entry and the file") {
    CHECK_THROWS_WITH(load_bytes(handmade_file(16, 2, 4, 1, {0, 2, 3}, {3, 1, 0})),
                      Contains(file.string()) && Contains("col_idx[1] = 1") && Contains("sorted and distinct"));
    CHECK_THROWS_WITH(load_bytes(handmade_file(24, 1, 1, 1, {0, 1}, {0})), Contains("block_size = 24"));
  }
  SECTION("missing files and folders") {
    CHECK_THROWS_WITH(BlockPattern::load(folder.path() / "nope.bsr"), Contains("nope.bsr") && Contains("cannot open"));
    CHECK_THROWS_WITH(BlockPattern::load(folder.path()), Contains("not a regular file"));
  }
}

// Patterns made from a function of blocks (patterns::from_predicate), from scores of blocks
// (patterns::from_scores) and from other patterns (patterns::united, patterns::intersected), checked
// against their definitions on dense block masks and score tables.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <stdexcept>
#include <tuple>
#include <utility>
#include <vector>

#include "sparsejit/error.h"
#include "sparsejit/pattern.h"
#include "support/test_support.h"

using namespace sjit;
using Catch::Matchers::Contains;

namespace {

// A random [heads][rows][cols] block mask, about `density` of it active.
std::vector<std::uint8_t> random_mask(int heads, std::int64_t rows, std::int64_t cols, double density,
                                      std::mt19937_64& rng) {
  std::vector<std::uint8_t> mask(std::size_t(heads * rows * cols));
  std::bernoulli_distribution active(density);
  for (auto& m : mask) m = active(rng) ? 1 : 0;
  return mask;
}

// Tile (h, r, c) of a [heads][rows][cols] mask; a one-head mask answers for every head.
bool tile(const std::vector<std::uint8_t>& mask, int heads, std::int64_t rows, std::int64_t cols, int h,
          std::int64_t r, std::int64_t c) {
  return mask[std::size_t(((heads == 1 ? 0 : h) * rows + r) * cols + c)] != 0;
}

}  // namespace

TEST_CASE("from_predicate: a tile is active iff the predicate says so, asked once a tile in order", "[pattern]") {
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  const int heads = 3, bs = 32;
  const std::int64_t seq_q = 300, seq_k = 200;  // partial last blocks: 10 x 7 blocks
  const std::int64_t rows = 10, cols = 7;
  const std::vector<std::uint8_t> mask = random_mask(heads, rows, cols, 0.3, rng);
  std::vector<std::tuple<int, std::int64_t, std::int64_t>> asked;
  const BlockPattern p = patterns::from_predicate(
      bs, seq_q, seq_k,
      [&](int h, std::int64_t r, std::int64_t c) {
        asked.emplace_back(h, r, c);
        return tile(mask, heads, rows, cols, h, r, c);
      },
      heads);
  CHECK(p == BlockPattern::from_block_mask(bs, heads, rows, cols, mask));
  // Head by head, row by row, columns in order, every tile once.
  REQUIRE(asked.size() == std::size_t(heads * rows * cols));
  for (std::size_t i = 0; i < asked.size(); ++i) {
    const auto want = std::make_tuple(int(i / (rows * cols)), std::int64_t(i / cols % rows), std::int64_t(i % cols));
    REQUIRE(asked[i] == want);
  }
  // A builder's rule as a predicate gives the builder's pattern.
  const BlockPattern band = patterns::from_predicate(
      16, 500, 500, [](int, std::int64_t r, std::int64_t c) { return c >= r - 3 && c <= r + 1; });
  CHECK(band == patterns::sliding_window(16, 500, 500, 3, 1));
  // Nothing active: every row empty.
  CHECK(patterns::from_predicate(64, 256, 256, [](int, std::int64_t, std::int64_t) { return false; }).nnz() == 0);
}

TEST_CASE("united and intersected: the tiles of either pattern and of both, one-head patterns shared", "[pattern]") {
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  const std::int64_t rows = 9, cols = 12;
  for (const auto& [heads_a, heads_b] : {std::pair{1, 1}, {4, 4}, {1, 4}, {4, 1}}) {
    CAPTURE(heads_a, heads_b);
    const auto mask_a = random_mask(heads_a, rows, cols, 0.4, rng), mask_b = random_mask(heads_b, rows, cols, 0.4, rng);
    const BlockPattern a = BlockPattern::from_block_mask(64, heads_a, rows, cols, mask_a);
    const BlockPattern b = BlockPattern::from_block_mask(64, heads_b, rows, cols, mask_b);
    const BlockPattern either = patterns::united(a, b), both = patterns::intersected(a, b);
    const int heads = std::max(heads_a, heads_b);
    REQUIRE(either.heads() == heads);
    REQUIRE(both.heads() == heads);
    for (int h = 0; h < heads; ++h)
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t c = 0; c < cols; ++c) {
          const bool in_a = tile(mask_a, heads_a, rows, cols, h, r, c);
          const bool in_b = tile(mask_b, heads_b, rows, cols, h, r, c);
          REQUIRE(either.active(h, r, c) == (in_a || in_b));
          REQUIRE(both.active(h, r, c) == (in_a && in_b));
        }
  }
  // Combinations that builders give directly: a causal window is the window's part before the diagonal.
  const BlockPattern window = patterns::sliding_window(32, 1000, 1000, 4, 2);
  CHECK(patterns::intersected(window, patterns::causal(32, 1000, 1000)) == patterns::sliding_window(32, 1000, 1000, 4, 0));
  CHECK(patterns::united(window, window) == window);
  CHECK(patterns::intersected(window, patterns::dense(32, 1000, 1000)) == window);
}

TEST_CASE("combining patterns of different shapes, an empty pattern or predicate is refused, naming them",
          "[pattern]") {
  const BlockPattern a = patterns::dense(32, 256, 256, 2);
  CHECK_THROWS_WITH(patterns::united(a, patterns::dense(64, 256, 256, 2)),
                    Contains("patterns::united: the patterns differ (block_size 32, 8 x 8 blocks, 2 heads against "
                             "block_size 64, 4 x 4 blocks, 2 heads)"));
  CHECK_THROWS_WITH(patterns::intersected(a, patterns::dense(32, 256, 288, 2)), Contains("8 x 9 blocks"));
  CHECK_THROWS_WITH(patterns::intersected(a, patterns::dense(32, 256, 256, 3)),
                    Contains("the same heads or one of them a single head"));
  CHECK_THROWS_WITH(patterns::united(BlockPattern(), a), Contains("the first pattern is empty"));
  CHECK_THROWS_WITH(patterns::from_predicate(32, 256, 256, nullptr), Contains("the predicate is empty"));
  CHECK_THROWS_WITH(patterns::from_predicate(48, 256, 256, [](int, std::int64_t, std::int64_t) { return true; }),
                    Contains("patterns::from_predicate: block_size = 48"));
  // What the predicate throws passes through.
  CHECK_THROWS_WITH(patterns::from_predicate(32, 256, 256,
                                             [](int, std::int64_t r, std::int64_t) -> bool {
                                               if (r == 3) throw std::runtime_error("row 3 is not ready");
                                               return true;
                                             }),
                    Contains("row 3 is not ready"));
}

TEST_CASE("from_scores: each row keeps its best tiles, by count or by a share of its total", "[pattern]") {
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  const int heads = 2;
  const std::int64_t rows = 12, cols = 20, bs = 16;
  std::vector<float> scores(std::size_t(heads * rows * cols));
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  for (auto& s : scores) s = uniform(rng) < 0.2f ? 0.0f : uniform(rng);  // some tiles never attended
  scores[std::size_t(3 * cols + 5)] = scores[std::size_t(3 * cols + 9)] = 1.5f;  // a tie above all: column 5 first
  auto score = [&](int h, std::int64_t r, std::int64_t c) { return scores[std::size_t((h * rows + r) * cols + c)]; };

  // Top k, without the diagonal: no tile left out outscores a kept one (ties to the smaller column).
  for (const std::int64_t k : {1, 4, 19, 25}) {
    const BlockPattern p = patterns::from_scores(bs, rows * bs, cols * bs, scores, {.top_k = k, .diagonal = false}, heads);
    for (int h = 0; h < heads; ++h)
      for (std::int64_t r = 0; r < rows; ++r) {
        INFO("top_k " << k << ", head " << h << ", row " << r);
        REQUIRE(std::int64_t(p.row(h, r).size()) == std::min(k, cols));
        for (std::int64_t kept : p.row(h, r))
          for (std::int64_t c = 0; c < cols; ++c)
            if (!p.active(h, r, c))
              REQUIRE((score(h, r, kept) > score(h, r, c) || (score(h, r, kept) == score(h, r, c) && kept < c)));
      }
  }
  const BlockPattern one = patterns::from_scores(bs, rows * bs, cols * bs, scores, {.top_k = 1, .diagonal = false}, heads);
  CHECK(std::vector<std::int32_t>(one.row(0, 3).begin(), one.row(0, 3).end()) == std::vector<std::int32_t>{5});
  // With the diagonal: it is kept, and counts toward top_k.
  const BlockPattern diag = patterns::from_scores(bs, rows * bs, cols * bs, scores, {.top_k = 3}, heads);
  for (int h = 0; h < heads; ++h)
    for (std::int64_t r = 0; r < rows; ++r) {
      REQUIRE(diag.active(h, r, r));
      REQUIRE(diag.row(h, r).size() == 3);
    }

  // By mass: the fewest tiles, best first, whose scores reach the share; none scored 0.
  for (const double mass : {0.3, 0.75, 0.999}) {
    const BlockPattern p =
        patterns::from_scores(bs, rows * bs, cols * bs, scores, {.mass = mass, .diagonal = false}, heads);
    for (int h = 0; h < heads; ++h)
      for (std::int64_t r = 0; r < rows; ++r) {
        INFO("mass " << mass << ", head " << h << ", row " << r);
        double total = 0, kept_sum = 0;
        float smallest_kept = 2, largest_left = -1;
        for (std::int64_t c = 0; c < cols; ++c) {
          total += score(h, r, c);
          if (p.active(h, r, c)) {
            kept_sum += score(h, r, c);
            smallest_kept = std::min(smallest_kept, score(h, r, c));
          } else {
            largest_left = std::max(largest_left, score(h, r, c));
          }
        }
        REQUIRE(kept_sum >= mass * total * (1 - 1e-6));
        REQUIRE(kept_sum - smallest_kept < mass * total);  // none could go
        REQUIRE(smallest_kept >= largest_left);
        REQUIRE(smallest_kept > 0);
      }
  }
  // A row with nothing attended keeps nothing, or its diagonal.
  std::vector<float> zeros(std::size_t(rows * cols), 0.0f);
  CHECK(patterns::from_scores(bs, rows * bs, cols * bs, zeros, {.mass = 0.9, .diagonal = false}).nnz() == 0);
  CHECK(patterns::from_scores(bs, rows * bs, cols * bs, zeros, {.mass = 0.9}) ==
        patterns::sliding_window(bs, rows * bs, cols * bs, 0, 0));
  // Scores that may be negative (pooled q . k) with top_k.
  std::vector<float> logits(std::size_t(rows * cols));
  for (std::int64_t i = 0; i < rows * cols; ++i) logits[std::size_t(i)] = -float(i % cols);  // column 0 best
  CHECK(patterns::from_scores(bs, rows * bs, cols * bs, logits, {.top_k = 2, .diagonal = false}) ==
        patterns::from_predicate(bs, rows * bs, cols * bs, [](int, std::int64_t, std::int64_t c) { return c < 2; }));
}

TEST_CASE("from_scores refuses bad scores and selections, naming them", "[pattern]") {
  std::vector<float> scores(4 * 4, 1.0f);
  CHECK_THROWS_WITH(patterns::from_scores(16, 64, 64, std::span<const float>(scores).first(15), {.top_k = 2}),
                    Contains("15 scores for 1 head(s) of 4 x 4 blocks: give 16"));
  scores[6] = std::nanf("");
  CHECK_THROWS_WITH(patterns::from_scores(16, 64, 64, scores, {.top_k = 2}),
                    Contains("head 0, block row 1, block column 2 is nan"));
  scores[6] = -0.5f;
  CHECK_NOTHROW(patterns::from_scores(16, 64, 64, scores, {.top_k = 2}));
  CHECK_THROWS_WITH(patterns::from_scores(16, 64, 64, scores, {.mass = 0.5}),
                    Contains("is -0.5") && Contains("at least 0 with a mass below 1"));
  scores[6] = 1.0f;
  CHECK_THROWS_WITH(patterns::from_scores(16, 64, 64, scores, {.top_k = -1}), Contains("top_k = -1"));
  CHECK_THROWS_WITH(patterns::from_scores(16, 64, 64, scores, {.mass = 0}), Contains("mass = 0 must be in (0, 1]"));
  CHECK_THROWS_WITH(patterns::from_scores(16, 64, 64, scores, {.mass = 1.5}), Contains("mass = 1.5"));
  CHECK_THROWS_WITH(patterns::from_scores(16, 64, 64, scores, {}), Contains("keep every tile"));
}

// Attention at long sequences (32K to 128K keys) against the float64 reference, forward and backward.
// The reference's cost grows with every (query, key) pair, so it runs on a sample: some query rows
// (o, lse and dQ of each), and some key blocks (dK and dV), with every query row that sees one of
// those key blocks. The GPU computes the whole problem; only what the sample covers is compared.
// What long sequences add over the short problems of the other tests: walks of hundreds of tiles, a
// pattern row or column far longer than the rest (the work order, the backward's last groups), the
// fp32 dQ accumulator's conversion over many groups, and lengths that cut the last block short.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "sparsejit/attention_reference.h"
#include "sparsejit/sparsejit.h"
#include "support/attention_run.h"
#include "support/attention_support.h"
#include "support/test_support.h"

using namespace sjit;
using test::Problem;

namespace {

// The reference on the sample: a problem whose query r is the full problem's query rows[r] (its
// inputs, pattern blocks and causality, through the filter), over every key. Its o, lse and dq are
// exact for those rows; its dk and dv are exact for a key that no query outside the sample sees.
struct SampledReference {
  reference::AttentionOutput out;       // [B, Hq, rows, D] and [B, Hq, rows]
  reference::AttentionGradients grads;  // dq [B, Hq, rows, D]; dk, dv [B, Hkv, Sk, D]
};

std::vector<double> gather_rows(const std::vector<float>& tensor, std::int64_t slices, std::int64_t seq, int d,
                                const std::vector<std::int64_t>& rows) {
  std::vector<double> out;
  out.reserve(std::size_t(slices) * rows.size() * d);
  for (std::int64_t s = 0; s < slices; ++s)
    for (std::int64_t row : rows)
      for (int x = 0; x < d; ++x) out.push_back(tensor[std::size_t((s * seq + row) * d + x)]);
  return out;
}

SampledReference sampled_reference(const Problem& c, const test::Inputs& in, const BlockPattern& pattern,
                                   const std::vector<std::int64_t>& rows) {
  reference::AttentionProblem full =
      test::reference_problem(c.spec, c.batch, c.heads_q, c.heads_kv, c.seq_q, c.seq_k, nullptr);
  reference::AttentionProblem p = full;
  p.seq_q = std::int64_t(rows.size());
  p.causal = false;  // the filter applies the full problem's causality to the full problem's rows
  // The pattern as a block mask: the reference asks about every (row, key) pair, hundreds of millions
  // here, which the pattern's own lookup (a binary search a call) would make the test's longest part.
  const std::vector<std::uint8_t> mask = pattern.to_block_mask();
  const std::int64_t bs = pattern.block_size(), block_rows = pattern.block_rows(), block_cols = pattern.block_cols();
  const bool shared = pattern.heads() == 1;
  p.filter = [&, full](std::int64_t head, std::int64_t i, std::int64_t j) {
    const std::int64_t row = rows[std::size_t(i)];
    return mask[std::size_t(((shared ? 0 : head) * block_rows + row / bs) * block_cols + j / bs)] != 0 &&
           reference::attention_allows(full, head, row, j);
  };
  const int d = c.spec.head_dim;
  const std::vector<double> q = gather_rows(in.q, c.batch * c.heads_q, c.seq_q, d, rows);
  const std::vector<double> d_o = gather_rows(in.d_o, c.batch * c.heads_q, c.seq_q, d, rows);
  const std::vector<double> k = test::wide(in.k), v = test::wide(in.v);
  return {reference::attention_forward(p, q, k, v), reference::attention_backward(p, q, k, v, d_o)};
}

// The sample's rows: a few of each listed query block (its first two, middle and last rows, and two at
// random), then every row of each query block that sees one of the sample's key blocks in any head.
std::vector<std::int64_t> sample_rows(const Problem& c, const BlockPattern& pattern,
                                      const std::vector<std::int64_t>& query_blocks,
                                      const std::vector<std::int64_t>& key_blocks, std::mt19937_64& rng) {
  const std::int64_t bs = pattern.block_size();
  std::set<std::int64_t> rows;
  auto add_block_rows = [&](std::int64_t block, bool all) {
    const std::int64_t first = block * bs, last = std::min(first + bs, c.seq_q) - 1;
    if (all) {
      for (std::int64_t r = first; r <= last; ++r) rows.insert(r);
      return;
    }
    for (std::int64_t r : {first, first + 1, (first + last) / 2, last}) rows.insert(std::min(r, last));
    for (int n = 0; n < 2; ++n) rows.insert(first + std::int64_t(rng() % std::uint64_t(last - first + 1)));
  };
  for (std::int64_t block : query_blocks) add_block_rows(block, false);
  const BlockPattern by_key = pattern.transposed();
  for (int h = 0; h < pattern.heads(); ++h)
    for (std::int64_t key_block : key_blocks)
      for (std::int32_t query_block : by_key.row(h, key_block)) add_block_rows(query_block, true);
  return {rows.begin(), rows.end()};
}

// Each (index, want) pair within the tests' tolerance (test::gradient_close), scaled by the largest
// |want| compared.
void expect_gradient_close(const Problem& c, const char* what, const std::vector<float>& got,
                           const std::vector<std::pair<std::size_t, double>>& pairs) {
  double largest = 0;
  for (const auto& [index, want] : pairs) largest = std::max(largest, std::abs(want));
  for (const auto& [index, want] : pairs)
    if (!test::gradient_close(c.spec.dtype, got[index], want, largest))
      FAIL(fmt::format("{}: {}[{}] = {:.6g}, want {:.6g} (largest compared {:.4g})", c.name(), what, index, got[index],
                       want, largest));
}

// The problem on the GPU, compared on a sample: a few rows of each of `query_blocks` (o, lse, dq), and
// the key blocks `key_blocks` of every K/V head (dk, dv).
void check_long_problem(const Problem& c, const BlockPattern& pattern, const std::vector<std::int64_t>& query_blocks,
                        const std::vector<std::int64_t>& key_blocks, std::mt19937_64& rng) {
  INFO(c.name());
  const test::Inputs in = test::random_inputs(c, rng);
  const std::vector<std::int64_t> rows = sample_rows(c, pattern, query_blocks, key_blocks, rng);
  CAPTURE(rows.size());
  const SampledReference want = sampled_reference(c, in, pattern, rows);

  Attention attention(c.spec);
  test::GpuRun run(c, in, &pattern);
  run.o.fill_bytes(0xFF);  // NaN: a row the forward forgets fails its check
  run.lse.fill_bytes(0xFF);
  run.forward(attention);
  run.backward(attention);
  synchronize();
  const std::vector<float> o = test::download(c.spec.dtype, run.o, run.q_elems);
  std::vector<float> lse(std::size_t(c.batch * c.heads_q * c.seq_q));
  run.lse.download(lse.data(), lse.size() * 4);
  const test::Gradients got = run.gradients();

  const int d = c.spec.head_dim;
  const std::int64_t slices_q = c.batch * c.heads_q, n = std::int64_t(rows.size());
  std::vector<std::pair<std::size_t, double>> dq_pairs;
  for (std::int64_t s = 0; s < slices_q; ++s)
    for (std::int64_t r = 0; r < n; ++r) {
      const std::size_t full_row = std::size_t(s * c.seq_q + rows[std::size_t(r)]), sample_row = std::size_t(s * n + r);
      const double w_lse = want.out.lse[sample_row], g_lse = lse[full_row];
      if (!test::lse_close(g_lse, w_lse))
        FAIL(fmt::format("{}: lse[slice {} row {}] = {:.7g}, want {:.7g}", c.name(), s, rows[r], g_lse, w_lse));
      for (int x = 0; x < d; ++x) {
        const double g = o[full_row * d + x], w = want.out.o[sample_row * d + x];
        if (!test::output_close(c.spec.dtype, g, w))
          FAIL(fmt::format("{}: o[slice {} row {} col {}] = {:.6g}, want {:.6g}", c.name(), s, rows[r], x, g, w));
        dq_pairs.emplace_back(full_row * d + x, want.grads.dq[sample_row * d + x]);
      }
    }
  expect_gradient_close(c, "dq", got.dq, dq_pairs);
  // dK and dV of the sampled key blocks: every query that sees them is in the sample.
  const std::int64_t bs = pattern.block_size();
  std::vector<std::pair<std::size_t, double>> dk_pairs, dv_pairs;
  for (std::int64_t s = 0; s < c.batch * c.heads_kv; ++s)
    for (std::int64_t block : key_blocks)
      for (std::int64_t j = block * bs; j < std::min((block + 1) * bs, c.seq_k); ++j)
        for (int x = 0; x < d; ++x) {
          const std::size_t i = std::size_t((s * c.seq_k + j) * d + x);
          dk_pairs.emplace_back(i, want.grads.dk[i]);
          dv_pairs.emplace_back(i, want.grads.dv[i]);
        }
  expect_gradient_close(c, "dk", got.dk, dk_pairs);
  expect_gradient_close(c, "dv", got.dv, dv_pairs);
  SUCCEED();
}

// A random pattern with blocks forced on: every `every`-th key block of some block rows of head 0, and
// whole key block columns of the last head.
BlockPattern with_blocks(const BlockPattern& base, const std::vector<std::int64_t>& rows_of_head0, int every,
                         const std::vector<std::int64_t>& columns_of_last_head) {
  std::vector<std::uint8_t> mask = base.to_block_mask();
  const std::int64_t rows = base.block_rows(), cols = base.block_cols();
  for (std::int64_t r : rows_of_head0)
    for (std::int64_t col = 0; col < cols; col += every) mask[std::size_t(r * cols + col)] = 1;
  const std::int64_t last = base.heads() - 1;
  for (std::int64_t col : columns_of_last_head)
    for (std::int64_t r = 0; r < rows; ++r) mask[std::size_t((last * rows + r) * cols + col)] = 1;
  return BlockPattern::from_block_mask(base.block_size(), base.heads(), rows, cols, mask);
}

// A key block to compare dK and dV on: the first active block of head 0's block row `row` that `keep`
// accepts (the cases keep the row's diagonal block, always active). A block that a heavy row or a full
// column sees would bring thousands of rows of hundreds of key blocks into the reference.
template <class Keep>
std::int64_t key_block_of_row(const BlockPattern& pattern, std::int64_t row, Keep keep) {
  for (std::int32_t col : pattern.row(0, row))
    if (keep(col)) return col;
  FAIL("no key block to sample in block row " << row);
  return 0;
}

}  // namespace

// The reference's cost is every sampled row times every key: each case samples one or two key blocks,
// whose columns hold a few query blocks, so that it runs in seconds.

// 32K queries and keys, a pattern a head (2 query heads on one K/V head): about 5 random key blocks a
// row, one block row of head 0 that sees every fourth key block (64 of 256), and one key block of head
// 1 that every query sees (its dK/dV walk is 1024 steps of 64 queries; it adds to every row's dQ).
TEST_CASE("long sequences: 32K keys, a pattern per head with a heavy row and a full column",
          "[gpu][attention][backward][long]") {
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  const Problem c{test::spec_of(128, DType::bf16, Causal::none, Sparsity::block_sparse, 128), 1, 2, 1, 32768, 32768,
                  0.02, true};
  const std::int64_t heavy_row = 100, full_column = 7;
  const BlockPattern pattern =
      with_blocks(patterns::random(128, c.seq_q, c.seq_k, c.density, rng(), 2), {heavy_row}, 4, {full_column});
  const std::int64_t key_block =
      key_block_of_row(pattern, 177, [&](std::int64_t col) { return col % 4 != 0 && col != full_column; });
  check_long_problem(c, pattern, {0, heavy_row, 177, 255}, {key_block}, rng);
}

// Causal at an odd length (the last block of 64 holds 27 rows), one pattern for every head, 4 query
// heads on 2 K/V heads, the deterministic backward (the dQ pass), f16, d = 64.
TEST_CASE("long sequences: 32K causal, odd length, blocks of 64, deterministic", "[gpu][attention][backward][long]") {
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  Problem c{test::spec_of(64, DType::f16, Causal::top_left, Sparsity::block_sparse, 64), 1, 4, 2, 32731, 32731, 0.01};
  c.spec.deterministic = true;
  const BlockPattern pattern = patterns::random(64, c.seq_q, c.seq_k, c.density, rng());
  const std::int64_t last = pattern.block_rows() - 1;
  const std::int64_t key_block = key_block_of_row(pattern, 300, [](std::int64_t col) { return col <= 300; });
  check_long_problem(c, pattern, {0, 1, 300, last}, {key_block, last}, rng);
}

// A long key cache: 4101 queries on 128K keys, causal from the bottom right (the last query sees every
// key), about 5 random key blocks a row, and two block rows that see every eighth key block: walks of
// 128 key tiles.
TEST_CASE("long sequences: 4K queries on 128K keys, causal bottom-right", "[gpu][attention][backward][long]") {
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  const Problem c{test::spec_of(128, DType::bf16, Causal::bottom_right, Sparsity::block_sparse, 128), 1, 2, 1, 4101,
                  131072, 0.005};
  const BlockPattern pattern = with_blocks(patterns::random(128, c.seq_q, c.seq_k, c.density, rng()), {5, 32}, 8, {});
  const std::int64_t key_block = key_block_of_row(pattern, 21, [](std::int64_t col) { return col % 8 != 0; });
  check_long_problem(c, pattern, {0, 5, 21, 32}, {key_block}, rng);
}

// attention_block_mass against the float64 reference's probabilities summed over every tile of blocks:
// GQA, odd lengths, causal, strided queries, and more query blocks than head_dim (several chunks).
#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "sparsejit/attention_mass.h"
#include "sparsejit/attention_reference.h"
#include "sparsejit/dtype.h"
#include "sparsejit/sparsejit.h"
#include "support/attention_support.h"
#include "support/test_support.h"

using namespace sjit;

namespace {

struct MassCase {
  AttentionSpec spec;
  std::int64_t batch, heads_q, heads_kv, seq_q, seq_k;
  int block;
  bool bshd_queries;  // q laid out [B, S, H, D]
};

// Values rounded to the spec's dtype, as the GPU sees them.
std::vector<float> rounded(DType dtype, std::vector<float> values) {
  std::vector<unsigned char> bytes(values.size() * size_of(dtype));
  encode(dtype, values, bytes.data());
  decode(dtype, bytes.data(), values);
  return values;
}

void expect_mass_matches(const MassCase& c, std::mt19937_64& rng) {
  const std::int64_t d = c.spec.head_dim;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> q(std::size_t(c.batch * c.heads_q * c.seq_q * d)), k(std::size_t(c.batch * c.heads_kv * c.seq_k * d));
  for (auto& x : q) x = normal(rng);
  for (auto& x : k) x = normal(rng);
  q = rounded(c.spec.dtype, q), k = rounded(c.spec.dtype, k);
  // The GPU's q in its layout; the reference's in [B, H, S, D].
  std::vector<float> q_gpu = q;
  if (c.bshd_queries)
    for (std::int64_t b = 0; b < c.batch; ++b)
      for (std::int64_t h = 0; h < c.heads_q; ++h)
        for (std::int64_t i = 0; i < c.seq_q; ++i)
          for (std::int64_t e = 0; e < d; ++e)
            q_gpu[std::size_t(((b * c.seq_q + i) * c.heads_q + h) * d + e)] = q[std::size_t(((b * c.heads_q + h) * c.seq_q + i) * d + e)];
  const DeviceBuffer q_dev = test::upload(c.spec.dtype, q_gpu), k_dev = test::upload(c.spec.dtype, k);
  AttentionForwardArgs args;
  args.q = q_dev.data(), args.k = k_dev.data();
  args.batch = c.batch, args.heads_q = c.heads_q, args.heads_kv = c.heads_kv, args.seq_q = c.seq_q, args.seq_k = c.seq_k;
  if (c.bshd_queries) args.q_strides = Strides::bshd(c.heads_q, c.seq_q, d);
  const std::vector<float> got = attention_block_mass(c.spec, args, c.block);

  // The reference: P from its lse, summed over each tile and the batch.
  const reference::AttentionProblem p =
      test::reference_problem(c.spec, c.batch, c.heads_q, c.heads_kv, c.seq_q, c.seq_k, nullptr);
  const std::vector<double> qd(q.begin(), q.end()), kd(k.begin(), k.end()), vd(kd);
  const reference::AttentionOutput out = reference::attention_forward(p, qd, kd, vd);
  const std::int64_t rows = (c.seq_q + c.block - 1) / c.block, cols = (c.seq_k + c.block - 1) / c.block;
  REQUIRE(got.size() == std::size_t(c.heads_q * rows * cols));
  std::vector<double> want(got.size(), 0.0), row_sum(std::size_t(c.heads_q * rows), 0.0);
  const double scale = 1.0 / std::sqrt(double(d));
  const std::int64_t group = c.heads_q / c.heads_kv;
  for (std::int64_t b = 0; b < c.batch; ++b)
    for (std::int64_t h = 0; h < c.heads_q; ++h)
      for (std::int64_t i = 0; i < c.seq_q; ++i) {
        const double lse = out.lse[std::size_t((b * c.heads_q + h) * c.seq_q + i)];
        if (std::isinf(lse)) continue;  // a row that sees no key holds no mass
        row_sum[std::size_t(h * rows + i / c.block)] += 1;
        const double* qi = qd.data() + ((b * c.heads_q + h) * c.seq_q + i) * d;
        for (std::int64_t j = 0; j < c.seq_k; ++j) {
          if (!reference::attention_allows(p, h, i, j)) continue;
          const double* kj = kd.data() + ((b * c.heads_kv + h / group) * c.seq_k + j) * d;
          double s = 0;
          for (std::int64_t e = 0; e < d; ++e) s += qi[e] * kj[e];
          want[std::size_t((h * rows + i / c.block) * cols + j / c.block)] += std::exp(scale * s - lse);
        }
      }
  for (std::int64_t h = 0; h < c.heads_q; ++h)
    for (std::int64_t r = 0; r < rows; ++r) {
      double sum = 0;
      for (std::int64_t col = 0; col < cols; ++col) {
        const std::size_t t = std::size_t((h * rows + r) * cols + col);
        INFO("query head " << h << ", tile (" << r << ", " << col << "): got " << got[t] << ", want " << want[t]);
        REQUIRE(std::abs(got[t] - want[t]) <= 5e-3 * want[t] + 1e-4);
        sum += got[t];
      }
      // Each query row that sees a key spreads a mass of 1 over its keys.
      REQUIRE(std::abs(sum - row_sum[std::size_t(h * rows + r)]) <= 5e-3 * row_sum[std::size_t(h * rows + r)] + 1e-4);
    }
}

}  // namespace

TEST_CASE("attention_block_mass sums the softmax probabilities of every tile, as the reference does",
          "[gpu][attention]") {
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  SECTION("GQA, odd lengths, 69 query blocks of 16 over two chunks of head_dim 64") {
    expect_mass_matches({test::spec_of(64, DType::bf16, Causal::none), 1, 4, 2, 1100, 700, 16, false}, rng);
  }
  SECTION("causal bottom-right with more queries than keys (rows that see nothing), queries [B, S, H, D], f16") {
    expect_mass_matches({test::spec_of(128, DType::f16, Causal::bottom_right), 2, 2, 2, 300, 260, 32, true}, rng);
  }
}

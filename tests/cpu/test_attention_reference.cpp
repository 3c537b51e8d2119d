// Property tests of the float64 attention reference (sparsejit/attention_reference.h). Expectations come
// from an independent naive computation in this file (explicit score matrix, exp without max-subtraction,
// normalize), from finite differences of that naive forward, or from properties of softmax attention,
// never from the code under test. Inputs are drawn from a seeded std::mt19937_64; the seed is printed
// on failure.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "sparsejit/attention_reference.h"
#include "sparsejit/error.h"
#include "reference/attention_reference_fp32.h"
#include "support/test_support.h"

namespace {

namespace ref = sjit::reference;
using ref::AttentionProblem;
using Tensor = std::vector<double>;
using Catch::Matchers::Contains;

constexpr double kInf = std::numeric_limits<double>::infinity();

enum class Causal { none, top_left, bottom_right };

const char* causal_name(Causal causal) {
  switch (causal) {
    case Causal::none: return "not causal";
    case Causal::top_left: return "causal top-left";
    case Causal::bottom_right: return "causal bottom-right";
  }
  return "?";
}

// Depends on the query head, and empties some rows once causality leaves few keys.
bool striped_filter(std::int64_t head, std::int64_t i, std::int64_t j) { return (head + i + 2 * j) % 3 != 0; }

AttentionProblem make_problem(std::int64_t batch, std::int64_t heads_q, std::int64_t heads_kv, std::int64_t seq_q,
                              std::int64_t seq_k, std::int64_t head_dim, Causal causal, bool with_filter) {
  AttentionProblem p;
  p.batch = batch;
  p.heads_q = heads_q;
  p.heads_kv = heads_kv;
  p.seq_q = seq_q;
  p.seq_k = seq_k;
  p.head_dim = head_dim;
  p.causal = causal != Causal::none;
  p.causal_bottom_right = causal == Causal::bottom_right;
  if (with_filter) p.filter = striped_filter;
  return p;
}

std::size_t q_size(const AttentionProblem& p) { return p.batch * p.heads_q * p.seq_q * p.head_dim; }
std::size_t kv_size(const AttentionProblem& p) { return p.batch * p.heads_kv * p.seq_k * p.head_dim; }

// Element (b, h, s, d) of a contiguous [batch, heads, seq, head_dim] tensor.
std::size_t at(const AttentionProblem& p, std::int64_t heads, std::int64_t seq, std::int64_t b, std::int64_t h,
               std::int64_t s, std::int64_t d) {
  return ((b * heads + h) * seq + s) * p.head_dim + d;
}

Tensor random_tensor(std::mt19937_64& rng, std::size_t n, double scale = 1.0) {
  std::uniform_real_distribution<double> unit(-1.0, 1.0);
  Tensor t(n);
  for (double& x : t) x = scale * unit(rng);
  return t;
}

struct Inputs {
  Tensor q, k, v;
};

Inputs random_inputs(std::mt19937_64& rng, const AttentionProblem& p) {
  return {random_tensor(rng, q_size(p)), random_tensor(rng, kv_size(p)), random_tensor(rng, kv_size(p))};
}

// The mask, written independently of the reference: bottom-right alignment as "at least as many keys
// after j as queries after i".
bool naive_visible(const AttentionProblem& p, std::int64_t head, std::int64_t i, std::int64_t j) {
  if (p.causal && !p.causal_bottom_right && i - j < 0) return false;
  if (p.causal && p.causal_bottom_right && p.seq_k - j < p.seq_q - i) return false;
  return !p.filter || p.filter(head, i, j);
}

// Plain softmax attention on an explicit score matrix: S = scale Q K^T per (batch, head), E = exp(S) on
// visible entries (no max-subtraction: the inputs here are small), P = E / rowsum(E), O = P V,
// lse = log(rowsum(E)). A row with nothing visible gets o = 0 and lse = -inf.
ref::AttentionOutput naive_forward(const AttentionProblem& p, const Tensor& q, const Tensor& k, const Tensor& v) {
  const double scale = p.scale != 0.0 ? p.scale : 1.0 / std::sqrt(static_cast<double>(p.head_dim));
  const std::int64_t group = p.heads_q / p.heads_kv;
  ref::AttentionOutput out{Tensor(q_size(p), 0.0), Tensor(p.batch * p.heads_q * p.seq_q, -kInf)};
  for (std::int64_t b = 0; b < p.batch; ++b) {
    for (std::int64_t h = 0; h < p.heads_q; ++h) {
      const std::int64_t g = h / group;
      std::vector<Tensor> exp_scores(p.seq_q, Tensor(p.seq_k, 0.0));
      for (std::int64_t i = 0; i < p.seq_q; ++i) {
        for (std::int64_t j = 0; j < p.seq_k; ++j) {
          if (!naive_visible(p, h, i, j)) continue;
          double s = 0.0;
          for (std::int64_t d = 0; d < p.head_dim; ++d) {
            s += q[at(p, p.heads_q, p.seq_q, b, h, i, d)] * k[at(p, p.heads_kv, p.seq_k, b, g, j, d)];
          }
          exp_scores[i][j] = std::exp(scale * s);
        }
      }
      for (std::int64_t i = 0; i < p.seq_q; ++i) {
        double row_sum = 0.0;
        for (double e : exp_scores[i]) row_sum += e;
        if (row_sum == 0.0) continue;
        out.lse[(b * p.heads_q + h) * p.seq_q + i] = std::log(row_sum);
        for (std::int64_t d = 0; d < p.head_dim; ++d) {
          double o = 0.0;
          for (std::int64_t j = 0; j < p.seq_k; ++j) o += exp_scores[i][j] / row_sum * v[at(p, p.heads_kv, p.seq_k, b, g, j, d)];
          out.o[at(p, p.heads_q, p.seq_q, b, h, i, d)] = o;
        }
      }
    }
  }
  return out;
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i] == b[i]) continue;  // covers matching infinities
    worst = std::max(worst, std::abs(a[i] - b[i]));
  }
  return worst;
}

double max_abs(const Tensor& a) {
  double worst = 0.0;
  for (double x : a) worst = std::max(worst, std::abs(x));
  return worst;
}

bool any_nan(const Tensor& t) { return std::any_of(t.begin(), t.end(), [](double x) { return std::isnan(x); }); }
bool all_zero(const Tensor& t) { return std::all_of(t.begin(), t.end(), [](double x) { return x == 0.0; }); }

// P of every row, read off the output: with head_dim = seq_k and v_j the j-th unit vector, o_i = P_i.
// Returns o = P as [batch, heads_q, seq_q, seq_k], and lse.
ref::AttentionOutput probabilities_via_unit_values(const AttentionProblem& p, const Tensor& q, const Tensor& k) {
  REQUIRE(p.head_dim == p.seq_k);
  Tensor v(kv_size(p), 0.0);
  for (std::int64_t b = 0; b < p.batch; ++b) {
    for (std::int64_t g = 0; g < p.heads_kv; ++g) {
      for (std::int64_t j = 0; j < p.seq_k; ++j) v[at(p, p.heads_kv, p.seq_k, b, g, j, j)] = 1.0;
    }
  }
  return ref::attention_forward(p, q, k, v);
}

// Checks that P is a distribution over exactly the visible keys of every row that has any, and all
// zero (with lse = -inf) on rows that have none.
void check_probabilities(const AttentionProblem& p, const Tensor& q, const Tensor& k) {
  const auto [probs, lse] = probabilities_via_unit_values(p, q, k);
  for (std::int64_t b = 0; b < p.batch; ++b) {
    for (std::int64_t h = 0; h < p.heads_q; ++h) {
      for (std::int64_t i = 0; i < p.seq_q; ++i) {
        CAPTURE(b, h, i);
        double row_sum = 0.0;
        std::int64_t visible = 0;
        for (std::int64_t j = 0; j < p.seq_k; ++j) {
          CAPTURE(j);
          const double pij = probs[at(p, p.heads_q, p.seq_q, b, h, i, j)];
          if (naive_visible(p, h, i, j)) {
            CHECK(pij > 0.0);  // scores are O(1): no weight underflows
            ++visible;
          } else {
            CHECK(pij == 0.0);
          }
          row_sum += pij;
        }
        const double row_lse = lse[(b * p.heads_q + h) * p.seq_q + i];
        if (visible > 0) {
          CHECK(std::abs(row_sum - 1.0) < 1e-14);
          CHECK(std::isfinite(row_lse));
        } else {
          CHECK(row_sum == 0.0);
          CHECK(row_lse == -kInf);
        }
      }
    }
  }
}

std::vector<Causal> every_causal_mode() { return {Causal::none, Causal::top_left, Causal::bottom_right}; }

}  // namespace

TEST_CASE("attention forward equals a naive score-matrix computation", "[attention][reference]") {
  const std::uint64_t seed = sjit::test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  for (auto [seq_q, seq_k] : {std::pair{6, 11}, std::pair{11, 6}, std::pair{7, 7}}) {
    for (Causal causal : every_causal_mode()) {
      for (bool with_filter : {false, true}) {
        INFO(causal_name(causal) << (with_filter ? ", filtered" : "") << ", seq_q=" << seq_q << ", seq_k=" << seq_k);
        const AttentionProblem p = make_problem(2, 4, 2, seq_q, seq_k, 5, causal, with_filter);
        const Inputs in = random_inputs(rng, p);
        const ref::AttentionOutput got = ref::attention_forward(p, in.q, in.k, in.v);
        const ref::AttentionOutput want = naive_forward(p, in.q, in.k, in.v);
        CHECK(max_abs_diff(got.o, want.o) < 1e-13);
        CHECK(max_abs_diff(got.lse, want.lse) < 1e-13);
        for (std::size_t r = 0; r < got.lse.size(); ++r) CHECK((got.lse[r] == -kInf) == (want.lse[r] == -kInf));
      }
    }
  }
}

TEST_CASE("an explicit scale replaces 1/sqrt(head_dim)", "[attention][reference]") {
  const std::uint64_t seed = sjit::test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  AttentionProblem p = make_problem(1, 2, 2, 4, 6, 3, Causal::none, false);
  p.scale = 0.37;
  const Inputs in = random_inputs(rng, p);
  const ref::AttentionOutput got = ref::attention_forward(p, in.q, in.k, in.v);
  CHECK(max_abs_diff(got.o, naive_forward(p, in.q, in.k, in.v).o) < 1e-13);
  p.scale = 0.0;  // the default 1/sqrt(3) gives a different answer
  CHECK(max_abs_diff(got.o, ref::attention_forward(p, in.q, in.k, in.v).o) > 1e-6);
}

TEST_CASE("softmax weights are a distribution over exactly the allowed keys", "[attention][reference]") {
  const std::uint64_t seed = sjit::test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  for (Causal causal : every_causal_mode()) {
    for (bool with_filter : {false, true}) {
      INFO(causal_name(causal) << (with_filter ? ", filtered" : ""));
      const AttentionProblem p = make_problem(2, 2, 1, 6, 8, 8, causal, with_filter);  // head_dim = seq_k
      const Inputs in = random_inputs(rng, p);
      check_probabilities(p, in.q, in.k);
    }
  }
}

TEST_CASE("each output coordinate lies between the min and max of the allowed value rows", "[attention][reference]") {
  const std::uint64_t seed = sjit::test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  for (Causal causal : every_causal_mode()) {
    for (bool with_filter : {false, true}) {
      INFO(causal_name(causal) << (with_filter ? ", filtered" : ""));
      const AttentionProblem p = make_problem(2, 4, 2, 9, 7, 6, causal, with_filter);
      Inputs in = random_inputs(rng, p);
      in.q = random_tensor(rng, q_size(p), 4.0);  // peaked rows push o towards the hull's corners
      const Tensor o = ref::attention_forward(p, in.q, in.k, in.v).o;
      for (std::int64_t b = 0; b < p.batch; ++b) {
        for (std::int64_t h = 0; h < p.heads_q; ++h) {
          const std::int64_t g = h / (p.heads_q / p.heads_kv);
          for (std::int64_t i = 0; i < p.seq_q; ++i) {
            for (std::int64_t d = 0; d < p.head_dim; ++d) {
              double lo = kInf, hi = -kInf;
              for (std::int64_t j = 0; j < p.seq_k; ++j) {
                if (!naive_visible(p, h, i, j)) continue;
                lo = std::min(lo, in.v[at(p, p.heads_kv, p.seq_k, b, g, j, d)]);
                hi = std::max(hi, in.v[at(p, p.heads_kv, p.seq_k, b, g, j, d)]);
              }
              const double oid = o[at(p, p.heads_q, p.seq_q, b, h, i, d)];
              CAPTURE(b, h, i, d, oid, lo, hi);
              if (lo == kInf) {
                CHECK(oid == 0.0);  // no allowed key
              } else {
                CHECK(oid >= lo - 1e-15);
                CHECK(oid <= hi + 1e-15);
              }
            }
          }
        }
      }
    }
  }
}

TEST_CASE("causal alignment: top-left vs bottom-right when seq_q != seq_k", "[attention][reference]") {
  const std::uint64_t seed = sjit::test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);

  SECTION("5 queries, 9 keys: top-left sees keys 0..i, bottom-right 0..i+4") {
    for (Causal causal : {Causal::top_left, Causal::bottom_right}) {
      INFO(causal_name(causal));
      const AttentionProblem p = make_problem(1, 2, 1, 5, 9, 9, causal, false);
      const Inputs in = random_inputs(rng, p);
      const Tensor probs = probabilities_via_unit_values(p, in.q, in.k).o;
      const std::int64_t offset = causal == Causal::bottom_right ? 4 : 0;
      for (std::int64_t h = 0; h < p.heads_q; ++h) {
        for (std::int64_t i = 0; i < p.seq_q; ++i) {
          for (std::int64_t j = 0; j < p.seq_k; ++j) {
            CAPTURE(h, i, j);
            CHECK((probs[at(p, p.heads_q, p.seq_q, 0, h, i, j)] > 0.0) == (j <= i + offset));
          }
        }
      }
      // Top-left: keys 5..8 are seen by no query, so they get no gradient at all.
      const ref::AttentionGradients grads =
          ref::attention_backward(p, in.q, in.k, in.v, random_tensor(rng, q_size(p)));
      for (std::int64_t j = 0; j < p.seq_k; ++j) {
        double dk_max = 0.0, dv_max = 0.0;
        for (std::int64_t d = 0; d < p.head_dim; ++d) {
          dk_max = std::max(dk_max, std::abs(grads.dk[at(p, 1, p.seq_k, 0, 0, j, d)]));
          dv_max = std::max(dv_max, std::abs(grads.dv[at(p, 1, p.seq_k, 0, 0, j, d)]));
        }
        CAPTURE(j);
        if (causal == Causal::top_left && j >= 5) {
          CHECK(dk_max == 0.0);
          CHECK(dv_max == 0.0);
        } else {
          CHECK(dv_max > 0.0);
        }
      }
    }
  }

  SECTION("9 queries, 5 keys: bottom-right rows 0..3 see no key") {
    const AttentionProblem top_left = make_problem(2, 2, 1, 9, 5, 5, Causal::top_left, false);
    const Inputs in = random_inputs(rng, top_left);
    // Top-left: row i sees keys 0..min(i, 4), so every row has a key.
    const Tensor probs = probabilities_via_unit_values(top_left, in.q, in.k).o;
    for (std::int64_t i = 0; i < 9; ++i) {
      for (std::int64_t j = 0; j < 5; ++j) {
        CAPTURE(i, j);
        CHECK((probs[at(top_left, 2, 9, 1, 1, i, j)] > 0.0) == (j <= i));
      }
    }

    const AttentionProblem p = make_problem(2, 2, 1, 9, 5, 5, Causal::bottom_right, false);
    check_probabilities(p, in.q, in.k);  // rows 4..8 see keys 0..i-4
    const ref::AttentionOutput out = ref::attention_forward(p, in.q, in.k, in.v);
    Tensor d_o = random_tensor(rng, q_size(p));
    const ref::AttentionGradients grads = ref::attention_backward(p, in.q, in.k, in.v, d_o);
    CHECK_FALSE(any_nan(out.o));
    CHECK_FALSE(any_nan(grads.dq));
    CHECK_FALSE(any_nan(grads.dk));
    CHECK_FALSE(any_nan(grads.dv));
    for (std::int64_t b = 0; b < p.batch; ++b) {
      for (std::int64_t h = 0; h < p.heads_q; ++h) {
        for (std::int64_t i = 0; i < p.seq_q; ++i) {
          CAPTURE(b, h, i);
          const bool empty = i < 4;
          CHECK((out.lse[(b * p.heads_q + h) * p.seq_q + i] == -kInf) == empty);
          for (std::int64_t d = 0; d < p.head_dim; ++d) {
            if (!empty) continue;
            CHECK(out.o[at(p, p.heads_q, p.seq_q, b, h, i, d)] == 0.0);
            CHECK(grads.dq[at(p, p.heads_q, p.seq_q, b, h, i, d)] == 0.0);
            d_o[at(p, p.heads_q, p.seq_q, b, h, i, d)] += 10.0;  // an empty row's d_o must not matter
          }
        }
      }
    }
    const ref::AttentionGradients moved = ref::attention_backward(p, in.q, in.k, in.v, d_o);
    CHECK(moved.dq == grads.dq);
    CHECK(moved.dk == grads.dk);
    CHECK(moved.dv == grads.dv);
  }
}

TEST_CASE("grouped-query attention equals each query head run against its kv head", "[attention][reference]") {
  const std::uint64_t seed = sjit::test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  for (auto [heads_q, heads_kv] : {std::pair{4, 2}, std::pair{3, 1}}) {
    for (Causal causal : every_causal_mode()) {
      INFO(heads_q << " query heads, " << heads_kv << " kv heads, " << causal_name(causal));
      const AttentionProblem p = make_problem(2, heads_q, heads_kv, 6, 8, 4, causal, true);
      const Inputs in = random_inputs(rng, p);
      const Tensor d_o = random_tensor(rng, q_size(p));
      const ref::AttentionOutput out = ref::attention_forward(p, in.q, in.k, in.v);
      const ref::AttentionGradients grads = ref::attention_backward(p, in.q, in.k, in.v, d_o);

      Tensor dk_sum(kv_size(p), 0.0), dv_sum(kv_size(p), 0.0);
      const std::size_t q_head = p.seq_q * p.head_dim, kv_head = p.seq_k * p.head_dim;
      for (std::int64_t b = 0; b < p.batch; ++b) {
        for (std::int64_t h = 0; h < p.heads_q; ++h) {
          CAPTURE(b, h);
          const std::int64_t g = h / (heads_q / heads_kv);
          AttentionProblem single = make_problem(1, 1, 1, p.seq_q, p.seq_k, p.head_dim, causal, false);
          single.filter = [h](std::int64_t, std::int64_t i, std::int64_t j) { return striped_filter(h, i, j); };
          auto slice = [](const Tensor& t, std::size_t start, std::size_t n) {
            return Tensor(t.begin() + start, t.begin() + start + n);
          };
          const std::size_t q_start = at(p, p.heads_q, p.seq_q, b, h, 0, 0);
          const std::size_t kv_start = at(p, p.heads_kv, p.seq_k, b, g, 0, 0);
          const Tensor q1 = slice(in.q, q_start, q_head), k1 = slice(in.k, kv_start, kv_head),
                       v1 = slice(in.v, kv_start, kv_head), do1 = slice(d_o, q_start, q_head);
          const ref::AttentionOutput out1 = ref::attention_forward(single, q1, k1, v1);
          const ref::AttentionGradients grads1 = ref::attention_backward(single, q1, k1, v1, do1);
          CHECK(max_abs_diff(out1.o, slice(out.o, q_start, q_head)) < 1e-15);
          CHECK(max_abs_diff(out1.lse, slice(out.lse, (b * p.heads_q + h) * p.seq_q, p.seq_q)) < 1e-15);
          CHECK(max_abs_diff(grads1.dq, slice(grads.dq, q_start, q_head)) < 1e-15);
          for (std::size_t e = 0; e < kv_head; ++e) {
            dk_sum[kv_start + e] += grads1.dk[e];
            dv_sum[kv_start + e] += grads1.dv[e];
          }
        }
      }
      CHECK(max_abs(grads.dk) > 0.0);
      CHECK(max_abs_diff(grads.dk, dk_sum) < 1e-14);
      CHECK(max_abs_diff(grads.dv, dv_sum) < 1e-14);
    }
  }
}

TEST_CASE("rows with no key give o = 0, lse = -inf and zero gradients", "[attention][reference]") {
  const std::uint64_t seed = sjit::test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);

  SECTION("a filter that removes every key") {
    for (Causal causal : every_causal_mode()) {
      INFO(causal_name(causal));
      AttentionProblem p = make_problem(2, 4, 2, 5, 7, 3, causal, false);
      p.filter = [](std::int64_t, std::int64_t, std::int64_t) { return false; };
      const Inputs in = random_inputs(rng, p);
      const ref::AttentionOutput out = ref::attention_forward(p, in.q, in.k, in.v);
      const ref::AttentionGradients grads = ref::attention_backward(p, in.q, in.k, in.v, random_tensor(rng, q_size(p)));
      CHECK(out.o.size() == q_size(p));
      CHECK(all_zero(out.o));
      CHECK(std::all_of(out.lse.begin(), out.lse.end(), [](double x) { return x == -kInf; }));
      CHECK(all_zero(grads.dq));
      CHECK(all_zero(grads.dk));
      CHECK(all_zero(grads.dv));
    }
  }

  SECTION("no keys at all (seq_k = 0)") {
    const AttentionProblem p = make_problem(2, 2, 1, 3, 0, 4, Causal::none, false);
    const Tensor q = random_tensor(rng, q_size(p));
    const ref::AttentionOutput out = ref::attention_forward(p, q, {}, {});
    CHECK(out.o.size() == q_size(p));
    CHECK(all_zero(out.o));
    CHECK(out.lse.size() == 12);
    CHECK(std::all_of(out.lse.begin(), out.lse.end(), [](double x) { return x == -kInf; }));
    const ref::AttentionGradients grads = ref::attention_backward(p, q, {}, {}, random_tensor(rng, q_size(p)));
    CHECK(all_zero(grads.dq));
    CHECK(grads.dk.empty());
  }

  SECTION("no queries (seq_q = 0)") {
    const AttentionProblem p = make_problem(1, 2, 2, 0, 4, 3, Causal::bottom_right, false);
    const Inputs in = random_inputs(rng, p);
    CHECK(ref::attention_forward(p, {}, in.k, in.v).o.empty());
    const ref::AttentionGradients grads = ref::attention_backward(p, {}, in.k, in.v, {});
    CHECK(grads.dk.size() == kv_size(p));
    CHECK(all_zero(grads.dk));
    CHECK(all_zero(grads.dv));
  }
}

TEST_CASE("backward equals central finite differences of sum(o * w)", "[attention][reference]") {
  const std::uint64_t seed = sjit::test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  constexpr double kStep = 1e-6;
  for (std::int64_t batch : {1, 2}) {
    for (Causal causal : every_causal_mode()) {
      for (bool with_filter : {false, true}) {
        INFO("batch=" << batch << ", " << causal_name(causal) << (with_filter ? ", filtered" : ""));
        const AttentionProblem p = make_problem(batch, 2, 1, 5, 7, 4, causal, with_filter);
        Inputs in = random_inputs(rng, p);
        const Tensor w = random_tensor(rng, q_size(p));
        // L = sum(o * w) by the independent naive forward, so dL/do = w.
        auto loss = [&] {
          const Tensor o = naive_forward(p, in.q, in.k, in.v).o;
          double sum = 0.0;
          for (std::size_t e = 0; e < o.size(); ++e) sum += o[e] * w[e];
          return sum;
        };
        auto finite_differences = [&](Tensor& x) {
          Tensor grad(x.size());
          for (std::size_t e = 0; e < x.size(); ++e) {
            const double saved = x[e];
            x[e] = saved + kStep;
            const double up = loss();
            x[e] = saved - kStep;
            const double down = loss();
            x[e] = saved;
            grad[e] = (up - down) / (2.0 * kStep);
          }
          return grad;
        };
        const ref::AttentionGradients grads = ref::attention_backward(p, in.q, in.k, in.v, w);
        const Tensor dq_fd = finite_differences(in.q), dk_fd = finite_differences(in.k), dv_fd = finite_differences(in.v);
        // Relative to the tensor's largest entry: an entry's own size can be ~0 by chance.
        CHECK(max_abs(grads.dq) > 1e-3);
        CHECK(max_abs_diff(grads.dq, dq_fd) / max_abs(grads.dq) < 1e-6);
        CHECK(max_abs_diff(grads.dk, dk_fd) / max_abs(grads.dk) < 1e-6);
        CHECK(max_abs_diff(grads.dv, dv_fd) / max_abs(grads.dv) < 1e-6);
      }
    }
  }
}

// Every element of `fp32` within 1e-3 + 1e-3 |want| of `want` (infinities equal), the cross-validation
// bound of seeds/003 for a reference run in float32.
void check_fp32_close(const char* what, const Tensor& fp32, const Tensor& want) {
  REQUIRE(fp32.size() == want.size());
  for (std::size_t e = 0; e < want.size(); ++e) {
    if (fp32[e] == want[e]) continue;
    if (!(std::abs(fp32[e] - want[e]) <= 1e-3 + 1e-3 * std::abs(want[e])))
      FAIL(what << "[" << e << "] = " << fp32[e] << " in fp32, " << want[e] << " in float64");
  }
}

// The GPU tests check the kernels against the reference run in fp32 as well (issue 6): that run is the
// same code in float (reference/attention_reference_fp32.h), within the seeds' cross-validation bound of
// the float64 one, and it does round (were it the float64 code, every difference would be 0).
TEST_CASE("the reference run in fp32 agrees with the float64 one within 1e-3, and rounds", "[attention][reference]") {
  const std::uint64_t seed = sjit::test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  for (Causal causal : every_causal_mode()) {
    for (bool with_filter : {false, true}) {
      INFO(causal_name(causal) << (with_filter ? ", filtered" : ""));
      const AttentionProblem p = make_problem(2, 4, 2, 67, 131, 64, causal, with_filter);
      // Scores of a few units: softmax weights from near-uniform to peaked.
      const Inputs in{random_tensor(rng, q_size(p), 3.0), random_tensor(rng, kv_size(p), 3.0),
                      random_tensor(rng, kv_size(p))};
      const Tensor d_o = random_tensor(rng, q_size(p));
      const ref::AttentionOutput wide = ref::attention_forward(p, in.q, in.k, in.v);
      const ref::AttentionOutput narrow = ref::attention_forward_fp32(p, in.q, in.k, in.v);
      check_fp32_close("o", narrow.o, wide.o);
      check_fp32_close("lse", narrow.lse, wide.lse);
      const ref::AttentionGradients exact = ref::attention_backward(p, in.q, in.k, in.v, d_o);
      const ref::AttentionGradients fp32 = ref::attention_backward_fp32(p, in.q, in.k, in.v, d_o);
      check_fp32_close("dq", fp32.dq, exact.dq);
      check_fp32_close("dk", fp32.dk, exact.dk);
      check_fp32_close("dv", fp32.dv, exact.dv);
      CHECK(max_abs_diff(narrow.o, wide.o) > 0.0);
      CHECK(max_abs_diff(fp32.dk, exact.dk) > 0.0);
    }
  }
}

TEST_CASE("a per-row shift of every score leaves softmax unchanged and moves lse", "[attention][reference]") {
  // Append one coordinate: q_i' = [q_i, c_i], k_j' = [k_j, 1], so s_ij' = s_ij + scale c_i. Shifts of
  // ~1000 overflow exp() without max-subtraction, so this also checks stability.
  const std::uint64_t seed = sjit::test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  for (Causal causal : every_causal_mode()) {
    INFO(causal_name(causal));
    AttentionProblem p = make_problem(2, 2, 1, 6, 5, 3, causal, true);
    p.scale = 0.5;
    const Inputs in = random_inputs(rng, p);
    const Tensor d_o = random_tensor(rng, q_size(p));
    AttentionProblem wide = p;
    wide.head_dim = p.head_dim + 1;
    const Tensor shifts = random_tensor(rng, p.batch * p.heads_q * p.seq_q, 2000.0);
    auto widen = [&](const Tensor& x, std::int64_t heads, std::int64_t seq, auto last) {
      Tensor out(p.batch * heads * seq * wide.head_dim);
      for (std::int64_t row = 0; row < p.batch * heads * seq; ++row) {
        for (std::int64_t d = 0; d < p.head_dim; ++d) out[row * wide.head_dim + d] = x[row * p.head_dim + d];
        out[row * wide.head_dim + p.head_dim] = last(row);
      }
      return out;
    };
    auto narrow = [&](const Tensor& x) {
      Tensor out;
      for (std::size_t e = 0; e < x.size(); ++e) {
        if (static_cast<std::int64_t>(e % wide.head_dim) < p.head_dim) out.push_back(x[e]);
      }
      return out;
    };
    const Tensor q_wide = widen(in.q, p.heads_q, p.seq_q, [&](std::int64_t row) { return shifts[row]; });
    const Tensor k_wide = widen(in.k, p.heads_kv, p.seq_k, [](std::int64_t) { return 1.0; });
    const Tensor v_wide = widen(in.v, p.heads_kv, p.seq_k, [](std::int64_t) { return 0.0; });
    const Tensor do_wide = widen(d_o, p.heads_q, p.seq_q, [](std::int64_t) { return 0.0; });

    const ref::AttentionOutput base = ref::attention_forward(p, in.q, in.k, in.v);
    const ref::AttentionOutput shifted = ref::attention_forward(wide, q_wide, k_wide, v_wide);
    CHECK(max_abs_diff(narrow(shifted.o), base.o) < 1e-12);
    for (std::size_t r = 0; r < base.lse.size(); ++r) {
      CAPTURE(r, base.lse[r], shifted.lse[r], shifts[r]);
      if (base.lse[r] == -kInf) CHECK(shifted.lse[r] == -kInf);
      else CHECK(std::abs(shifted.lse[r] - (base.lse[r] + p.scale * shifts[r])) < 1e-10);
    }
    // dS is unchanged, so are the gradients of the original coordinates.
    const ref::AttentionGradients g = ref::attention_backward(p, in.q, in.k, in.v, d_o);
    const ref::AttentionGradients g_wide = ref::attention_backward(wide, q_wide, k_wide, v_wide, do_wide);
    CHECK(max_abs_diff(narrow(g_wide.dq), g.dq) < 1e-10);
    CHECK(max_abs_diff(narrow(g_wide.dk), g.dk) < 1e-9);  // dk sums q_i' terms of size ~1000 that cancel
    CHECK(max_abs_diff(narrow(g_wide.dv), g.dv) < 1e-10);
  }
}

TEST_CASE("attention reference refuses bad problems, naming the field", "[attention][reference]") {
  const AttentionProblem good = make_problem(1, 4, 2, 3, 5, 2, Causal::none, false);
  const Tensor q(q_size(good)), kv(kv_size(good));
  auto forward_with = [&](const AttentionProblem& p) { return ref::attention_forward(p, q, kv, kv); };
  REQUIRE_NOTHROW(forward_with(good));

  AttentionProblem p = good;
  p.heads_kv = 3;
  CHECK_THROWS_AS(forward_with(p), sjit::InvalidArgument);
  CHECK_THROWS_WITH(forward_with(p), Contains("heads_q = 4") && Contains("heads_kv = 3"));
  p = good;
  p.seq_q = -1;
  CHECK_THROWS_WITH(forward_with(p), Contains("seq_q = -1"));
  p = good;
  p.seq_k = -2;
  CHECK_THROWS_WITH(forward_with(p), Contains("seq_k = -2"));
  p = good;
  p.batch = -1;
  CHECK_THROWS_WITH(forward_with(p), Contains("batch = -1"));
  p = good;
  p.head_dim = 0;
  CHECK_THROWS_WITH(forward_with(p), Contains("head_dim = 0"));
  p = good;
  p.heads_kv = 0;
  CHECK_THROWS_WITH(forward_with(p), Contains("heads_kv = 0"));
  p = good;
  p.scale = std::numeric_limits<double>::quiet_NaN();
  CHECK_THROWS_WITH(forward_with(p), Contains("scale = nan"));

  const Tensor short_tensor(3);
  CHECK_THROWS_WITH(ref::attention_forward(good, short_tensor, kv, kv), Contains("q has 3 elements"));
  CHECK_THROWS_WITH(ref::attention_forward(good, q, short_tensor, kv), Contains("k has 3 elements"));
  CHECK_THROWS_WITH(ref::attention_forward(good, q, kv, short_tensor), Contains("v has 3 elements"));
  CHECK_THROWS_WITH(ref::attention_backward(good, q, kv, kv, short_tensor), Contains("d_o has 3 elements"));
  CHECK_THROWS_AS(ref::attention_backward(good, q, kv, kv, short_tensor), sjit::InvalidArgument);
}

// Hidden (run with `sjit_tests "[perf]"`): the largest size the GPU tests compare against should take
// seconds, not minutes.
TEST_CASE("attention reference handles B=2, H=16, S=512, D=128 in seconds", "[.][perf]") {
  std::mt19937_64 rng(7);
  const AttentionProblem p = make_problem(2, 16, 16, 512, 512, 128, Causal::none, false);
  const Inputs in = random_inputs(rng, p);
  const auto start = std::chrono::steady_clock::now();
  const ref::AttentionOutput out = ref::attention_forward(p, in.q, in.k, in.v);
  const auto forward_done = std::chrono::steady_clock::now();
  const ref::AttentionGradients grads = ref::attention_backward(p, in.q, in.k, in.v, in.q);
  const auto backward_done = std::chrono::steady_clock::now();
  const auto ms = [](auto d) { return std::chrono::duration<double, std::milli>(d).count(); };
  WARN("forward " << ms(forward_done - start) << " ms, backward " << ms(backward_done - forward_done) << " ms");
  CHECK_FALSE(any_nan(out.o));
  CHECK_FALSE(any_nan(grads.dq));
}

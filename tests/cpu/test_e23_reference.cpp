// The E23 cell: its spec key text, and the float64 reference (sparsejit/e23_reference.h). Forward
// expectations come from hand computations and from properties of the definition (docs/e23.md); the
// backward is checked against central finite differences of the forward.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "sparsejit/e23_reference.h"
#include "sparsejit/e23_spec.h"
#include "sparsejit/error.h"
#include "reference/e23_reference_fp32.h"
#include "support/test_support.h"

namespace {

namespace ref = sjit::reference;
using sjit::DType;
using sjit::E23Spec;
using sjit::NormKind;
using Vec = std::vector<double>;

struct Normalizer {
  std::string label;
  NormKind kind;
  float alpha;
};

const std::vector<Normalizer> kNormalizers = {{"softmax", NormKind::softmax, 1.0f},
                                              {"sparsemax", NormKind::sparsemax, 2.0f},
                                              {"1.5-entmax", NormKind::entmax, 1.5f},
                                              {"1.25-entmax", NormKind::entmax, 1.25f}};

// A spec for the reference, which takes any size (the kernels' dim rule does not apply to it).
E23Spec reference_spec(const Normalizer& norm, int n_slots, int dim, float scale = 0.0f) {
  return E23Spec{norm.kind, norm.alpha, n_slots, dim, DType::f32, scale};
}

Vec uniform(std::mt19937_64& rng, std::size_t count, double half_width) {
  std::uniform_real_distribution<double> dist(-half_width, half_width);
  Vec v(count);
  for (double& x : v) x = dist(rng);
  return v;
}

// Everything the cell reads, as one bundle the finite differences can perturb.
struct Inputs {
  std::int64_t batch = 0, steps = 0;
  Vec u, h0, m0, w_h, w_w;
  ref::E23Weights weights() const { return {w_h, w_w}; }
};

Inputs random_inputs(std::mt19937_64& rng, std::int64_t batch, std::int64_t steps, int n_slots, int dim,
                     double tape_width) {
  Inputs in;
  in.batch = batch;
  in.steps = steps;
  in.u = uniform(rng, steps * batch * dim, 1.0);
  in.h0 = uniform(rng, batch * dim, 1.0);
  in.m0 = uniform(rng, batch * n_slots * dim, tape_width);
  in.w_h = uniform(rng, dim * dim, 0.8);
  in.w_w = uniform(rng, dim * dim, 2.0);
  return in;
}

ref::E23Sequence forward(const E23Spec& spec, const Inputs& in) {
  return ref::e23_forward(spec, in.batch, in.steps, in.u, in.h0, in.m0, in.weights());
}

double weighted_sum(const Vec& x, const Vec& g) {
  double sum = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) sum += x[i] * g[i];
  return sum;
}

// (W x)_i = sum_j W[i * D + j] x_j
Vec matvec(const Vec& w, const double* x, int dim) {
  Vec out(dim, 0.0);
  for (int i = 0; i < dim; ++i)
    for (int j = 0; j < dim; ++j) out[i] += w[i * dim + j] * x[j];
  return out;
}

// Largest entrywise error of `analytic` against `numeric`, relative to max(|numeric_i|, 1% of the
// largest |numeric|): entries far below the tensor's scale are held to an absolute 1e-2 * max.
double relative_error(const Vec& analytic, const Vec& numeric) {
  double largest = 0.0;
  for (double v : numeric) largest = std::max(largest, std::abs(v));
  double worst = 0.0;
  for (std::size_t i = 0; i < numeric.size(); ++i) {
    const double floor = std::max(std::abs(numeric[i]), 1e-2 * largest);
    if (floor > 0.0) worst = std::max(worst, std::abs(analytic[i] - numeric[i]) / floor);
    else worst = std::max(worst, std::abs(analytic[i]));
  }
  return worst;
}

}  // namespace

// ---- the spec ---------------------------------------------------------------------------------------

TEST_CASE("e23 key text has the documented form and round-trips", "[e23][spec]") {
  using sjit::e23_spec;
  CHECK(key(e23_spec(NormKind::entmax, 1.5f, 8, 512, DType::bf16)) ==
        "e23:kind=entmax,alpha=1.5,n_slots=8,dim=512,dtype=bf16");
  CHECK(key(e23_spec(NormKind::softmax, 1.0f, 64, 1024)) == "e23:kind=softmax,n_slots=64,dim=1024,dtype=f32");
  CHECK(key(e23_spec(NormKind::sparsemax, 2.0f, 4, 64, DType::f16, 0.5f)) ==
        "e23:kind=sparsemax,n_slots=4,dim=64,dtype=f16,scale=0.5");
  // Fields in any order; dtype defaults to f32 and scale to the default.
  CHECK(sjit::parse_e23("e23:dim=64,n_slots=4,kind=sparsemax") == e23_spec(NormKind::sparsemax, 2.0f, 4, 64));

  const std::uint64_t seed = sjit::test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> slots(1, E23Spec::kMaxSlots), dim_units(1, E23Spec::kMaxDim / 8);
  std::uniform_real_distribution<float> alpha(1.0f, 16.0f), scale(0.0f, 4.0f);
  for (int i = 0; i < 300; ++i) {
    const E23Spec s = sjit::canonical(E23Spec{NormKind(i % 3), alpha(rng), slots(rng), 8 * dim_units(rng),
                                              DType(i / 3 % 3), i % 2 == 0 ? 0.0f : scale(rng)});
    CAPTURE(key(s));
    CHECK(sjit::parse_e23(key(s)) == s);
  }
}

TEST_CASE("e23 specs are canonical: one spec per function", "[e23][spec]") {
  using sjit::e23_spec;
  CHECK(e23_spec(NormKind::entmax, 1.0f, 8, 64) == e23_spec(NormKind::softmax, 1.0f, 8, 64));
  CHECK(e23_spec(NormKind::entmax, 2.0f, 8, 64) == e23_spec(NormKind::sparsemax, 2.0f, 8, 64));
  CHECK(e23_spec(NormKind::sparsemax, 7.0f, 8, 64).alpha == 2.0f);
  // An explicit 1/sqrt(dim) is the default.
  CHECK(e23_spec(NormKind::softmax, 1.0f, 8, 64, DType::f32, 0.125f).scale == 0.0f);
  CHECK(sjit::effective_scale(e23_spec(NormKind::softmax, 1.0f, 8, 64)) == 0.125f);
  CHECK(sjit::parse_e23("e23:kind=entmax,alpha=2,n_slots=8,dim=64,scale=0.125") ==
        e23_spec(NormKind::sparsemax, 2.0f, 8, 64));
}

TEST_CASE("bad e23 specs are refused with a message naming the field", "[e23][spec]") {
  using Catch::Matchers::Contains;
  using sjit::parse_e23;
  CHECK_THROWS_WITH(parse_e23("e23:kind=softmax,n_slots=0,dim=64"), Contains("n_slots = 0"));
  CHECK_THROWS_WITH(parse_e23("e23:kind=softmax,n_slots=257,dim=64"), Contains("n_slots = 257"));
  CHECK_THROWS_WITH(parse_e23("e23:kind=softmax,n_slots=8,dim=12"), Contains("dim = 12") && Contains("multiple of 8"));
  CHECK_THROWS_WITH(parse_e23("e23:kind=softmax,n_slots=8,dim=0"), Contains("dim = 0"));
  CHECK_THROWS_WITH(parse_e23("e23:kind=softmax,n_slots=8,dim=4104"), Contains("dim = 4104"));
  CHECK_THROWS_WITH(parse_e23("e23:kind=entmax,n_slots=8,dim=64"), Contains("alpha"));
  CHECK_THROWS_WITH(parse_e23("e23:kind=entmax,alpha=0.5,n_slots=8,dim=64"), Contains("alpha = 0.5"));
  CHECK_THROWS_WITH(parse_e23("e23:kind=softmin,n_slots=8,dim=64"), Contains("softmin"));
  CHECK_THROWS_WITH(parse_e23("e23:kind=softmax,n_slots=8,dim=64,scale=-1"), Contains("scale = -1"));
  CHECK_THROWS_WITH(parse_e23("e23:kind=softmax,n_slots=8,dim=64,dtype=f64"), Contains("f64"));
  CHECK_THROWS_WITH(parse_e23("e23:kind=softmax,n_slots=8,dim=64,n=8"), Contains("'n'"));
  CHECK_THROWS_WITH(parse_e23("e23:kind=softmax,slots=8,dim=64"), Contains("n_slots"));
  CHECK_THROWS_WITH(parse_e23("rownorm:kind=softmax,n=8"), Contains("not an e23"));
  CHECK_THROWS_AS(parse_e23("e23:kind=softmax,n_slots=8,dim=64,"), sjit::InvalidSpec);
}

// ---- the forward ------------------------------------------------------------------------------------

TEST_CASE("e23 reference refuses arguments of the wrong size", "[e23]") {
  using Catch::Matchers::Contains;
  const E23Spec spec = reference_spec(kNormalizers[0], 3, 4);
  std::mt19937_64 rng(1);
  const Inputs in = random_inputs(rng, 2, 3, 3, 4, 1.0);
  const Vec short_u(in.u.begin(), in.u.end() - 1);
  CHECK_THROWS_WITH(ref::e23_forward(spec, 2, 3, short_u, in.h0, in.m0, in.weights()),
                    Contains("u has 23 elements") && Contains("[3, 2, 4]") && Contains("24"));
  CHECK_THROWS_WITH(ref::e23_forward(spec, 2, 3, in.u, in.u, in.m0, in.weights()), Contains("h0 has 24 elements"));
  CHECK_THROWS_WITH(ref::e23_forward(spec, 2, 3, in.u, in.h0, in.h0, in.weights()), Contains("m0 has 8 elements"));
  CHECK_THROWS_WITH(ref::e23_forward(spec, 2, 3, in.u, in.h0, in.m0, {in.w_h, in.h0}), Contains("w.w_w has 8"));
  CHECK_THROWS_WITH(ref::e23_forward(spec, -1, 3, in.u, in.h0, in.m0, in.weights()), Contains("batch = -1"));
  CHECK_THROWS_WITH(ref::e23_forward(spec, 2, -3, in.u, in.h0, in.m0, in.weights()), Contains("steps = -3"));
  CHECK_THROWS_WITH(ref::e23_forward(reference_spec(kNormalizers[0], 0, 4), 2, 3, in.u, in.h0, in.m0, in.weights()),
                    Contains("n_slots = 0"));
  const Vec dy(in.u.size(), 1.0);
  CHECK_THROWS_WITH(ref::e23_backward(spec, 2, 3, in.u, in.h0, in.m0, in.weights(), in.h0, {}, {}),
                    Contains("dy has 8 elements"));
  CHECK_THROWS_WITH(ref::e23_backward(spec, 2, 3, in.u, in.h0, in.m0, in.weights(), dy, dy, {}),
                    Contains("dh_final has 24 elements"));
  CHECK_THROWS_WITH(ref::e23_backward(spec, 2, 3, in.u, in.h0, in.m0, in.weights(), dy, {}, in.h0),
                    Contains("dm_final has 8 elements"));
  CHECK_THROWS_AS(ref::e23_forward(spec, 2, 3, short_u, in.h0, in.m0, in.weights()), sjit::InvalidArgument);
}

TEST_CASE("with one slot the read returns the slot and the write replaces it", "[e23]") {
  // N = 1: every normalizer gives the weight 1, so v = M_0 and M' = w = W_w h'.
  const std::uint64_t seed = sjit::test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  const int dim = 8;
  const std::int64_t batch = 2, steps = 3;
  const Inputs in = random_inputs(rng, batch, steps, 1, dim, 2.0);
  for (const Normalizer& norm : kNormalizers) {
    INFO(norm.label);
    const ref::E23Sequence out = forward(reference_spec(norm, 1, dim), in);
    for (std::int64_t b = 0; b < batch; ++b) {
      Vec h(in.h0.begin() + b * dim, in.h0.begin() + (b + 1) * dim);
      Vec m(in.m0.begin() + b * dim, in.m0.begin() + (b + 1) * dim);
      for (std::int64_t t = 0; t < steps; ++t) {
        const Vec wh = matvec(in.w_h, h.data(), dim);
        for (int k = 0; k < dim; ++k) h[k] = std::tanh(wh[k] + in.u[(t * batch + b) * dim + k] + m[k]);
        m = matvec(in.w_w, h.data(), dim);
        for (int k = 0; k < dim; ++k) CHECK(out.y[(t * batch + b) * dim + k] == Approx(h[k]).margin(1e-14));
      }
      for (int k = 0; k < dim; ++k) {
        CHECK(out.h_final[b * dim + k] == Approx(h[k]).margin(1e-14));
        CHECK(out.m_final[b * dim + k] == Approx(m[k]).margin(1e-13));
      }
    }
    CHECK(out.read_support == Vec(steps, 1.0));
    CHECK(out.write_support == Vec(steps, 1.0));
  }
}

TEST_CASE("each slot moves towards the write value by a weight, and the weights sum to 1", "[e23]") {
  // M'_i = M_i + b_i (w - M_i) with b a distribution: recover b_i by projecting M'_i - M_i on w - M_i,
  // with w = W_w y_0 computed here. So the tape stays in the convex hull of the old slots and w.
  const std::uint64_t seed = sjit::test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  const int n_slots = 5, dim = 8;
  const std::int64_t batch = 3;
  for (const Normalizer& norm : kNormalizers) {
    for (double tape_width : {0.5, 3.0}) {
      CAPTURE(norm.label, tape_width);
      const Inputs in = random_inputs(rng, batch, 1, n_slots, dim, tape_width);
      const ref::E23Sequence out = forward(reference_spec(norm, n_slots, dim), in);
      for (std::int64_t b = 0; b < batch; ++b) {
        const Vec w = matvec(in.w_w, &out.y[b * dim], dim);
        double weight_sum = 0.0;
        for (int i = 0; i < n_slots; ++i) {
          const double* old_slot = &in.m0[(b * n_slots + i) * dim];
          const double* new_slot = &out.m_final[(b * n_slots + i) * dim];
          double along = 0.0, length2 = 0.0;
          for (int k = 0; k < dim; ++k) {
            along += (new_slot[k] - old_slot[k]) * (w[k] - old_slot[k]);
            length2 += (w[k] - old_slot[k]) * (w[k] - old_slot[k]);
          }
          const double weight = along / length2;
          double off_line = 0.0;
          for (int k = 0; k < dim; ++k)
            off_line = std::max(off_line, std::abs(new_slot[k] - old_slot[k] - weight * (w[k] - old_slot[k])));
          CHECK(off_line < 1e-12);
          CHECK(weight >= -1e-12);
          CHECK(weight <= 1.0 + 1e-12);
          weight_sum += weight;
        }
        CHECK(weight_sum == Approx(1.0).margin(1e-12));
      }
    }
  }
}

TEST_CASE("sparsemax with a clear winner reads and writes one slot", "[e23]") {
  // Slot 0 is aligned with h (all entries positive) and the others oppose it, by a margin far beyond
  // what sparsemax needs to drop them (a score gap above 1). The read then returns M_0, which pushes h'
  // to tanh(~5) > 0 in every entry, so the write picks slot 0 as well: M'_0 = w, the others untouched.
  // Softmax on the same input keeps every slot.
  const int n_slots = 4, dim = 8;
  std::mt19937_64 rng(sjit::test::fresh_seed());
  Inputs in = random_inputs(rng, 1, 1, n_slots, dim, 0.0);
  for (int k = 0; k < dim; ++k) {
    in.h0[k] = 0.5 + 0.1 * (k % 3);
    in.u[k] = 0.1 * ((k % 2) - 0.5);
    in.m0[k] = 5.0;
    for (int i = 1; i < n_slots; ++i) in.m0[i * dim + k] = -1.0 - 0.5 * i;
  }
  in.w_h = uniform(rng, dim * dim, 0.1);
  const ref::E23Sequence sparse = forward(reference_spec(kNormalizers[1], n_slots, dim), in);
  CHECK(sparse.read_support == Vec{1.0});
  CHECK(sparse.write_support == Vec{1.0});
  const Vec w = matvec(in.w_w, sparse.y.data(), dim);
  for (int k = 0; k < dim; ++k) {
    CHECK(sparse.y[k] > std::tanh(4.0));
    CHECK(sparse.m_final[k] == Approx(w[k]).margin(1e-14));
    for (int i = 1; i < n_slots; ++i) CHECK(sparse.m_final[i * dim + k] == in.m0[i * dim + k]);
  }
  const ref::E23Sequence dense = forward(reference_spec(kNormalizers[0], n_slots, dim), in);
  CHECK(dense.read_support == Vec{double(n_slots)});
  CHECK(dense.write_support == Vec{double(n_slots)});
}

TEST_CASE("zero steps leave the state as it was", "[e23]") {
  std::mt19937_64 rng(sjit::test::fresh_seed());
  const Inputs in = random_inputs(rng, 2, 0, 3, 4, 1.0);
  const E23Spec spec = reference_spec(kNormalizers[2], 3, 4);
  const ref::E23Sequence out = forward(spec, in);
  CHECK(out.y.empty());
  CHECK(out.h_final == in.h0);
  CHECK(out.m_final == in.m0);
  const Vec dh_final = uniform(rng, in.h0.size(), 1.0), dm_final = uniform(rng, in.m0.size(), 1.0);
  const ref::E23Gradients g =
      ref::e23_backward(spec, 2, 0, in.u, in.h0, in.m0, in.weights(), {}, dh_final, dm_final);
  CHECK(g.dh0 == dh_final);
  CHECK(g.dm0 == dm_final);
  CHECK(g.dw_h == Vec(16, 0.0));
}

// ---- the backward -----------------------------------------------------------------------------------

TEST_CASE("e23 backward matches central finite differences for every normalizer", "[e23]") {
  // L = sum(y * g1) + sum(h_final * g2) + sum(m_final * g3). Sparse normalizers are piecewise smooth:
  // the seeds are fixed (so a draw is reproducible) and every perturbation must keep every support,
  // otherwise the difference quotient straddles a kink and the check says so instead of comparing.
  const int n_slots = 3, dim = 4;
  const std::int64_t batch = 2, steps = 3;
  const double h = 1e-7;
  for (const Normalizer& norm : kNormalizers) {
    const E23Spec spec = reference_spec(norm, n_slots, dim);
    double smallest_support = n_slots, largest_support = 1.0;
    // Wider tapes spread the scores: 1.25-entmax, close to softmax, drops a slot only at score gaps of
    // order 4 (x = r / 4, and a gap in x above 1 always drops it).
    for (auto [seed, tape_width] : {std::pair{11, 2.5}, {12, 2.5}, {13, 6.0}, {14, 6.0}}) {
      CAPTURE(norm.label, seed, tape_width);
      std::mt19937_64 rng(seed);
      Inputs in = random_inputs(rng, batch, steps, n_slots, dim, tape_width);
      const Vec g1 = uniform(rng, in.u.size(), 1.0), g2 = uniform(rng, in.h0.size(), 1.0),
                g3 = uniform(rng, in.m0.size(), 1.0);
      const ref::E23Sequence base = forward(spec, in);
      for (const Vec* support : {&base.read_support, &base.write_support}) {
        smallest_support = std::min(smallest_support, *std::min_element(support->begin(), support->end()));
        largest_support = std::max(largest_support, *std::max_element(support->begin(), support->end()));
      }
      const ref::E23Gradients analytic =
          ref::e23_backward(spec, batch, steps, in.u, in.h0, in.m0, in.weights(), g1, g2, g3);

      auto loss_at = [&](Vec& x, std::size_t i, double value) {
        const double saved = x[i];
        x[i] = value;
        const ref::E23Sequence out = forward(spec, in);
        x[i] = saved;
        REQUIRE(out.read_support == base.read_support);  // else the step crossed a support boundary: redraw
        REQUIRE(out.write_support == base.write_support);
        return weighted_sum(out.y, g1) + weighted_sum(out.h_final, g2) + weighted_sum(out.m_final, g3);
      };
      auto numeric_gradient = [&](Vec& x) {
        Vec grad(x.size());
        for (std::size_t i = 0; i < x.size(); ++i)
          grad[i] = (loss_at(x, i, x[i] + h) - loss_at(x, i, x[i] - h)) / (2.0 * h);
        return grad;
      };
      const struct {
        const char* name;
        Vec* input;
        const Vec* gradient;
      } checks[] = {{"du", &in.u, &analytic.du},
                    {"dh0", &in.h0, &analytic.dh0},
                    {"dm0", &in.m0, &analytic.dm0},
                    {"dw_h", &in.w_h, &analytic.dw_h},
                    {"dw_w", &in.w_w, &analytic.dw_w}};
      for (const auto& check : checks) {
        const Vec numeric = numeric_gradient(*check.input);
        const double error = relative_error(*check.gradient, numeric);
        CAPTURE(check.name, error);
        CHECK(error < 1e-5);
        // The comparison is sharp enough to fail: a 1e-4 relative error in one entry is caught.
        Vec wrong = *check.gradient;
        const auto largest = std::max_element(wrong.begin(), wrong.end(),
                                              [](double a, double b) { return std::abs(a) < std::abs(b); });
        *largest *= 1.0 + 1e-4;
        CHECK(relative_error(wrong, numeric) > 1e-5);
      }
    }
    // The draws exercise the sparse Jacobian: supports of several sizes, never all full for sparse kinds.
    CAPTURE(norm.label, smallest_support, largest_support);
    if (norm.kind != NormKind::softmax) {
      CHECK(smallest_support < n_slots);
      CHECK(largest_support > 1.0);
    }
  }
}

// The GPU suites' fp32 twin (reference/e23_reference_fp32.h) is the reference's code in float: over one
// step it lands within a few fp32 roundings of the float64 results (2e-5 on these draws; several steps
// amplify them, which is what the GPU suites use it to measure), and it does round (were it the float64
// code, every difference would be 0).
TEST_CASE("the fp32 twin of the reference follows it to fp32 rounding, and does round", "[e23]") {
  const int n_slots = 5, dim = 24;
  const std::int64_t batch = 2, steps = 1;
  for (const Normalizer& norm : kNormalizers) {
    CAPTURE(norm.label);
    const E23Spec spec = reference_spec(norm, n_slots, dim);
    std::mt19937_64 rng(21);
    const Inputs in = random_inputs(rng, batch, steps, n_slots, dim, 2.5);
    const Vec dy = uniform(rng, in.u.size(), 1.0), dh = uniform(rng, in.h0.size(), 1.0),
              dm = uniform(rng, in.m0.size(), 1.0);
    const ref::E23Sequence wide = forward(spec, in);
    const ref::E23Sequence narrow = ref::e23_forward_fp32(spec, batch, steps, in.u, in.h0, in.m0, in.weights());
    CHECK(narrow.read_support == wide.read_support);
    CHECK(narrow.write_support == wide.write_support);
    const ref::E23Gradients exact = ref::e23_backward(spec, batch, steps, in.u, in.h0, in.m0, in.weights(), dy, dh, dm);
    const ref::E23Gradients fp32 =
        ref::e23_backward_fp32(spec, batch, steps, in.u, in.h0, in.m0, in.weights(), dy, dh, dm);
    double largest = 0.0;
    for (const auto& [name, twin, oracle] :
         {std::tuple{"y", &narrow.y, &wide.y}, std::tuple{"m_final", &narrow.m_final, &wide.m_final},
          std::tuple{"du", &fp32.du, &exact.du}, std::tuple{"dh0", &fp32.dh0, &exact.dh0},
          std::tuple{"dm0", &fp32.dm0, &exact.dm0}, std::tuple{"dw_h", &fp32.dw_h, &exact.dw_h},
          std::tuple{"dw_w", &fp32.dw_w, &exact.dw_w}}) {
      const double error = relative_error(*twin, *oracle);
      CAPTURE(name, error);
      CHECK(error < 1e-4);
      largest = std::max(largest, error);
    }
    CHECK(largest > 1e-9);
  }
}

TEST_CASE("row_relative_distance and gradient_row_floor measure rows as the bounds do", "[e23]") {
  // Rows [1, 2] and [3, 4] against [1, 2] and [3, 5]: the second row is 1 off on a scale of 5.
  const Vec a{1, 2, 3, 4}, b{1, 2, 3, 5};
  CHECK(ref::row_relative_distance(a, b, 2, 1.0) == Approx(0.2));
  CHECK(ref::row_relative_distance(a, b, 2, 10.0) == Approx(0.1));  // the floor lifts small rows' scale
  CHECK(ref::row_relative_distance(b, b, 2, 1.0) == 0.0);
  CHECK_THROWS_AS(ref::row_relative_distance(a, Vec{1, 2}, 2, 1.0), sjit::InvalidArgument);
  CHECK_THROWS_AS(ref::row_relative_distance(a, b, 0, 1.0), sjit::InvalidArgument);
  CHECK(ref::gradient_row_floor(Vec{-3, 1}) == Approx(0.3));
  CHECK(ref::gradient_row_floor(Vec{0, 0}) == 1e-12);
}

// The sensitivities move the inputs by one fp32 rounding: over one step of a tame draw the outputs move
// by a few roundings; over many steps of a wide draw the cell's gain carries that far beyond (the GPU
// tests' chaotic regime), which is what the checks need it to see. The signs come from the seed.
TEST_CASE("the sensitivities see one rounding of the inputs, and its growth over steps", "[e23]") {
  const Normalizer& norm = kNormalizers[2];  // 1.5-entmax
  const int n_slots = 4, dim = 16;
  const E23Spec spec = reference_spec(norm, n_slots, dim);
  for (const auto& [steps, tape_width, low, high] :
       {std::tuple{std::int64_t(1), 1.0, 1e-9, 1e-5}, std::tuple{std::int64_t(24), 6.0, 1e-5, 10.0}}) {
    CAPTURE(steps, tape_width);
    std::mt19937_64 rng(31);
    const Inputs in = random_inputs(rng, 2, steps, n_slots, dim, tape_width);
    const ref::E23ForwardSensitivity s = ref::e23_forward_sensitivity(spec, 2, steps, in.u, in.h0, in.m0, in.weights(), 5);
    CHECK(s.distance > low);
    CHECK(s.distance < high);
    const ref::E23ForwardSensitivity again = ref::e23_forward_sensitivity(spec, 2, steps, in.u, in.h0, in.m0, in.weights(), 5);
    CHECK(again.distance == s.distance);
    CHECK(s.at.y == forward(spec, in).y);  // the reference at the inputs as given
    const Vec dy = uniform(rng, in.u.size(), 1.0);
    const ref::E23BackwardSensitivity g =
        ref::e23_backward_sensitivity(spec, 2, steps, in.u, in.h0, in.m0, in.weights(), dy, {}, {}, 5);
    CHECK(g.distance > low);
    CHECK(g.at.du == ref::e23_backward(spec, 2, steps, in.u, in.h0, in.m0, in.weights(), dy, {}, {}).du);
  }
}

TEST_CASE("empty final gradients mean zero", "[e23]") {
  std::mt19937_64 rng(sjit::test::fresh_seed());
  const Inputs in = random_inputs(rng, 2, 3, 3, 4, 2.0);
  const E23Spec spec = reference_spec(kNormalizers[2], 3, 4);
  const Vec dy = uniform(rng, in.u.size(), 1.0);
  const ref::E23Gradients empty = ref::e23_backward(spec, 2, 3, in.u, in.h0, in.m0, in.weights(), dy, {}, {});
  const ref::E23Gradients zeros = ref::e23_backward(spec, 2, 3, in.u, in.h0, in.m0, in.weights(), dy,
                                                    Vec(in.h0.size(), 0.0), Vec(in.m0.size(), 0.0));
  CHECK(empty.du == zeros.du);
  CHECK(empty.dh0 == zeros.dh0);
  CHECK(empty.dm0 == zeros.dm0);
  CHECK(empty.dw_h == zeros.dw_h);
  CHECK(empty.dw_w == zeros.dw_w);
}

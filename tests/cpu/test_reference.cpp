// Property tests of the float64 row-normalizer references (sparsejit/reference.h). Each expectation
// comes from a property of the math (Martins & Astudillo 2016; Peters, Niculae & Martins 2019) or from
// a value computed by hand, never from the code under test. Inputs are drawn from a seeded
// std::mt19937_64; the seed is printed on failure.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "sparsejit/error.h"
#include "sparsejit/reference.h"

namespace {

namespace ref = sjit::reference;
using sjit::NormKind;
using sjit::RowNormSpec;
using Row = std::vector<double>;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
const std::vector<std::size_t> kSizes = {1, 2, 3, 7, 8, 16, 33, 100, 1000};
const std::vector<double> kScales = {1e-3, 1e-1, 1.0, 10.0, 1e2, 1e4};
const std::vector<double> kEntmaxAlphas = {1.1, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0};

RowNormSpec make_spec(NormKind kind, double alpha) {
  RowNormSpec spec;
  spec.kind = kind;
  spec.alpha = static_cast<float>(alpha);
  return spec;
}

struct Normalizer {
  std::string label;
  RowNormSpec spec;
  double alpha;  // 1 for softmax, the alpha the forward actually uses otherwise
};

std::vector<Normalizer> every_normalizer() {
  std::vector<Normalizer> all = {{"softmax", make_spec(NormKind::softmax, 1), 1.0},
                                 {"sparsemax", make_spec(NormKind::sparsemax, 2), 2.0}};
  for (double alpha : kEntmaxAlphas) {
    const RowNormSpec spec = make_spec(NormKind::entmax, alpha);
    all.push_back({"entmax alpha=" + std::to_string(alpha), spec, static_cast<double>(spec.alpha)});
  }
  return all;
}

std::uint64_t fresh_seed() {
  std::random_device device;
  return (static_cast<std::uint64_t>(device()) << 32) ^ device();
}

// Uniform in [-scale, scale] around a random offset, so nothing relies on the row being centred.
Row random_row(std::mt19937_64& rng, std::size_t n, double scale) {
  std::uniform_real_distribution<double> unit(-1.0, 1.0);
  const double offset = 3.0 * scale * unit(rng);
  Row z(n);
  for (double& v : z) v = offset + scale * unit(rng);
  return z;
}

double sum(const Row& v) { return std::accumulate(v.begin(), v.end(), 0.0); }

double max_abs_diff(const Row& a, const Row& b) {
  double worst = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  return worst;
}

// The scaled score of the threshold condition: x = (alpha - 1) z / T (softmax: z / T).
double scaled(double alpha, double z, double temperature) {
  return (alpha == 1.0 ? 1.0 : alpha - 1.0) * z / temperature;
}

void check_distribution(const Row& y, std::size_t n) {
  REQUIRE(y.size() == n);
  CHECK(*std::min_element(y.begin(), y.end()) >= 0.0);
  CHECK(std::abs(sum(y) - 1.0) < 1e-12);
}

bool all_nan(const Row& y) { return std::all_of(y.begin(), y.end(), [](double v) { return std::isnan(v); }); }

}  // namespace

TEST_CASE("every normalizer outputs a probability distribution", "[reference]") {
  const std::uint64_t seed = fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  for (std::size_t n : kSizes) {
    for (double scale : kScales) {
      CAPTURE(n, scale);
      const Row z = random_row(rng, n, scale);
      for (const Normalizer& norm : every_normalizer()) {
        for (double temperature : {1.0, 0.7}) {
          INFO(norm.label << ", T=" << temperature);
          check_distribution(ref::rownorm_forward(norm.spec, z, temperature), n);
        }
      }
      // The independent algorithms too, including bisection at the alphas that have a sort algorithm.
      check_distribution(ref::softmax(z), n);
      check_distribution(ref::sparsemax_by_sort(z), n);
      check_distribution(ref::entmax15_by_sort(z), n);
      for (double alpha : kEntmaxAlphas) {
        CAPTURE(alpha);
        check_distribution(ref::entmax_by_bisection(z, alpha), n);
      }
    }
  }
}

TEST_CASE("the support is exactly where the scaled score exceeds the threshold", "[reference]") {
  const std::uint64_t seed = fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  for (std::size_t n : kSizes) {
    for (double scale : kScales) {
      const Row z = random_row(rng, n, scale);
      for (const Normalizer& norm : every_normalizer()) {
        const double temperature = 0.7;
        CAPTURE(n, scale, norm.label);
        const Row y = ref::rownorm_forward(norm.spec, z, temperature);
        const double tau = ref::threshold(norm.spec, z, temperature);
        const double x_max = scaled(norm.alpha, *std::max_element(z.begin(), z.end()), temperature);
        // Entries within rounding of tau cannot be classified; every other one must agree.
        const double ambiguous = 1e-9 * (1.0 + std::abs(tau));
        int misclassified = 0;
        double worst_value_error = 0.0;
        for (std::size_t i = 0; i < n; ++i) {
          const double x = scaled(norm.alpha, z[i], temperature);
          // The defining formula, y = g(x - tau), evaluated from threshold() alone.
          const double expected = norm.alpha == 1.0 ? std::exp(x - tau)
                                                    : std::pow(std::max(x - tau, 0.0), 1.0 / (norm.alpha - 1.0));
          worst_value_error = std::max(worst_value_error, std::abs(y[i] - expected));
          if (norm.alpha == 1.0 || std::abs(x - tau) <= ambiguous) continue;  // softmax has full support
          if ((y[i] > 0.0) != (x > tau)) ++misclassified;
        }
        CHECK(misclassified == 0);
        CHECK(worst_value_error < 1e-7);
        if (norm.alpha == 1.0) {
          CHECK(tau >= x_max);  // logsumexp is at least the max
        } else {
          // tau - max x lies in [-1, -(1/n)^(alpha-1)]: the max entry's output is between 1/n and 1.
          CHECK(tau - x_max >= -1.0 - 1e-9);
          CHECK(tau - x_max <= -std::pow(1.0 / static_cast<double>(n), norm.alpha - 1.0) + 1e-9);
        }
      }
    }
  }
}

TEST_CASE("alpha-entmax approaches softmax as alpha -> 1", "[reference]") {
  const std::uint64_t seed = fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  for (std::size_t n : kSizes) {
    for (double scale : {1e-3, 0.5, 1.0, 3.0}) {
      CAPTURE(n, scale);
      const Row z = random_row(rng, n, scale);
      const Row expected = ref::softmax(z);
      double previous_error = kInf;
      for (double epsilon : {1e-2, 1e-3, 1e-4}) {
        CAPTURE(epsilon);
        const double error = max_abs_diff(ref::entmax_by_bisection(z, 1.0 + epsilon), expected);
        CAPTURE(error, previous_error);
        // The gap is first order in alpha - 1 (y = (1 + (alpha-1)(z - c))^(1/(alpha-1)) -> exp(z - c)), so
        // each tenfold step towards 1 must shrink it, unless it is already at rounding level.
        CHECK((error < previous_error / 3 || error < 1e-10));
        previous_error = error;
      }
      CHECK(previous_error < 1e-3);
    }
  }
}

TEST_CASE("independent algorithms agree where their definitions coincide", "[reference]") {
  const std::uint64_t seed = fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  for (std::size_t n : kSizes) {
    for (double scale : kScales) {
      CAPTURE(n, scale);
      const Row z = random_row(rng, n, scale);
      CHECK(max_abs_diff(ref::entmax_by_bisection(z, 2.0), ref::sparsemax_by_sort(z)) < 1e-10);
      CHECK(max_abs_diff(ref::entmax_by_bisection(z, 1.5), ref::entmax15_by_sort(z)) < 1e-10);
      // entmax(1) is softmax and entmax(2) is sparsemax through the spec as well.
      CHECK(ref::rownorm_forward(make_spec(NormKind::entmax, 1.0), z) == ref::softmax(z));
      CHECK(ref::rownorm_forward(make_spec(NormKind::entmax, 2.0), z) == ref::sparsemax_by_sort(z));
    }
  }
}

namespace {

// Moves every entry whose scaled score lies within `margin` of tau to below tau - 2 margin, until none
// is left: finite differences across a support boundary measure a kink, not the Jacobian.
Row away_from_support_boundary(const Normalizer& norm, Row z, double temperature, double margin,
                               std::mt19937_64& rng) {
  if (norm.alpha == 1.0) return z;  // softmax is smooth everywhere
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (int round = 0; round < 1000; ++round) {
    const double tau = ref::threshold(norm.spec, z, temperature);
    bool moved = false;
    for (double& zi : z) {
      if (std::abs(scaled(norm.alpha, zi, temperature) - tau) >= margin) continue;
      zi = (tau - margin * (2.0 + unit(rng))) * temperature / (norm.alpha - 1.0);
      moved = true;  // dropping a support entry raises tau, so look again
    }
    if (!moved) return z;
  }
  FAIL("could not move the row away from its support boundary");
  return z;
}

}  // namespace

TEST_CASE("backward is the Jacobian-vector product of the forward (central differences)", "[reference]") {
  const std::uint64_t seed = fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> unit(-1.0, 1.0);
  for (std::size_t n : {1, 2, 3, 7, 8, 16, 33, 100}) {  // O(n^2) forwards each: 1000 would take minutes
    for (double scale : {1e-3, 1e-1, 1.0, 10.0, 1e4}) {
      for (const Normalizer& norm : every_normalizer()) {
        for (double temperature : {1.0, 0.7}) {
          CAPTURE(n, scale, norm.label, temperature);
          Row z = random_row(rng, n, scale);
          // Step relative to the magnitude so z + h is a distinct double; the support must be further
          // away from tau than any step moves a scaled score.
          double h_max = 0.0;
          for (double zi : z) h_max = std::max(h_max, 1e-6 * std::sqrt(std::max(1.0, std::abs(zi))));
          const double margin = std::max(1e-3, 100.0 * scaled(norm.alpha, h_max, temperature));
          z = away_from_support_boundary(norm, z, temperature, margin, rng);

          Row dy(n);
          for (double& v : dy) v = unit(rng);
          const Row y = ref::rownorm_forward(norm.spec, z, temperature);
          const Row dz = ref::rownorm_backward(norm.spec, y, dy, temperature);
          REQUIRE(dz.size() == n);
          double dz_max = 0.0;
          for (double v : dz) dz_max = std::max(dz_max, std::abs(v));

          double worst = 0.0;
          for (std::size_t j = 0; j < n; ++j) {
            const double h = 1e-6 * std::sqrt(std::max(1.0, std::abs(z[j])));
            Row plus = z, minus = z;
            plus[j] += h;
            minus[j] -= h;
            const double step = plus[j] - minus[j];  // the step actually taken, after rounding
            const Row y_plus = ref::rownorm_forward(norm.spec, plus, temperature);
            const Row y_minus = ref::rownorm_forward(norm.spec, minus, temperature);
            double directional = 0.0;  // <dy, dy/dz_j>
            for (std::size_t i = 0; i < n; ++i) directional += dy[i] * (y_plus[i] - y_minus[i]) / step;
            worst = std::max(worst, std::abs(directional - dz[j]));
          }
          CAPTURE(worst, dz_max);
          CHECK(worst <= 1e-5 * std::max(1.0, dz_max));
        }
      }
    }
  }
}

TEST_CASE("values computed by hand", "[reference]") {
  const RowNormSpec softmax = make_spec(NormKind::softmax, 1);
  const RowNormSpec sparsemax = make_spec(NormKind::sparsemax, 2);
  const RowNormSpec entmax15 = make_spec(NormKind::entmax, 1.5);

  SECTION("sparsemax: a tie splits evenly, tau = -1/2") {
    CHECK(ref::rownorm_forward(sparsemax, Row{0, 0}) == Row{0.5, 0.5});
    CHECK(ref::threshold(sparsemax, Row{0, 0}) == -0.5);
  }
  SECTION("sparsemax: a gap of exactly 1 is the boundary, support 1, tau = 0") {
    CHECK(ref::rownorm_forward(sparsemax, Row{1, 0}) == Row{1, 0});
    CHECK(ref::threshold(sparsemax, Row{1, 0}) == 0.0);
  }
  SECTION("sparsemax: [0.5, 0] has tau = (0.5 - 1)/2 = -0.25") {
    const Row y = ref::rownorm_forward(sparsemax, Row{0.5, 0});
    CHECK(y[0] == Approx(0.75).margin(1e-15));
    CHECK(y[1] == Approx(0.25).margin(1e-15));
  }
  SECTION("1.5-entmax: a tie splits evenly") {
    CHECK(max_abs_diff(ref::rownorm_forward(entmax15, Row{0, 0}), Row{0.5, 0.5}) < 1e-15);
    CHECK(max_abs_diff(ref::entmax_by_bisection(Row{0, 0}, 1.5), Row{0.5, 0.5}) < 1e-15);
  }
  SECTION("1.5-entmax of [1, 0]: x = [1/2, 0], (1/2 - tau)^2 + tau^2 = 1, tau = 1/4 - sqrt(7/16)") {
    const double root = std::sqrt(7.0 / 16.0);
    const Row y = ref::rownorm_forward(entmax15, Row{1, 0});
    CHECK(y[0] == Approx((0.25 + root) * (0.25 + root)).margin(1e-15));
    CHECK(y[1] == Approx((root - 0.25) * (root - 0.25)).margin(1e-15));
  }
  SECTION("softmax of [1, 2, 3] is e^(i-3) / (1 + e^-1 + e^-2)") {
    const double denominator = 1.0 + std::exp(-1.0) + std::exp(-2.0);
    const Row y = ref::rownorm_forward(softmax, Row{1, 2, 3});
    CHECK(y[0] == Approx(std::exp(-2.0) / denominator).margin(1e-15));
    CHECK(y[1] == Approx(std::exp(-1.0) / denominator).margin(1e-15));
    CHECK(y[2] == Approx(1.0 / denominator).margin(1e-15));
    CHECK(y[0] == Approx(0.09003057317038046).margin(1e-15));
    CHECK(ref::threshold(softmax, Row{0, 0}) == Approx(std::log(2.0)).margin(1e-15));
  }
  SECTION("every normalizer gives 1/n on a constant row") {
    for (const Normalizer& norm : every_normalizer()) {
      for (std::size_t n : kSizes) {
        CAPTURE(norm.label, n);
        const Row y = ref::rownorm_forward(norm.spec, Row(n, 4.25), 0.7);
        CHECK(max_abs_diff(y, Row(n, 1.0 / static_cast<double>(n))) < 1e-15);
      }
    }
  }
}

TEST_CASE("edge semantics", "[reference]") {
  const std::uint64_t seed = fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  // Sections stay outside the loop (Catch runs a section once per pass); each one checks every kind.
  const auto for_every_normalizer = [](auto&& check) {
    for (const Normalizer& norm : every_normalizer()) {
      INFO(norm.label);
      check(norm.spec, [&](const Row& z) { return ref::rownorm_forward(norm.spec, z); });
    }
  };

  SECTION("any NaN makes the whole row NaN, even next to +inf") {
    for_every_normalizer([](const RowNormSpec& spec, auto forward) {
      CHECK(all_nan(forward(Row{1, kNaN, 2})));
      CHECK(all_nan(forward(Row{kInf, 0, kNaN})));
      CHECK(std::isnan(ref::threshold(spec, Row{1, kNaN, 2})));
    });
  }
  SECTION("+inf entries share the mass uniformly, every other entry gets 0") {
    for_every_normalizer([](const RowNormSpec& spec, auto forward) {
      CHECK(forward(Row{0, kInf, -3, -kInf}) == Row{0, 1, 0, 0});
      CHECK(forward(Row{kInf, 5, kInf}) == Row{0.5, 0, 0.5});
      CHECK(ref::threshold(spec, Row{kInf, 5}) == kInf);
    });
  }
  SECTION("-inf entries get 0 and leave the rest as without them") {
    for_every_normalizer([&](const RowNormSpec&, auto forward) {
      const Row finite = random_row(rng, 5, 1.0);
      const Row y = forward(Row{finite[0], -kInf, finite[1], finite[2], -kInf, finite[3], finite[4]});
      const Row expected = forward(finite);
      CHECK(y == Row{expected[0], 0, expected[1], expected[2], 0, expected[3], expected[4]});
    });
  }
  SECTION("a row of only -inf is undefined: NaN") {
    for_every_normalizer([](const RowNormSpec& spec, auto forward) {
      CHECK(all_nan(forward(Row{-kInf, -kInf, -kInf})));
      CHECK(std::isnan(ref::threshold(spec, Row{-kInf})));
    });
  }
  SECTION("an empty row gives an empty result") {
    for_every_normalizer([](const RowNormSpec& spec, auto forward) {
      CHECK(forward(Row{}).empty());
      CHECK(ref::rownorm_backward(spec, Row{}, Row{}).empty());
    });
    CHECK(ref::softmax(Row{}).empty());
    CHECK(ref::sparsemax_by_sort(Row{}).empty());
    CHECK(ref::entmax15_by_sort(Row{}).empty());
    CHECK(ref::entmax_by_bisection(Row{}, 1.25).empty());
  }
  SECTION("huge magnitudes do not overflow") {
    for_every_normalizer([](const RowNormSpec&, auto forward) {
      const double big = std::numeric_limits<double>::max();
      CHECK(max_abs_diff(forward(Row{big, -big, big}), Row{0.5, 0, 0.5}) < 1e-15);
      check_distribution(forward(Row{big, 0.999999 * big, 0.5 * big}), 3);
    });
  }
  SECTION("adding a constant changes nothing") {
    for_every_normalizer([&](const RowNormSpec&, auto forward) {
      for (double scale : kScales) {
        CAPTURE(scale);
        const Row z = random_row(rng, 33, scale);
        Row shifted = z;
        for (double& v : shifted) v += 7.0 * scale;
        CHECK(max_abs_diff(forward(shifted), forward(z)) < 1e-10);
      }
    });
  }
  SECTION("temperature divides the scores: forward(z, T) == forward(z / T, 1)") {
    for_every_normalizer([&](const RowNormSpec& spec, auto forward) {
      for (double temperature : {0.05, 0.7, 3.0}) {
        const Row z = random_row(rng, 33, 2.0);
        Row divided = z;
        for (double& v : divided) v /= temperature;
        CAPTURE(temperature);
        CHECK(max_abs_diff(ref::rownorm_forward(spec, z, temperature), forward(divided)) < 1e-12);
      }
    });
  }
  SECTION("backward: a NaN in y or dy spreads through <s, dy> to the whole row") {
    for_every_normalizer([](const RowNormSpec& spec, auto forward) {
      const Row y = forward(Row{2, 1, 0.5, -3});
      CHECK(all_nan(ref::rownorm_backward(spec, Row{y[0], kNaN, y[2], y[3]}, Row{1, 2, 3, 4})));
      CHECK(all_nan(ref::rownorm_backward(spec, y, Row{1, 2, 3, kNaN})));
    });
  }
}

TEST_CASE("bad arguments throw InvalidArgument naming the value", "[reference]") {
  const Row z = {0.5, -1.0, 2.0};
  using Catch::Contains;
  for (double alpha : {1.0 - 1e-6, 0.5, 0.0, -2.0, kNaN, kInf}) {
    CAPTURE(alpha);
    CHECK_THROWS_AS(ref::rownorm_forward(make_spec(NormKind::entmax, alpha), z), sjit::InvalidArgument);
    CHECK_THROWS_WITH(ref::threshold(make_spec(NormKind::entmax, alpha), z), Contains("alpha"));
    CHECK_THROWS_WITH(ref::entmax_by_bisection(z, alpha), Contains("alpha"));
  }
  CHECK_THROWS_WITH(ref::entmax_by_bisection(z, 1.0), Contains("alpha = 1"));
  CHECK_THROWS_WITH(ref::rownorm_forward(make_spec(NormKind::entmax, 0.5), z), Contains("0.5"));
  for (const Normalizer& norm : every_normalizer()) {
    for (double temperature : {0.0, -1.0, kNaN, kInf}) {
      CAPTURE(norm.label, temperature);
      CHECK_THROWS_AS(ref::rownorm_forward(norm.spec, z, temperature), sjit::InvalidArgument);
      CHECK_THROWS_WITH(ref::threshold(norm.spec, z, temperature), Contains("temperature"));
      CHECK_THROWS_WITH(ref::rownorm_backward(norm.spec, z, z, temperature), Contains("temperature"));
    }
    CHECK_THROWS_WITH(ref::rownorm_backward(norm.spec, Row{0.5, 0.5}, Row{1, 2, 3}), Contains("length 3"));
  }
  CHECK_THROWS_WITH(ref::rownorm_forward(make_spec(static_cast<NormKind>(42), 1), z), Contains("42"));
}

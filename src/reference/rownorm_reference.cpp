// Float64 CPU references for the row normalizers of the entmax family (see reference.h).
//
// Every normalizer here has the form y_i = g(x_i - tau) with tau the unique threshold that makes y sum
// to 1 (Peters, Niculae & Martins 2019, "Sparse Sequence-to-Sequence Models", definition of alpha-entmax):
//   softmax    x = z / T,             y = exp(x - tau),                 tau = logsumexp(x)
//   alpha>1    x = (alpha-1) z / T,   y = [x - tau]_+^(1/(alpha-1))
//   sparsemax  alpha = 2:             y = [z/T - tau]_+                 (Martins & Astudillo 2016)
// The row max is subtracted before scaling, x = (alpha-1)(z - max z)/T, so no finite input overflows
// and the largest x is exactly 0. Its output (-tau)^(1/(alpha-1)) is the largest and must lie in
// [1/n, 1] for the row to sum to 1, so tau lies in [-1, -(1/n)^(alpha-1)]. Outputs are never divided
// by their sum: the threshold alone normalizes them, as in the GPU kernels.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <span>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "sparsejit/error.h"
#include "sparsejit/reference.h"

namespace sjit::reference {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// A row solved on its max-subtracted scores: y and tau (both for the entries passed in).
struct Solved {
  std::vector<double> y;
  double tau = kNaN;
};

// Solves one row of finite, max-subtracted scaled scores x (non-empty, max x == 0).
using Solver = std::function<Solved(std::span<const double> x)>;

std::string_view kind_name(NormKind kind) {  // local, so the reference needs nothing outside this file
  switch (kind) {
    case NormKind::softmax: return "softmax";
    case NormKind::sparsemax: return "sparsemax";
    case NormKind::entmax: return "entmax";
  }
  return "?";
}

void check_temperature(double temperature) {
  if (!(std::isfinite(temperature) && temperature > 0.0)) {
    throw InvalidArgument(fmt::format(
        "rownorm reference: temperature = {} is not allowed; it must be a finite number > 0", temperature));
  }
}

void check_entmax_alpha(double alpha) {
  if (!(std::isfinite(alpha) && alpha > 1.0)) {
    throw InvalidArgument(fmt::format(
        "rownorm reference: entmax alpha = {} is not allowed; alpha must be a finite number > 1 "
        "(use kind=softmax for alpha = 1)", alpha));
  }
}

// The alpha a spec means: 1 for softmax, 2 for sparsemax, spec.alpha for entmax (checked).
double effective_alpha(const RowNormSpec& spec) {
  switch (spec.kind) {
    case NormKind::softmax: return 1.0;
    case NormKind::sparsemax: return 2.0;
    case NormKind::entmax: {
      const double alpha = spec.alpha;
      if (alpha == 1.0) return 1.0;  // entmax(1) is softmax, by the header's convention
      check_entmax_alpha(alpha);
      return alpha;
    }
  }
  throw InvalidArgument(fmt::format(
      "rownorm reference: kind = {} is not a NormKind; allowed: {}, {}, {}", static_cast<int>(spec.kind),
      kind_name(NormKind::softmax), kind_name(NormKind::sparsemax), kind_name(NormKind::entmax)));
}

// ---- Solvers on max-subtracted scores -------------------------------------------------------------

// Stable softmax: tau = logsumexp(x) = log(sum exp(x)) since max x = 0, and y = exp(x - tau).
Solved solve_softmax(std::span<const double> x) {
  double sum_exp = 0.0;
  for (double xi : x) sum_exp += std::exp(xi);
  Solved out{std::vector<double>(x.size()), std::log(sum_exp)};
  for (std::size_t i = 0; i < x.size(); ++i) out.y[i] = std::exp(x[i] - out.tau);
  return out;
}

std::vector<double> sorted_descending(std::span<const double> x) {
  std::vector<double> sorted(x.begin(), x.end());
  std::sort(sorted.begin(), sorted.end(), std::greater<>());
  return sorted;
}

// Sparsemax by sorting (Martins & Astudillo 2016, Algorithm 1): with x sorted descending,
// k* = max{k : 1 + k x_(k) > sum_{j<=k} x_(j)} and tau = (sum_{j<=k*} x_(j) - 1) / k*.
// k = 1 always qualifies (1 + x_(1) > x_(1)), so k* >= 1.
Solved solve_sparsemax_sort(std::span<const double> x) {
  const std::vector<double> sorted = sorted_descending(x);
  double cumsum = 0.0, support_sum = 0.0;
  std::size_t support = 0;
  for (std::size_t k = 1; k <= sorted.size(); ++k) {
    cumsum += sorted[k - 1];
    if (1.0 + static_cast<double>(k) * sorted[k - 1] > cumsum) {
      support = k;
      support_sum = cumsum;
    }
  }
  Solved out{std::vector<double>(x.size()), (support_sum - 1.0) / static_cast<double>(support)};
  for (std::size_t i = 0; i < x.size(); ++i) out.y[i] = std::max(x[i] - out.tau, 0.0);
  return out;
}

// 1.5-entmax by sorting (Peters et al. 2019, Algorithm 2; entmax package, _entmax_threshold_and_support).
// On a support of the k largest entries, sum_j (x_(j) - tau)^2 = 1 is a quadratic in tau whose smaller
// root is tau_k = mean_k - sqrt((1 - ss_k) / k), ss_k = sum_{j<=k} (x_(j) - mean_k)^2 (k times the
// variance). The support size is #{k : tau_k <= x_(k)}. ss_k is accumulated with Welford's update,
// which equals k (meansq_k - mean_k^2) without its cancellation.
Solved solve_entmax15_sort(std::span<const double> x) {
  const std::vector<double> sorted = sorted_descending(x);
  std::vector<double> tau(sorted.size());
  double mean = 0.0, ss = 0.0;
  std::size_t support = 0;
  for (std::size_t k = 1; k <= sorted.size(); ++k) {
    const double xk = sorted[k - 1];
    const double prev_mean = mean;
    mean += (xk - prev_mean) / static_cast<double>(k);
    ss += (xk - prev_mean) * (xk - mean);
    const double delta = (1.0 - ss) / static_cast<double>(k);
    tau[k - 1] = mean - std::sqrt(std::max(delta, 0.0));
    if (tau[k - 1] <= xk) ++support;
  }
  Solved out{std::vector<double>(x.size()), tau[support - 1]};  // k = 1 gives tau = x_(1) - 1: support >= 1
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double t = std::max(x[i] - out.tau, 0.0);
    out.y[i] = t * t;
  }
  return out;
}

// sum_i [x_i - tau]_+^p: decreasing in tau, the mass that threshold tau leaves.
// Only x_i - tau needs the extra precision of tau (see below); its power is taken in double.
long double entmax_mass(std::span<const double> x, long double tau, double p) {
  long double mass = 0.0L;
  for (double xi : x) {
    if (xi > tau) mass += std::pow(static_cast<double>(xi - tau), p);
  }
  return mass;
}

// alpha-entmax by bisection (Peters et al. 2019, Algorithm 1; Blondel, Martins & Niculae 2019, "Learning
// with Fenchel-Young Losses"; the entmax package's entmax_bisect): f(tau) = mass(tau) - 1
// is continuous and decreasing, f(-1) >= 0 (the max entry alone gives 1^p) and
// f(-(1/n)^(alpha-1)) <= 0 (every term is at most ((1/n)^(alpha-1))^p = 1/n). Bisect until the interval
// cannot shrink, then keep the end whose mass is closer to 1. No Newton polish: the two ends are then
// adjacent numbers, so no other tau of that precision does better.
// Why long double: for alpha > 2 (p < 1) the mass has slope p u^(p-1), unbounded as an entry's
// u = x_i - tau -> 0. A double tau near -1 moves in steps of 1.1e-16, and an entry 1e-11 above tau then
// makes the best double tau miss sum 1 by ~1e-11. The 64-bit mantissa of x87 long double (128-bit on
// aarch64) keeps that below 1e-14 for alpha <= 3; where long double is double (MSVC) such rows stay
// ~1e-11 off. For large alpha no fixed precision suffices: an entry entering the support with y has
// u = y^(alpha-1), e.g. 1e-20 for y = 1e-5 at alpha = 5, so the sum there is good to ~1e-7 only.
Solved solve_entmax_bisection(std::span<const double> x, double alpha) {
  const double p = 1.0 / (alpha - 1.0);
  const double n = static_cast<double>(x.size());
  long double lo = -1.0L, hi = -std::pow(1.0 / n, alpha - 1.0);
  // Each step halves the interval; a few thousand steps reach adjacent numbers from any bracket.
  for (int step = 0; step < 20000; ++step) {
    const long double mid = lo + 0.5L * (hi - lo);
    if (mid <= lo || mid >= hi) break;
    if (entmax_mass(x, mid, p) >= 1.0L) lo = mid; else hi = mid;
  }
  const long double tau =
      std::abs(entmax_mass(x, lo, p) - 1.0L) <= std::abs(entmax_mass(x, hi, p) - 1.0L) ? lo : hi;
  Solved out{std::vector<double>(x.size()), static_cast<double>(tau)};
  for (std::size_t i = 0; i < x.size(); ++i) {
    out.y[i] = x[i] > tau ? std::pow(static_cast<double>(x[i] - tau), p) : 0.0;
  }
  return out;
}

// ---- Edge semantics, shared by every algorithm ---------------------------------------------------

// Solves y = normalize((alpha-1) z / T) (softmax: alpha = 1 and x = z / T) with the edge semantics of
// reference.h, and returns tau on the unshifted scaled scores. `solver` sees only the entries that can
// carry mass, max-subtracted and scaled.
Solved solve_row(std::span<const double> z, double alpha, double temperature, const Solver& solver) {
  check_temperature(temperature);
  const std::size_t n = z.size();
  if (n == 0) return {{}, kNaN};  // no threshold exists for an empty row
  if (std::any_of(z.begin(), z.end(), [](double v) { return std::isnan(v); })) {
    return {std::vector<double>(n, kNaN), kNaN};
  }
  // +inf entries: the limit z_i -> +inf of the definition shares the mass among them, and tau -> +inf.
  const auto positive_infinities = std::count(z.begin(), z.end(), kInf);
  if (positive_infinities > 0) {
    Solved out{std::vector<double>(n, 0.0), kInf};
    for (std::size_t i = 0; i < n; ++i) {
      if (z[i] == kInf) out.y[i] = 1.0 / static_cast<double>(positive_infinities);
    }
    return out;
  }
  const double z_max = *std::max_element(z.begin(), z.end());
  if (z_max == -kInf) return {std::vector<double>(n, kNaN), kNaN};  // only -inf: undefined

  const double scale = alpha == 1.0 ? 1.0 : alpha - 1.0;  // softmax: x = z / T
  std::vector<double> x;
  std::vector<std::size_t> index;  // where each x came from
  for (std::size_t i = 0; i < n; ++i) {
    const double xi = scale * (z[i] - z_max) / temperature;
    if (xi == -kInf) continue;  // -inf scores (or ones below max by more than a double holds) get 0
    x.push_back(xi);
    index.push_back(i);
  }
  const Solved shifted = solver(x);
  Solved out{std::vector<double>(n, 0.0), shifted.tau + scale * z_max / temperature};
  for (std::size_t j = 0; j < index.size(); ++j) out.y[index[j]] = shifted.y[j];
  return out;
}

// The solver rownorm_forward uses for a given alpha (1 = softmax).
Solver solver_for(double alpha) {
  if (alpha == 1.0) return solve_softmax;
  if (alpha == 2.0) return solve_sparsemax_sort;
  if (alpha == 1.5) return solve_entmax15_sort;
  return [alpha](std::span<const double> x) { return solve_entmax_bisection(x, alpha); };
}

Solved solve_spec(const RowNormSpec& spec, std::span<const double> z, double temperature) {
  const double alpha = effective_alpha(spec);
  return solve_row(z, alpha, temperature, solver_for(alpha));
}

}  // namespace

std::vector<double> rownorm_forward(const RowNormSpec& spec, std::span<const double> z, double temperature) {
  return solve_spec(spec, z, temperature).y;
}

double threshold(const RowNormSpec& spec, std::span<const double> z, double temperature) {
  return solve_spec(spec, z, temperature).tau;
}

// Jacobian-vector product (Peters et al. 2019, Proposition 2). On the support, with x = (alpha-1) z / T,
// dy_i/dx_j = (1/(alpha-1)) y_i^(2-alpha) (delta_ij - dtau/dx_j) and dtau/dx_j = s_j / sum(s) for
// s = y^(2-alpha); the chain factor dx/dz = (alpha-1)/T cancels the 1/(alpha-1), leaving
// J = (diag(s) - s s^T / sum(s)) / T, symmetric. Softmax (alpha -> 1) gives s = y, sparsemax s = 1.
std::vector<double> rownorm_backward(const RowNormSpec& spec, std::span<const double> y,
                                     std::span<const double> dy, double temperature) {
  const double alpha = effective_alpha(spec);
  check_temperature(temperature);
  if (y.size() != dy.size()) {
    throw InvalidArgument(fmt::format(
        "rownorm reference: backward got y of length {} and dy of length {}; they must be equal",
        y.size(), dy.size()));
  }
  std::vector<double> s(y.size());
  for (std::size_t i = 0; i < y.size(); ++i) {
    if (std::isnan(y[i])) s[i] = y[i];  // let a NaN in y propagate like ordinary arithmetic would
    else if (alpha == 1.0) s[i] = y[i];
    else if (!(y[i] > 0.0)) s[i] = 0.0;
    else if (alpha == 2.0) s[i] = 1.0;
    else s[i] = std::pow(y[i], 2.0 - alpha);
  }
  double s_dot_dy = 0.0, s_sum = 0.0;
  for (std::size_t i = 0; i < y.size(); ++i) {
    s_dot_dy += s[i] * dy[i];
    s_sum += s[i];
  }
  const double mean_dy = s_dot_dy / s_sum;  // the <s,dy>-weighted mean that dtau carries back
  std::vector<double> dz(y.size());
  for (std::size_t i = 0; i < y.size(); ++i) dz[i] = (s[i] * dy[i] - s[i] * mean_dy) / temperature;
  return dz;
}

std::vector<double> sparsemax_by_sort(std::span<const double> z) {
  return solve_row(z, 2.0, 1.0, solve_sparsemax_sort).y;
}

std::vector<double> entmax15_by_sort(std::span<const double> z) {
  return solve_row(z, 1.5, 1.0, solve_entmax15_sort).y;
}

std::vector<double> entmax_by_bisection(std::span<const double> z, double alpha) {
  check_entmax_alpha(alpha);
  return solve_row(z, alpha, 1.0, [alpha](std::span<const double> x) { return solve_entmax_bisection(x, alpha); }).y;
}

std::vector<double> softmax(std::span<const double> z) {
  return solve_row(z, 1.0, 1.0, solve_softmax).y;
}

}  // namespace sjit::reference

// Float64 CPU reference of the E23 dual-memory Elman cell (see e23_reference.h and docs/e23.md).
//
// Forward, per batch row, step t (M = M_t, h = h_t, f = the row normalizer, s = scale):
//   r = s M h,  a = f(r),  v = M^T a
//   z = W_h h + u_t + v,  h' = tanh(z)                          (h' = h_{t+1} = y_t)
//   w = W_w h',  q = s M h',  b = f(q),  M'_i = (1 - b_i) M_i + b_i w   (M' = M_{t+1})
//
// Backward through time. Write g_X for dL/dX. Going from t = T-1 down to 0 with g_h' = dy_t + g_{h_{t+1}}
// (g_{h_T} = dh_final) and g_M' = g_{M_{t+1}} (g_{M_T} = dm_final), each step undoes the forward in reverse:
//   write:  g_w = sum_i b_i g_M'_i               g_b_i = <g_M'_i, w - M_i>        g_M_i = (1 - b_i) g_M'_i
//           g_q = J_f(q) g_b                     g_M_i += s g_q_i h'               g_h' += s M^T g_q
//           g_W_w += g_w h'^T                    g_h' += W_w^T g_w
//   update: g_z = g_h' * (1 - h'^2)              g_u_t = g_z   g_v = g_z   g_W_h += g_z h^T   g_h = W_h^T g_z
//   read:   g_a_i = <M_i, g_v>                   g_M_i += a_i g_v
//           g_r = J_f(r) g_a                     g_M_i += s g_r_i h                g_h += s M^T g_r
// J_f is symmetric, J_f = diag(c) - c c^T / sum(c) with c_i = f_i^(2 - alpha) on the support and 0 off
// it (Peters, Niculae & Martins 2019, Prop. 2; softmax c = f, sparsemax c = 1 on the support, Martins &
// Astudillo 2016): rownorm_backward computes J_f g from the forward's output alone.
// M_t feeds both the read and the write of step t, so g_M_t collects the three terms of each.
//
// The same code runs in fp32 (R = float) for e23_reference_fp32.h: the GPU tests' measure of how far an
// honest fp32 computation of a draw lands from the float64 one.
#include "sparsejit/e23_reference.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <random>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "sparsejit/error.h"
#include "sparsejit/reference.h"
#include "reference/arithmetic.h"
#include "reference/e23_reference_fp32.h"

namespace sjit::reference {
namespace {

// The sizes of one call, checked.
struct Shape {
  std::int64_t batch, steps, slots, dim;
};

// What one batch row's step needs besides the state: the normalizer, the scale and the weights, in
// the arithmetic R (double; float for the fp32 twin).
template <class R>
struct Cell {
  RowNormSpec norm;
  R scale;
  std::int64_t slots, dim;
  ValuesIn<R> w_h, w_w;
};

// Every state of the forward, kept for the backward.
template <class R>
struct Trace {
  std::vector<R> h;      // [T + 1, B, D]: h_0, then y_0 .. y_{T-1}
  std::vector<R> m;      // [T + 1, B, N, D]: M_0 .. M_T
  std::vector<R> read;   // [T, B, N] read weights a
  std::vector<R> write;  // [T, B, N] write weights b
  std::vector<R> value;  // [T, B, D] write values w
};

// The row normalizers in R: the float64 reference of the rounded scores, rounded once (the fp32 twin
// leaves out the normalizer's own rounding, a few ulps of the weights).
template <class R>
std::vector<R> normalize(const RowNormSpec& spec, const std::vector<R>& scores) {
  const std::vector<double> wide(scores.begin(), scores.end());
  const std::vector<double> out = rownorm_forward(spec, wide);
  return std::vector<R>(out.begin(), out.end());
}

template <class R>
std::vector<R> normalize_backward(const RowNormSpec& spec, std::span<const R> weights, const std::vector<R>& g) {
  const std::vector<double> y(weights.begin(), weights.end()), dy(g.begin(), g.end());
  const std::vector<double> out = rownorm_backward(spec, y, dy);
  return std::vector<R>(out.begin(), out.end());
}

std::string shape_text(std::initializer_list<std::int64_t> dims) {
  std::string text = "[";
  for (std::int64_t d : dims) text += (text.size() > 1 ? ", " : "") + std::to_string(d);
  return text + "]";
}

void check_size(std::string_view argument, std::size_t actual, std::string_view shape_name,
                std::initializer_list<std::int64_t> dims) {
  std::int64_t expected = 1;
  for (std::int64_t d : dims) expected *= d;
  if (static_cast<std::int64_t>(actual) != expected)
    throw InvalidArgument(fmt::format("e23 reference: {} has {} elements but {} = {} needs {}", argument, actual,
                                      shape_name, shape_text(dims), expected));
}

template <class R>
Cell<R> make_cell(const E23Spec& spec, const E23Weights& w) {
  if (spec.n_slots < 1)
    throw InvalidArgument(fmt::format("e23 reference: spec.n_slots = {} is not allowed; it must be >= 1", spec.n_slots));
  if (spec.dim < 1)
    throw InvalidArgument(fmt::format("e23 reference: spec.dim = {} is not allowed; it must be >= 1", spec.dim));
  if (!(std::isfinite(spec.scale) && spec.scale >= 0.0f))
    throw InvalidArgument(fmt::format(
        "e23 reference: spec.scale = {} is not allowed; it must be finite and > 0, or 0 for 1/sqrt(dim)", spec.scale));
  if (spec.kind == NormKind::entmax && !(std::isfinite(spec.alpha) && spec.alpha >= 1.0f))
    throw InvalidArgument(fmt::format(
        "e23 reference: spec.alpha = {} is not allowed; entmax takes a finite alpha >= 1", spec.alpha));
  if (spec.kind != NormKind::softmax && spec.kind != NormKind::sparsemax && spec.kind != NormKind::entmax)
    throw InvalidArgument(fmt::format("e23 reference: spec.kind = {} is not a NormKind", static_cast<int>(spec.kind)));
  const std::int64_t d = spec.dim;
  check_size("w.w_h", w.w_h.size(), "[dim, dim]", {d, d});
  check_size("w.w_w", w.w_w.size(), "[dim, dim]", {d, d});
  RowNormSpec norm;
  norm.kind = spec.kind;
  norm.alpha = spec.alpha;
  norm.n = spec.n_slots;
  const double scale = spec.scale == 0.0f ? 1.0 / std::sqrt(static_cast<double>(d)) : static_cast<double>(spec.scale);
  return {norm, static_cast<R>(scale), spec.n_slots, d, ValuesIn<R>(w.w_h), ValuesIn<R>(w.w_w)};
}

template <class R>
Shape check_inputs(const Cell<R>& cell, std::int64_t batch, std::int64_t steps, std::span<const double> u,
                   std::span<const double> h0, std::span<const double> m0) {
  if (batch < 0) throw InvalidArgument(fmt::format("e23 reference: batch = {} is not allowed; it must be >= 0", batch));
  if (steps < 0) throw InvalidArgument(fmt::format("e23 reference: steps = {} is not allowed; it must be >= 0", steps));
  const Shape s{batch, steps, cell.slots, cell.dim};
  check_size("u", u.size(), "[steps, batch, dim]", {s.steps, s.batch, s.dim});
  check_size("h0", h0.size(), "[batch, dim]", {s.batch, s.dim});
  check_size("m0", m0.size(), "[batch, n_slots, dim]", {s.batch, s.slots, s.dim});
  return s;
}

template <class R>
R dot(const R* x, const R* y, std::int64_t n) {
  R sum = 0;
  for (std::int64_t j = 0; j < n; ++j) sum += x[j] * y[j];
  return sum;
}

// scores_i = scale * <M_i, x>
template <class R>
std::vector<R> slot_scores(const Cell<R>& cell, const R* m, const R* x) {
  std::vector<R> scores(cell.slots);
  for (std::int64_t i = 0; i < cell.slots; ++i) scores[i] = cell.scale * dot(m + i * cell.dim, x, cell.dim);
  return scores;
}

// One step of one batch row: h, m (the state) and u_t in; h_next, m_next, a, b, w out.
template <class R>
void step_forward(const Cell<R>& cell, const R* h, const R* m, const R* u_t, R* h_next, R* m_next, R* a, R* b, R* w) {
  const std::int64_t n = cell.slots, d = cell.dim;
  const std::vector<R> read = normalize(cell.norm, slot_scores(cell, m, h));
  for (std::int64_t k = 0; k < d; ++k) {
    R z = dot(&cell.w_h[k * d], h, d) + u_t[k];
    for (std::int64_t i = 0; i < n; ++i) z += read[i] * m[i * d + k];  // v = M^T a
    h_next[k] = std::tanh(z);
  }
  for (std::int64_t k = 0; k < d; ++k) w[k] = dot(&cell.w_w[k * d], h_next, d);
  const std::vector<R> write = normalize(cell.norm, slot_scores(cell, m, h_next));
  for (std::int64_t i = 0; i < n; ++i) {
    for (std::int64_t k = 0; k < d; ++k) m_next[i * d + k] = (R(1) - write[i]) * m[i * d + k] + write[i] * w[k];
    a[i] = read[i];
    b[i] = write[i];
  }
}

template <class R>
Trace<R> run_forward(const Cell<R>& cell, const Shape& s, std::span<const double> u, std::span<const double> h0,
                     std::span<const double> m0) {
  const std::int64_t hd = s.batch * s.dim, md = s.batch * s.slots * s.dim, an = s.batch * s.slots;
  const ValuesIn<R> u_here(u);
  Trace<R> tr;
  tr.h.resize((s.steps + 1) * hd);
  tr.m.resize((s.steps + 1) * md);
  tr.read.resize(s.steps * an);
  tr.write.resize(s.steps * an);
  tr.value.resize(s.steps * hd);
  std::copy(h0.begin(), h0.end(), tr.h.begin());
  std::copy(m0.begin(), m0.end(), tr.m.begin());
  for (std::int64_t t = 0; t < s.steps; ++t) {
    for (std::int64_t b = 0; b < s.batch; ++b) {
      const std::int64_t hb = b * s.dim, mb = b * s.slots * s.dim, ab = b * s.slots;
      step_forward(cell, &tr.h[t * hd + hb], &tr.m[t * md + mb], &u_here[t * hd + hb], &tr.h[(t + 1) * hd + hb],
                   &tr.m[(t + 1) * md + mb], &tr.read[t * an + ab], &tr.write[t * an + ab], &tr.value[t * hd + hb]);
    }
  }
  return tr;
}

// Mean over batch rows of the number of positive weights in each [N] row of `weights` ([T, B, N]).
template <class R>
std::vector<double> mean_support(const std::vector<R>& weights, const Shape& s) {
  std::vector<double> support(s.steps, 0.0);
  if (s.batch == 0) return support;
  for (std::int64_t t = 0; t < s.steps; ++t) {
    std::int64_t count = 0;
    for (std::int64_t j = 0; j < s.batch * s.slots; ++j) count += weights[t * s.batch * s.slots + j] > R(0);
    support[t] = static_cast<double>(count) / static_cast<double>(s.batch);
  }
  return support;
}

// The state a step's backward reads: the forward values of that step for one batch row.
template <class R>
struct StepState {
  const R *h, *m, *h_next, *a, *b, *w;
};

// Backward of one step of one batch row (the equations at the top of the file). In: g_h_next (g_h',
// already holding dy_t), g_m_next (g_M'). Out: g_h, g_m, g_u; dw_h and dw_w are accumulated.
template <class R>
void step_backward(const Cell<R>& cell, const StepState<R>& st, std::vector<R> g_h_next, const R* g_m_next, R* g_h,
                   R* g_m, R* g_u, R* dw_h, R* dw_w) {
  const std::int64_t n = cell.slots, d = cell.dim;
  // write: M'_i = (1 - b_i) M_i + b_i w
  std::vector<R> g_w(d, R(0)), g_b(n);
  for (std::int64_t i = 0; i < n; ++i) {
    R g_bi = 0;
    for (std::int64_t k = 0; k < d; ++k) {
      const R g = g_m_next[i * d + k];
      g_w[k] += st.b[i] * g;
      g_bi += g * (st.w[k] - st.m[i * d + k]);
      g_m[i * d + k] = (R(1) - st.b[i]) * g;
    }
    g_b[i] = g_bi;
  }
  // b = f(q), q = s M h'
  const std::vector<R> g_q = normalize_backward(cell.norm, std::span<const R>(st.b, n), g_b);
  for (std::int64_t i = 0; i < n; ++i) {
    for (std::int64_t k = 0; k < d; ++k) {
      g_m[i * d + k] += cell.scale * g_q[i] * st.h_next[k];
      g_h_next[k] += cell.scale * g_q[i] * st.m[i * d + k];
    }
  }
  // w = W_w h'
  for (std::int64_t r = 0; r < d; ++r) {
    for (std::int64_t c = 0; c < d; ++c) {
      dw_w[r * d + c] += g_w[r] * st.h_next[c];
      g_h_next[c] += cell.w_w[r * d + c] * g_w[r];
    }
  }
  // h' = tanh(z), z = W_h h + u + v
  std::vector<R> g_z(d);
  for (std::int64_t k = 0; k < d; ++k) g_z[k] = g_h_next[k] * (R(1) - st.h_next[k] * st.h_next[k]);
  for (std::int64_t k = 0; k < d; ++k) {
    g_u[k] = g_z[k];
    g_h[k] = 0;
  }
  for (std::int64_t r = 0; r < d; ++r) {
    for (std::int64_t c = 0; c < d; ++c) {
      dw_h[r * d + c] += g_z[r] * st.h[c];
      g_h[c] += cell.w_h[r * d + c] * g_z[r];
    }
  }
  // v = M^T a (g_v = g_z)
  std::vector<R> g_a(n);
  for (std::int64_t i = 0; i < n; ++i) {
    g_a[i] = dot(st.m + i * d, g_z.data(), d);
    for (std::int64_t k = 0; k < d; ++k) g_m[i * d + k] += st.a[i] * g_z[k];
  }
  // a = f(r), r = s M h
  const std::vector<R> g_r = normalize_backward(cell.norm, std::span<const R>(st.a, n), g_a);
  for (std::int64_t i = 0; i < n; ++i) {
    for (std::int64_t k = 0; k < d; ++k) {
      g_m[i * d + k] += cell.scale * g_r[i] * st.h[k];
      g_h[k] += cell.scale * g_r[i] * st.m[i * d + k];
    }
  }
}

template <class R>
E23Sequence forward_in(const E23Spec& spec, std::int64_t batch, std::int64_t steps, std::span<const double> u,
                       std::span<const double> h0, std::span<const double> m0, const E23Weights& w) {
  const Cell<R> cell = make_cell<R>(spec, w);
  const Shape s = check_inputs(cell, batch, steps, u, h0, m0);
  const Trace<R> tr = run_forward(cell, s, u, h0, m0);
  const std::size_t hd = s.batch * s.dim, md = s.batch * s.slots * s.dim;
  E23Sequence out;
  out.y = widened(tr.h, hd);
  out.h_final = widened(tr.h, tr.h.size() - hd);
  out.m_final = widened(tr.m, tr.m.size() - md);
  out.read_support = mean_support(tr.read, s);
  out.write_support = mean_support(tr.write, s);
  return out;
}

template <class R>
E23Gradients backward_in(const E23Spec& spec, std::int64_t batch, std::int64_t steps, std::span<const double> u,
                         std::span<const double> h0, std::span<const double> m0, const E23Weights& w,
                         std::span<const double> dy, std::span<const double> dh_final,
                         std::span<const double> dm_final) {
  const Cell<R> cell = make_cell<R>(spec, w);
  const Shape s = check_inputs(cell, batch, steps, u, h0, m0);
  check_size("dy", dy.size(), "[steps, batch, dim]", {s.steps, s.batch, s.dim});
  if (!dh_final.empty()) check_size("dh_final", dh_final.size(), "[batch, dim] (or empty for zero)", {s.batch, s.dim});
  if (!dm_final.empty())
    check_size("dm_final", dm_final.size(), "[batch, n_slots, dim] (or empty for zero)", {s.batch, s.slots, s.dim});

  const Trace<R> tr = run_forward(cell, s, u, h0, m0);
  const std::int64_t hd = s.batch * s.dim, md = s.batch * s.slots * s.dim, an = s.batch * s.slots;
  const ValuesIn<R> dy_here(dy);
  std::vector<R> du(s.steps * hd, R(0)), dw_h(s.dim * s.dim, R(0)), dw_w(s.dim * s.dim, R(0));
  // dh and dm carry g_{h_t} and g_{M_t} down the steps; at t = 0 they are dh0 and dm0.
  std::vector<R> dh = dh_final.empty() ? std::vector<R>(hd, R(0)) : in_arithmetic<R>(dh_final);
  std::vector<R> dm = dm_final.empty() ? std::vector<R>(md, R(0)) : in_arithmetic<R>(dm_final);
  std::vector<R> g_m(md);
  for (std::int64_t t = s.steps - 1; t >= 0; --t) {
    for (std::int64_t b = 0; b < s.batch; ++b) {
      const std::int64_t hb = b * s.dim, mb = b * s.slots * s.dim, ab = b * s.slots;
      const StepState<R> st{&tr.h[t * hd + hb],    &tr.m[t * md + mb],     &tr.h[(t + 1) * hd + hb],
                            &tr.read[t * an + ab], &tr.write[t * an + ab], &tr.value[t * hd + hb]};
      std::vector<R> g_h_next(dy_here.begin() + t * hd + hb, dy_here.begin() + t * hd + hb + s.dim);
      for (std::int64_t k = 0; k < s.dim; ++k) g_h_next[k] += dh[hb + k];
      step_backward(cell, st, std::move(g_h_next), &dm[mb], &dh[hb], &g_m[mb], &du[t * hd + hb], dw_h.data(),
                    dw_w.data());
    }
    dm.swap(g_m);
  }
  return {widened(du), widened(dh), widened(dm), widened(dw_h), widened(dw_w)};
}

}  // namespace

E23Sequence e23_forward(const E23Spec& spec, std::int64_t batch, std::int64_t steps, std::span<const double> u,
                        std::span<const double> h0, std::span<const double> m0, const E23Weights& w) {
  return forward_in<double>(spec, batch, steps, u, h0, m0, w);
}

E23Gradients e23_backward(const E23Spec& spec, std::int64_t batch, std::int64_t steps, std::span<const double> u,
                          std::span<const double> h0, std::span<const double> m0, const E23Weights& w,
                          std::span<const double> dy, std::span<const double> dh_final,
                          std::span<const double> dm_final) {
  return backward_in<double>(spec, batch, steps, u, h0, m0, w, dy, dh_final, dm_final);
}

namespace {

// v with each entry scaled by 1 +- 2^-24 (random signs): one fp32 rounding of each.
std::vector<double> moved_by_one_rounding(std::span<const double> v, std::mt19937_64& rng) {
  std::bernoulli_distribution up(0.5);
  std::vector<double> out(v.begin(), v.end());
  for (double& x : out) x *= 1.0 + (up(rng) ? 0x1p-24 : -0x1p-24);
  return out;
}

// The inputs both sensitivities move: u, h0 and m0, each by one rounding, drawn from `seed` in that order
// (a braced list fixes the order, which a function call's arguments would leave to the compiler).
struct MovedInputs {
  std::vector<double> u, h0, m0;
};
MovedInputs moved_inputs(std::span<const double> u, std::span<const double> h0, std::span<const double> m0,
                         std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  return {moved_by_one_rounding(u, rng), moved_by_one_rounding(h0, rng), moved_by_one_rounding(m0, rng)};
}

}  // namespace

double row_relative_distance(std::span<const double> a, std::span<const double> b, std::int64_t row_len,
                             double floor) {
  if (a.size() != b.size() || row_len < 1)
    throw InvalidArgument(fmt::format("row_relative_distance: sizes {} and {} with rows of {}: the sizes must be "
                                      "equal and the rows at least 1 long", a.size(), b.size(), row_len));
  double worst = 0.0;
  for (std::size_t row = 0; row * row_len < b.size(); ++row) {
    const std::size_t begin = row * row_len, end = std::min(b.size(), begin + std::size_t(row_len));
    double scale = floor, diff = 0.0;
    for (std::size_t k = begin; k < end; ++k) {
      scale = std::max(scale, std::abs(b[k]));
      diff = std::max(diff, std::abs(a[k] - b[k]));
    }
    worst = std::max(worst, diff / scale);
  }
  return worst;
}

double gradient_row_floor(std::span<const double> gradient) {
  double largest = 0.0;
  for (double x : gradient) largest = std::max(largest, std::abs(x));
  return std::max(0.1 * largest, 1e-12);
}

E23ForwardSensitivity e23_forward_sensitivity(const E23Spec& spec, std::int64_t batch, std::int64_t steps,
                                              std::span<const double> u, std::span<const double> h0,
                                              std::span<const double> m0, const E23Weights& w, std::uint64_t seed) {
  E23ForwardSensitivity out;
  out.at = e23_forward(spec, batch, steps, u, h0, m0, w);
  const MovedInputs in = moved_inputs(u, h0, m0, seed);
  const E23Sequence moved = e23_forward(spec, batch, steps, in.u, in.h0, in.m0, w);
  out.support_moved = moved.read_support != out.at.read_support || moved.write_support != out.at.write_support;
  out.distance = sequence_distance(moved, out.at, spec.dim);
  return out;
}

E23BackwardSensitivity e23_backward_sensitivity(const E23Spec& spec, std::int64_t batch, std::int64_t steps,
                                                std::span<const double> u, std::span<const double> h0,
                                                std::span<const double> m0, const E23Weights& w,
                                                std::span<const double> dy, std::span<const double> dh_final,
                                                std::span<const double> dm_final, std::uint64_t seed) {
  E23BackwardSensitivity out;
  out.at = e23_backward(spec, batch, steps, u, h0, m0, w, dy, dh_final, dm_final);
  const MovedInputs in = moved_inputs(u, h0, m0, seed);
  const E23Gradients moved = e23_backward(spec, batch, steps, in.u, in.h0, in.m0, w, dy, dh_final, dm_final);
  out.distance = gradient_distance(moved, out.at, spec.dim);
  return out;
}

double sequence_distance(const E23Sequence& other, const E23Sequence& exact, std::int64_t dim) {
  return std::max({row_relative_distance(other.y, exact.y, dim, 1.0),
                   row_relative_distance(other.h_final, exact.h_final, dim, 1.0),
                   row_relative_distance(other.m_final, exact.m_final, dim, 1.0)});
}

double gradient_distance(const E23Gradients& other, const E23Gradients& exact, std::int64_t dim) {
  double worst = 0.0;
  for (const auto& [got, want] : {std::pair{&other.du, &exact.du}, std::pair{&other.dh0, &exact.dh0},
                                  std::pair{&other.dm0, &exact.dm0}, std::pair{&other.dw_h, &exact.dw_h},
                                  std::pair{&other.dw_w, &exact.dw_w}})
    worst = std::max(worst, row_relative_distance(*got, *want, dim, gradient_row_floor(*want)));
  return worst;
}

E23Sequence e23_forward_fp32(const E23Spec& spec, std::int64_t batch, std::int64_t steps, std::span<const double> u,
                             std::span<const double> h0, std::span<const double> m0, const E23Weights& w) {
  return forward_in<float>(spec, batch, steps, u, h0, m0, w);
}

E23Gradients e23_backward_fp32(const E23Spec& spec, std::int64_t batch, std::int64_t steps, std::span<const double> u,
                               std::span<const double> h0, std::span<const double> m0, const E23Weights& w,
                               std::span<const double> dy, std::span<const double> dh_final,
                               std::span<const double> dm_final) {
  return backward_in<float>(spec, batch, steps, u, h0, m0, w, dy, dh_final, dm_final);
}

}  // namespace sjit::reference

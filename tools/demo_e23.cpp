// sjit demo, E23: the forward over a short sequence with 1.5-entmax and with softmax, and the backward
// through time of the softmax cell, on fresh random bf16 inputs against the float64 reference
// (sparsejit/e23_reference.h), with the bounds of tests/gpu/test_e23*_gpu.cpp.
#include <fmt/format.h>

#include <cmath>

#include "demo.h"

namespace sjit::tool::demo {
namespace {

constexpr std::int64_t kBatch = 2, kSteps = 4;

// The tests' contractive regime (tests/gpu/test_e23_common.h): weights N(0, 0.5^2 / D), tape N(0, 1),
// u and h0 N(0, 0.5^2). There a rounding of the inputs mostly shrinks from step to step, but not
// always: with f32 and many slots or wide states (sparsemax N = 256 or 1.5-entmax N = 32, D = 512) a
// few draws in twenty carry it past the f32 bounds in four steps, where a correct kernel can miss them.
// So, as the GPU tests do, a draw is replaced when the reference moves by more than an eighth of the
// bound as the inputs move by one fp32 rounding (reference::e23_forward_sensitivity), or a support size
// moves (the backward's check: when its gradients move by more than a 32nd of their bound), at most
// three times; a draw's bound is the tolerance or 32 times its move, whichever is larger.
struct Inputs {
  Tensor u, h0, m0, w_h, w_w;
  reference::E23Weights weights() const { return {w_h.values, w_w.values}; }
};
constexpr int kDraws = 4;
constexpr double kConditionMargin = 8, kErrorPerMove = 32;

Inputs random_inputs(const E23Spec& spec, std::mt19937_64& rng) {
  const std::int64_t d = spec.dim, n = spec.n_slots;
  const float w_scale = 0.5f / std::sqrt(float(d));
  return {random_tensor(kSteps * kBatch * d, spec.dtype, rng, 0.5f), random_tensor(kBatch * d, spec.dtype, rng, 0.5f),
          random_tensor(kBatch * n * d, spec.dtype, rng, 1.0f), random_tensor(d * d, spec.dtype, rng, w_scale),
          random_tensor(d * d, spec.dtype, rng, w_scale)};
}

// The bound a draw is checked against: `tol`, or 32 times its move where that is larger, which the
// outcome's note then gives.
double bound_for(double tol, double move, Outcome& out) {
  const double bound = std::max(tol, kErrorPerMove * move);
  if (bound > tol) out.note = fmt::format("bound {} (32 x the reference's move under one rounding)", compact(bound));
  return bound;
}

E23ForwardArgs forward_args(const Inputs& in) {
  E23ForwardArgs a;
  a.u = in.u.device.data(), a.h0 = in.h0.device.data(), a.m0 = in.m0.device.data();
  a.w_h = in.w_h.device.data(), a.w_w = in.w_w.device.data();
  a.batch = kBatch, a.steps = kSteps;
  return a;
}

// Every row of D elements within tol * max(floor, max |want| in the row), as the tests' expect_rows().
void add_rows(Outcome& out, const std::vector<float>& got, const std::vector<double>& want, int d, double tol,
              double floor) {
  for (std::size_t row = 0; row * d < want.size(); ++row) {
    double scale = floor;
    for (int k = 0; k < d; ++k) scale = std::max(scale, std::abs(want[row * d + k]));
    for (int k = 0; k < d; ++k) out.add(std::abs(got[row * d + k] - want[row * d + k]) / scale, tol);
  }
}

// y, h_final and m_final relative to max(1, max |want| in the row): bf16 1e-2, f32 5e-4 (several steps).
double forward_tolerance(DType dtype) { return dtype == DType::f32 ? 5e-4 : dtype == DType::f16 ? 5e-3 : 1e-2; }
double backward_tolerance(DType dtype) { return dtype == DType::f32 ? 2e-3 : dtype == DType::f16 ? 5e-3 : 2e-2; }

}  // namespace

Outcome check_e23_forward(const E23Spec& spec, std::mt19937_64& rng) {
  const double tol = forward_tolerance(spec.dtype);
  Inputs in = random_inputs(spec, rng);
  reference::E23ForwardSensitivity moved;  // and, in moved.at, the reference's outputs
  for (int draw = 1;; ++draw, in = random_inputs(spec, rng)) {
    moved = reference::e23_forward_sensitivity(spec, kBatch, kSteps, in.u.values, in.h0.values, in.m0.values,
                                               in.weights(), rng());
    if ((!moved.support_moved && kConditionMargin * moved.distance <= tol) || draw == kDraws) break;
  }
  const std::size_t e = size_of(spec.dtype), bd = std::size_t(kBatch * spec.dim), bnd = bd * spec.n_slots;
  DeviceBuffer y = poisoned(kSteps * bd * e), h = poisoned(bd * e), m = poisoned(bnd * e), support = poisoned(kSteps * 4);
  E23ForwardArgs a = forward_args(in);
  a.y = y.data(), a.h_final = h.data(), a.m_final = m.data(), a.read_support = support.as<float>();
  E23(spec).forward_sequence(a);
  synchronize();
  const reference::E23Sequence& want = moved.at;
  Outcome out;
  const double bound = bound_for(tol, moved.distance, out);
  add_rows(out, download(y, spec.dtype, kSteps * bd), want.y, spec.dim, bound, 1.0);
  add_rows(out, download(h, spec.dtype, bd), want.h_final, spec.dim, bound, 1.0);
  add_rows(out, download(m, spec.dtype, bnd), want.m_final, spec.dim, bound, 1.0);
  double mean_support = 0;
  for (float s : download(support, DType::f32, kSteps)) mean_support += s / kSteps;
  out.note = fmt::format("read support {:.1f}/{}{}", mean_support, spec.n_slots, out.note.empty() ? "" : ", " + out.note);
  return out;
}

// du, dh0, dm0, dW_h, dW_w relative to max(max |want| in the row, 0.1 max |want| in the tensor): bf16
// 2e-2, f32 2e-3 (several steps).
Outcome check_e23_backward(const E23Spec& spec, std::mt19937_64& rng) {
  const std::int64_t d = spec.dim, bd = kBatch * d, bnd = bd * spec.n_slots;
  const double tol = backward_tolerance(spec.dtype);
  // Drawn as the forward's check draws (above), the gradients' move held to a 32nd of their bound too.
  struct Draw {
    Inputs in;
    Tensor dy, dh_final, dm_final;
  };
  auto draw_all = [&] {
    Inputs in = random_inputs(spec, rng);
    return Draw{std::move(in), random_tensor(kSteps * bd, spec.dtype, rng, 0.5f), random_tensor(bd, spec.dtype, rng, 0.5f),
                random_tensor(bnd, spec.dtype, rng, 0.5f)};
  };
  Draw drawn = draw_all();
  reference::E23BackwardSensitivity moved;  // and, in moved.at, the reference's gradients
  for (int draw = 1;; ++draw, drawn = draw_all()) {
    const Inputs& in = drawn.in;
    const reference::E23ForwardSensitivity forward = reference::e23_forward_sensitivity(
        spec, kBatch, kSteps, in.u.values, in.h0.values, in.m0.values, in.weights(), rng());
    moved = reference::e23_backward_sensitivity(spec, kBatch, kSteps, in.u.values, in.h0.values, in.m0.values,
                                                in.weights(), drawn.dy.values, drawn.dh_final.values,
                                                drawn.dm_final.values, rng());
    const bool well_conditioned = !forward.support_moved &&
                                  kConditionMargin * forward.distance <= forward_tolerance(spec.dtype) &&
                                  kErrorPerMove * moved.distance <= tol;
    if (well_conditioned || draw == kDraws) break;
  }
  const Inputs& in = drawn.in;
  const Tensor &dy = drawn.dy, &dh_final = drawn.dh_final, &dm_final = drawn.dm_final;
  const std::size_t e = size_of(spec.dtype);
  E23 cell(spec);
  DeviceBuffer y(kSteps * bd * e), saved(cell.saved_bytes(kBatch, kSteps));
  E23ForwardArgs f = forward_args(in);
  f.y = y.data(), f.saved = saved.data();
  cell.forward_sequence(f);

  DeviceBuffer du = poisoned(kSteps * bd * e), dh0 = poisoned(bd * e), dm0 = poisoned(bnd * e),
               dw_h = poisoned(d * d * e), dw_w = poisoned(d * d * e);
  E23BackwardArgs b;
  b.w_h = in.w_h.device.data(), b.w_w = in.w_w.device.data(), b.saved = saved.data();
  b.dy = dy.device.data(), b.dh_final = dh_final.device.data(), b.dm_final = dm_final.device.data();
  b.du = du.data(), b.dh0 = dh0.data(), b.dm0 = dm0.data(), b.dw_h = dw_h.data(), b.dw_w = dw_w.data();
  b.batch = kBatch, b.steps = kSteps;
  cell.backward_sequence(b);
  synchronize();
  const reference::E23Gradients& want = moved.at;
  Outcome out;
  const double bound = bound_for(tol, moved.distance, out);
  for (const auto& [buffer, exact] : {std::pair{&du, &want.du}, std::pair{&dh0, &want.dh0}, std::pair{&dm0, &want.dm0},
                                      std::pair{&dw_h, &want.dw_h}, std::pair{&dw_w, &want.dw_w}})
    add_rows(out, download(*buffer, spec.dtype, exact->size()), *exact, spec.dim, bound,
             reference::gradient_row_floor(*exact));
  return out;
}

std::string e23_check_run() { return fmt::format("B{} T{}", kBatch, kSteps); }

std::string e23_bound(DType dtype, bool backward) {
  return fmt::format("{} x row scale", compact(backward ? backward_tolerance(dtype) : forward_tolerance(dtype)));
}

std::vector<Case> e23_cases(std::mt19937_64& rng) {
  const E23Spec entmax = e23_spec(NormKind::entmax, 1.5f, 8, 64, DType::bf16);
  const E23Spec softmax = e23_spec(NormKind::softmax, 1.0f, 8, 64, DType::bf16);
  const std::string run = e23_check_run();
  return {
      {key(entmax), "fwd " + run, {key(entmax) + "|pass=fwd"}, e23_bound(entmax.dtype, false),
       [=, &rng] { return check_e23_forward(entmax, rng); }},
      {key(softmax), "fwd " + run, {key(softmax) + "|pass=fwd"}, e23_bound(softmax.dtype, false),
       [=, &rng] { return check_e23_forward(softmax, rng); }},
      {key(softmax), "fwd+bwd " + run, {key(softmax) + "|pass=bwd"}, e23_bound(softmax.dtype, true),
       [=, &rng] { return check_e23_backward(softmax, rng); }},
  };
}

}  // namespace sjit::tool::demo

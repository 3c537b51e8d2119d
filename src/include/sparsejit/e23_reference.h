// Float64 CPU reference of the E23 dual-memory Elman cell (docs/e23.md): forward over a sequence and
// backward through time. The oracle for the E23 kernels; slow and simple on purpose.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "sparsejit/e23_spec.h"

namespace sjit::reference {

// Layouts (row-major, the last index fastest): u and y [T, B, D], h [B, D], M [B, N, D] (slot i of batch
// row b at (b * N + i) * D), weights [D, D] with (W h)_i = sum_j W[i * D + j] h_j.
//
// The reference reads spec.kind, spec.alpha, spec.n_slots (N), spec.dim (D) and spec.scale (0: exactly
// 1/sqrt(D) in float64); spec.dtype is ignored. It takes any N >= 1 and D >= 1: the kernels' limits on
// N and D (canonical(E23Spec)) do not apply, so gradient checks can use tiny sizes.
struct E23Weights {
  std::span<const double> w_h;  // [D, D], the recurrence
  std::span<const double> w_w;  // [D, D], the write value w = W_w h'
};

struct E23Sequence {
  std::vector<double> y;              // [T, B, D], y_t = h_{t+1}
  std::vector<double> h_final;        // [B, D]
  std::vector<double> m_final;        // [B, N, D]
  std::vector<double> read_support;   // [T], mean over batch rows of #{i : a_i > 0} (0 for an empty batch)
  std::vector<double> write_support;  // [T], the same for the write weights b
};

E23Sequence e23_forward(const E23Spec& spec, std::int64_t batch, std::int64_t steps, std::span<const double> u,
                        std::span<const double> h0, std::span<const double> m0, const E23Weights& w);

struct E23Gradients {
  std::vector<double> du;    // [T, B, D]
  std::vector<double> dh0;   // [B, D]
  std::vector<double> dm0;   // [B, N, D]
  std::vector<double> dw_h;  // [D, D]
  std::vector<double> dw_w;  // [D, D]
};

// Backward through time for a loss L with dL/dy = dy [T, B, D], dL/dh_final = dh_final [B, D] and
// dL/dm_final = dm_final [B, N, D]; dh_final and dm_final may be empty (zero). Recomputes the forward.
// The normalizers' Jacobians are exact on their support (Peters, Niculae & Martins 2019, Prop. 2), so
// the gradients are exact wherever no score sits at a support threshold.
E23Gradients e23_backward(const E23Spec& spec, std::int64_t batch, std::int64_t steps, std::span<const double> u,
                          std::span<const double> h0, std::span<const double> m0, const E23Weights& w,
                          std::span<const double> dy, std::span<const double> dh_final,
                          std::span<const double> dm_final);

// How far the reference's results move when u, h0 and m0 each move by one fp32 rounding (every entry
// scaled by 1 +- 2^-24, the signs drawn from `seed`): about the error that any fp32 implementation's own
// rounding must be expected to cause on these inputs. The cell's gain is heavy-tailed (a draw can carry
// one rounding to 1e-3 of its outputs in four steps), so checks of a kernel against the reference use
// this to tell inputs on which a correct kernel can miss a fixed bound (docs/e23.md, "Tests"; `sjit
// check` and the GPU tests redraw such inputs). Each also returns the reference at the inputs as given,
// which its callers check against.

// The forward's: y, h_final and m_final, each row relative to max(1, max |value| in the row)
// (sequence_distance below).
struct E23ForwardSensitivity {
  E23Sequence at;              // e23_forward of the inputs as given
  double distance = 0.0;       // the largest move
  bool support_moved = false;  // a step's mean read or write support size changed
};
E23ForwardSensitivity e23_forward_sensitivity(const E23Spec& spec, std::int64_t batch, std::int64_t steps,
                                              std::span<const double> u, std::span<const double> h0,
                                              std::span<const double> m0, const E23Weights& w, std::uint64_t seed);

// The backward's: du, dh0, dm0, dW_h and dW_w, each row relative to max(max |value| in the row, a
// tenth of the tensor's largest |value|) (gradient_distance below).
struct E23BackwardSensitivity {
  E23Gradients at;         // e23_backward of the inputs as given
  double distance = 0.0;   // the largest move
};
E23BackwardSensitivity e23_backward_sensitivity(const E23Spec& spec, std::int64_t batch, std::int64_t steps,
                                                std::span<const double> u, std::span<const double> h0,
                                                std::span<const double> m0, const E23Weights& w,
                                                std::span<const double> dy, std::span<const double> dh_final,
                                                std::span<const double> dm_final, std::uint64_t seed);

// The largest |a - b| over rows of `row_len`, relative to each row's max(floor, max |b| in the row)
// (the row scale of the functions above and of the GPU tests' bounds).
double row_relative_distance(std::span<const double> a, std::span<const double> b, std::int64_t row_len,
                             double floor);

// A gradient tensor's row floor in those bounds: a tenth of its largest |value| (at least 1e-12).
double gradient_row_floor(std::span<const double> gradient);

// The largest row_relative_distance of `other`'s y, h_final and m_final from `exact`'s, rows of
// D = spec.dim over a floor of 1 (the forward sensitivity's measure).
double sequence_distance(const E23Sequence& other, const E23Sequence& exact, std::int64_t dim);

// The largest row_relative_distance of `other`'s five gradients from `exact`'s, rows of D = spec.dim
// over exact's gradient_row_floor (the backward sensitivity's measure).
double gradient_distance(const E23Gradients& other, const E23Gradients& exact, std::int64_t dim);

}  // namespace sjit::reference

// Shared by the attention GPU tests that run a forward and a backward: a problem's shape, fresh random
// inputs, and its buffers on the device with the calls enqueued on the default stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "sparsejit/sparsejit.h"

namespace sjit::test {

struct Problem {
  AttentionSpec spec;
  std::int64_t batch = 1, heads_q = 1, heads_kv = 1, seq_q = 0, seq_k = 0;
  double density = 1;
  bool per_head_pattern = false;
  std::string name() const;
};

struct Gradients {
  std::vector<float> dq, dk, dv;
};

struct Inputs {
  std::vector<float> q, k, v, d_o;  // [B, H, S, D], already rounded to the problem's dtype
};

// N(0, 1) values for q, k, v and dO, as the problem's dtype holds them.
Inputs random_inputs(const Problem& c, std::mt19937_64& rng);

// `elements` values of `dtype` from a device buffer, as floats.
std::vector<float> download(DType dtype, const DeviceBuffer& buffer, std::size_t elements);

// One problem's buffers on the GPU (gradients poisoned with NaN), and its forward and backward
// enqueued on the default stream.
struct GpuRun {
  const Problem& c;
  std::size_t q_elems, k_elems;
  DeviceBuffer q, k, v, d_o, o, lse, dq, dk, dv;
  const BlockPattern* pattern;

  GpuRun(const Problem& problem, const Inputs& in, const BlockPattern* p);
  AttentionForwardArgs forward_args() const;
  void forward(Attention& attention) { attention.forward(forward_args()); }
  // New inputs into the same buffers, and the gradients poisoned again (synchronous on the host).
  void reload(const Inputs& in);
  AttentionBackwardArgs backward_args() const;
  void backward(Attention& attention) { attention.backward(backward_args()); }
  Gradients gradients() const;  // after a synchronize()
};

// The attention GPU tests' tolerances against the float64 reference.
// An output element: within atol + rtol * |want|, bf16 2e-2 and 1e-2 (P and O are rounded to 8 bits
// of mantissa), f16 four times tighter.
bool output_close(DType dtype, double got, double want);
// A row's log-sum-exp: within 2e-3 * max(1, |want|), and -inf exactly where the reference has no key.
bool lse_close(double got, double want);
// A gradient element: within tol * largest + tol * |want| + 1e-5, tol 2.5e-2 for bf16 and 6e-3 for
// f16, `largest` the largest |want| of its tensor (bf16 rounds P, dS and the stored O, so errors scale
// with the tensor, not with each entry).
bool gradient_close(DType dtype, double got, double want, double largest);

}  // namespace sjit::test

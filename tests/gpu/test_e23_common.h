// Shared by the E23 GPU suites: a case, its random inputs, device buffers filled, poisoned and read back.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "sparsejit/e23.h"
#include "sparsejit/sparsejit.h"
#include "support/test_support.h"

namespace sjit::e23_test {

struct Case {
  E23Spec spec;
  std::int64_t batch = 1, steps = 1;
  std::int64_t checkpoint_every = 0;  // the backward's K (0: ceil(sqrt(steps)))
  std::string name() const {
    return fmt::format("{} batch {} steps {}{}", key(spec), batch, steps,
                       checkpoint_every ? fmt::format(" K {}", checkpoint_every) : std::string());
  }
};

struct Inputs {
  std::vector<float> u, h0, m0, w_h, w_w;  // already rounded to the dtype
};

// Inputs wide enough that sparsemax and entmax leave slots out. Over many steps those draws make the
// cell chaotic (in float64, a 1e-6 relative change of h0 grows to O(1) differences in y by step 24), and
// no finite-precision implementation can follow the reference there; sequences longer than 8 steps
// use a contractive regime instead (W entries N(0, 0.5^2 / D), tape N(0, 1)), where a perturbation of
// h0 shrinks from step to step.
inline Inputs draw(const Case& c, std::mt19937_64& rng) {
  const int d = c.spec.dim, n = c.spec.n_slots;
  const DType dt = c.spec.dtype;
  const bool long_run = c.steps > 8;
  const float w_h_scale = (long_run ? 0.5f : 0.9f) / std::sqrt(float(d));
  const float w_w_scale = (long_run ? 0.5f : 1.8f) / std::sqrt(float(d));
  Inputs in;
  in.u = test::quantized(dt, test::random_rows(rng, c.steps * c.batch, d, 0.5f));
  in.h0 = test::quantized(dt, test::random_rows(rng, c.batch, d, 0.5f));
  in.m0 = test::quantized(dt, test::random_rows(rng, c.batch * n, d, long_run ? 1.0f : 1.5f));
  in.w_h = test::quantized(dt, test::random_rows(rng, d, d, w_h_scale));
  in.w_w = test::quantized(dt, test::random_rows(rng, d, d, w_w_scale));
  return in;
}

inline DeviceBuffer upload(DType dtype, const std::vector<float>& values) {
  const auto bytes = test::to_bytes(dtype, values);
  DeviceBuffer buffer(std::max<std::size_t>(bytes.size(), 16));
  buffer.upload(bytes.data(), bytes.size());
  return buffer;
}

inline DeviceBuffer poisoned(std::size_t bytes) {
  DeviceBuffer buffer(std::max<std::size_t>(bytes, 16));
  buffer.fill_bytes(0xFF);
  return buffer;
}

inline std::vector<float> download(DType dtype, const DeviceBuffer& buffer, std::size_t elements) {
  std::vector<unsigned char> bytes(elements * size_of(dtype));
  buffer.download(bytes.data(), bytes.size());
  return test::from_bytes(dtype, bytes);
}

}  // namespace sjit::e23_test

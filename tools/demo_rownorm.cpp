// sjit demo and sjit check, row normalizers: the forward and backward of random rows against
// reference::rownorm_forward and rownorm_backward.
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "demo.h"

namespace sjit::tool::demo {

namespace {
// The largest error against the reference, and the largest |sum(y) - 1|, each check allows.
double error_bound(DType dtype) { return dtype == DType::f32 ? 1e-4 : 2e-2; }
double sum_bound(DType dtype) { return dtype == DType::f32 ? 1e-5 : 2e-2; }
}  // namespace

bool RowNormOutcome::ok(DType dtype) const { return max_error <= error_bound(dtype) && worst_sum <= sum_bound(dtype); }

std::string rownorm_bound(DType dtype) {
  return fmt::format("{}, |sum-1| {}", compact(error_bound(dtype)), compact(sum_bound(dtype)));
}

RowNormOutcome check_rownorm(const RowNormSpec& spec, std::int64_t rows, std::mt19937_64& rng) {
  const int n = spec.n;
  const std::size_t elements = std::size_t(rows) * n, bytes = elements * size_of(spec.dtype);
  const Tensor x = random_tensor(std::int64_t(elements), spec.dtype, rng, 2.0f);
  const Tensor g = random_tensor(std::int64_t(elements), spec.dtype, rng, 2.0f);
  DeviceBuffer dy = poisoned(bytes), dgrad = poisoned(bytes), support(rows * 4);
  RowNorm op(spec);
  op.forward({x.device.data(), dy.data(), rows, 0, 0, 1.0f, support.as<std::int32_t>()});
  op.backward({dy.data(), g.device.data(), dgrad.data(), rows});
  synchronize();
  const std::vector<float> y = download(dy, spec.dtype, elements), grad = download(dgrad, spec.dtype, elements);
  std::vector<std::int32_t> sizes(rows);
  support.download(sizes.data(), rows * 4);

  RowNormOutcome out;
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::vector<double> z(x.values.begin() + r * n, x.values.begin() + (r + 1) * n);
    const std::vector<double> yr(y.begin() + r * n, y.begin() + (r + 1) * n);
    const std::vector<double> gr(g.values.begin() + r * n, g.values.begin() + (r + 1) * n);
    const auto want_y = reference::rownorm_forward(spec, z);
    const auto want_dx = reference::rownorm_backward(spec, yr, gr);
    double sum = 0;
    for (int i = 0; i < n; ++i) {
      out.max_error = std::max({out.max_error, std::abs(y[r * n + i] - want_y[i]), std::abs(grad[r * n + i] - want_dx[i])});
      if (std::isnan(y[r * n + i]) || std::isnan(grad[r * n + i])) out.max_error = INFINITY;
      sum += y[r * n + i];
    }
    out.worst_sum = std::max(out.worst_sum, std::abs(sum - 1.0));
    out.mean_support += double(sizes[r]) / rows;
  }
  return out;
}

}  // namespace sjit::tool::demo

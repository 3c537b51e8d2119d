// 1.5-entmax over rows of scores with sparsejit: the forward (with each row's support size) and the
// backward on the GPU, checked against the float64 reference. Without a GPU it compiles both kernels
// for Hopper (sm_90a) instead, and says so.
//
// Built against an installed sparsejit by examples/CMakeLists.txt (README, "Using it from C++").
// Exits 0 when every output is within its bound of the reference (or, without a GPU, when both
// kernels compiled), 1 otherwise.
#include <sparsejit/sparsejit.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

namespace {

constexpr int kN = 1000;
constexpr std::int64_t kRows = 256;

sjit::DeviceBuffer to_device(const std::vector<float>& values) {
  sjit::DeviceBuffer buffer(values.size() * sizeof(float));
  buffer.upload(values.data(), buffer.bytes());
  return buffer;
}

// An output buffer, filled with NaN first: an element the kernels never write cannot pass the check.
sjit::DeviceBuffer poisoned(std::size_t bytes) {
  sjit::DeviceBuffer buffer(bytes);
  buffer.fill_bytes(0xFF);
  return buffer;
}

template <class T>
std::vector<T> from_device(const sjit::DeviceBuffer& buffer) {
  std::vector<T> values(buffer.bytes() / sizeof(T));
  buffer.download(values.data(), buffer.bytes());
  return values;
}

// The worst element's error as a share of its bound, rel * |want| + row * (the row's scale): fp32's
// rounding of the element, and of the row's threshold and sums. Above 1 is a mismatch (NaN included).
double worst_share(const std::vector<float>& got, const std::vector<double>& want, const std::vector<double>& row_scale,
                   double rel, double row) {
  double worst = 0;
  for (std::int64_t r = 0; r < kRows; ++r)
    for (int i = 0; i < kN; ++i) {
      const std::size_t e = r * kN + i;
      const double bound = rel * std::abs(want[e]) + row * row_scale[r] + 1e-30;
      const double share = std::isfinite(got[e]) ? std::abs(got[e] - want[e]) / bound : INFINITY;
      worst = std::max(worst, share);
    }
  return worst;
}

}  // namespace

int main() try {
  const sjit::RowNormSpec spec = sjit::entmax_spec(1.5f, kN, sjit::DType::f32);
  const sjit::SystemInfo info = sjit::system_info();
  if (!info.gpu_available) {
    std::printf("no GPU (%s): compiling 1.5-entmax's kernels for sm_90a instead\n", info.no_gpu_reason.c_str());
    for (sjit::Pass pass : {sjit::Pass::forward, sjit::Pass::backward}) {
      const sjit::CompiledKernel k = sjit::compile(sjit::entmax_spec(1.5f, kN, sjit::DType::f32, pass), {}, "sm_90a");
      std::printf("  %-60s %3d registers\n", k.kernel_key.c_str(), k.usage.registers);
    }
    return 0;
  }

  // Scores of standard deviation 2: 1.5-entmax keeps about 7 of each row's 1000 entries.
  std::mt19937_64 rng(2026);
  std::normal_distribution<float> normal(0.f, 2.f);
  std::vector<float> z(kRows * kN), dy(kRows * kN);
  for (float& x : z) x = normal(rng);
  for (float& x : dy) x = normal(rng);
  const sjit::DeviceBuffer z_gpu = to_device(z), dy_gpu = to_device(dy);
  const sjit::DeviceBuffer y_gpu = poisoned(z.size() * sizeof(float)), dx_gpu = poisoned(z.size() * sizeof(float)),
                           support_gpu = poisoned(kRows * sizeof(std::int32_t));

  sjit::RowNorm entmax(spec);  // compiled (or read from the disk cache) here, on the first use
  entmax.forward({.x = z_gpu.data(), .y = y_gpu.data(), .rows = kRows, .support = support_gpu.as<std::int32_t>()});
  entmax.backward({.y = y_gpu.data(), .dy = dy_gpu.data(), .dx = dx_gpu.data(), .rows = kRows});
  sjit::synchronize();
  const std::vector<float> y = from_device<float>(y_gpu), dx = from_device<float>(dx_gpu);
  const std::vector<std::int32_t> support = from_device<std::int32_t>(support_gpu);

  // The reference, row by row; the backward from the reference's own y.
  std::vector<double> want_y, want_dx, y_scale(kRows), dx_scale(kRows);
  double worst_sum = 0, mean_support = 0;
  bool support_ok = true;
  for (std::int64_t r = 0; r < kRows; ++r) {
    const std::vector<double> zr(z.begin() + r * kN, z.begin() + (r + 1) * kN),
        dyr(dy.begin() + r * kN, dy.begin() + (r + 1) * kN);
    const std::vector<double> yr = sjit::reference::rownorm_forward(spec, zr);
    const std::vector<double> dxr = sjit::reference::rownorm_backward(spec, yr, dyr);
    want_y.insert(want_y.end(), yr.begin(), yr.end());
    want_dx.insert(want_dx.end(), dxr.begin(), dxr.end());
    // The sizes of the terms each row's result is computed from: its largest weight; for the backward,
    // y^(1/2) dy and its mean over the support.
    double sum = 0, largest_term = 0;
    int in_support = 0;
    for (int i = 0; i < kN; ++i) {
      sum += y[r * kN + i];
      y_scale[r] = std::max(y_scale[r], yr[i]);
      largest_term = std::max(largest_term, std::sqrt(yr[i]) * std::abs(dyr[i]));
      in_support += yr[i] > 0;
    }
    dx_scale[r] = largest_term;
    worst_sum = std::max(worst_sum, std::abs(sum - 1.0));
    mean_support += support[r] / double(kRows);
    support_ok &= std::abs(support[r] - in_support) <= 1;  // an entry at the threshold may round either way
  }
  const double forward_share = worst_share(y, want_y, y_scale, 1e-4, 2e-5),
               backward_share = worst_share(dx, want_dx, dx_scale, 1e-4, 4e-5);
  const bool ok = forward_share <= 1 && backward_share <= 1 && support_ok;
  std::printf("1.5-entmax over %lld rows of %d on %s: mean support %.1f of %d, rows sum to 1 within %.1e\n",
              static_cast<long long>(kRows), kN, sjit::current_device().name.c_str(), mean_support, kN, worst_sum);
  std::printf("against the float64 reference: forward %.0f%%, backward %.0f%% of their bounds; supports %s\n",
              100 * forward_share, 100 * backward_share, support_ok ? "agree" : "DIFFER");
  std::printf("%s\n", ok ? "every output within its bound" : "MISMATCH against the reference");
  return ok ? 0 : 1;
} catch (const sjit::Error& e) {
  std::fprintf(stderr, "entmax_rows: %s\n", e.what());
  return 1;
}

// The normalizers on the GPU against the float64 reference, on fresh random inputs.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <future>
#include <thread>

#include "sparsejit/sparsejit.h"
#include "support/test_support.h"

using namespace sjit;

namespace {

const std::vector<int> kSizes = {1, 2, 7, 8, 16, 32, 33, 64, 100, 1024, 4096, 8192};
const std::vector<DType> kDTypes = {DType::f32, DType::f16, DType::bf16};

std::vector<RowNormSpec> kinds(int n, DType dtype) {
  return {softmax_spec(n, dtype), sparsemax_spec(n, dtype), entmax_spec(1.5f, n, dtype),
          entmax_spec(1.25f, n, dtype), entmax_spec(2.5f, n, dtype)};
}

// Tolerance for one element: output rounding of the dtype relative to the value, plus a small part of the
// row's largest value for fp32 arithmetic (thresholds and sums), larger where y = d^p with p < 1 is steep.
struct Tolerance {
  double rel, row;
};
Tolerance tolerance(const RowNormSpec& spec, bool backward) {
  const double rel = spec.dtype == DType::f32 ? 1e-4 : spec.dtype == DType::f16 ? 1.5e-3 : 8e-3;
  double row = spec.dtype == DType::f32 ? 2e-5 : spec.dtype == DType::f16 ? 1e-3 : 8e-3;
  if (spec.kind == NormKind::entmax && spec.alpha > 2.0f) row *= 20;  // d^(1/(alpha-1)) amplifies tau's rounding
  if (backward) row *= 2;
  return {rel, row};
}

// Compares a [rows, n] GPU result with the reference row by row; reports the first bad element.
// `row_scale` (optional) is the size of the terms a row's result is computed from; by default the
// largest reference value of the row.
void expect_close(const std::vector<float>& got, const std::vector<double>& want, std::int64_t rows, int n,
                  Tolerance tol, const std::string& what, const std::vector<double>& row_scale = {}) {
  for (std::int64_t r = 0; r < rows; ++r) {
    double row_max = 0;
    for (int i = 0; i < n; ++i) row_max = std::max(row_max, std::abs(want[r * n + i]));
    if (!row_scale.empty()) row_max = std::max(row_max, row_scale[r]);
    for (int i = 0; i < n; ++i) {
      const double g = got[r * n + i], w = want[r * n + i];
      const double allowed = tol.rel * std::abs(w) + tol.row * row_max + 1e-30;
      if (std::isnan(w)) {
        if (!std::isnan(g)) FAIL(fmt::format("{}: row {} element {}: got {}, want NaN", what, r, i, g));
        continue;
      }
      if (!(std::abs(g - w) <= allowed))
        FAIL(fmt::format("{}: row {} element {}: got {:.9g}, want {:.9g} (allowed error {:.3g})", what, r, i, g, w, allowed));
    }
  }
  SUCCEED();
}

std::vector<double> reference_forward(const RowNormSpec& spec, const std::vector<float>& x, std::int64_t rows,
                                      float temperature) {
  std::vector<double> out(x.size());
  const int n = spec.n;
  for (std::int64_t r = 0; r < rows; ++r) {
    std::vector<double> z(x.begin() + r * n, x.begin() + (r + 1) * n);
    const auto y = reference::rownorm_forward(spec, z, temperature);
    std::copy(y.begin(), y.end(), out.begin() + r * n);
  }
  return out;
}

// The backward's terms are s_i dy_i and s_i q (s_i = y_i^(2-alpha)): fp32 cancellation between them is
// relative to their size, not to the (possibly much smaller) result.
std::vector<double> backward_scale(const RowNormSpec& spec, const std::vector<float>& y, const std::vector<float>& dy,
                                   std::int64_t rows) {
  std::vector<double> scale(rows, 0.0);
  const int n = spec.n;
  for (std::int64_t r = 0; r < rows; ++r) {
    double s_max = 0, g_max = 0;
    for (int i = 0; i < n; ++i) {
      const double yi = y[r * n + i];
      if (yi > 0) s_max = std::max(s_max, spec.kind == NormKind::softmax ? yi : std::pow(yi, 2.0 - spec.alpha));
      g_max = std::max(g_max, std::abs(double(dy[r * n + i])));
    }
    scale[r] = s_max * g_max;
  }
  return scale;
}

std::vector<double> reference_backward(const RowNormSpec& spec, const std::vector<float>& y,
                                       const std::vector<float>& dy, std::int64_t rows, float temperature) {
  std::vector<double> out(y.size());
  const int n = spec.n;
  for (std::int64_t r = 0; r < rows; ++r) {
    std::vector<double> yr(y.begin() + r * n, y.begin() + (r + 1) * n);
    std::vector<double> gr(dy.begin() + r * n, dy.begin() + (r + 1) * n);
    const auto dx = reference::rownorm_backward(spec, yr, gr, temperature);
    std::copy(dx.begin(), dx.end(), out.begin() + r * n);
  }
  return out;
}

struct Device2D {  // a [rows, n] device matrix of spec.dtype
  DType dtype;
  std::int64_t count;
  DeviceBuffer buffer;
  Device2D(DType d, std::int64_t elements) : dtype(d), count(elements), buffer(std::max<std::int64_t>(elements, 1) * size_of(d)) {}
  void upload(const std::vector<float>& v) { buffer.upload(test::to_bytes(dtype, v).data(), v.size() * size_of(dtype)); }
  std::vector<float> download() const {
    std::vector<unsigned char> bytes(count * size_of(dtype));
    buffer.download(bytes.data(), bytes.size());
    return test::from_bytes(dtype, bytes);
  }
  void poison() { buffer.fill_bytes(0xFF); }  // NaN in every dtype: an unwritten element cannot pass
};

// Forward + backward of one spec on `x` (already in the dtype's precision), checked against the reference.
void check_spec(const RowNormSpec& spec, const std::vector<float>& x, std::int64_t rows, float temperature,
                std::mt19937_64& rng, const std::string& label) {
  const int n = spec.n;
  RowNorm op(spec);
  Device2D dx_in(spec.dtype, rows * n), dy_out(spec.dtype, rows * n);
  dx_in.upload(x);
  dy_out.poison();
  DeviceBuffer support(std::max<std::int64_t>(rows, 1) * 4);
  support.fill_bytes(0xFF);
  op.forward({dx_in.buffer.data(), dy_out.buffer.data(), rows, 0, 0, temperature, support.as<std::int32_t>()});
  synchronize();
  const std::vector<float> y = dy_out.download();
  const auto want_y = reference_forward(spec, x, rows, temperature);
  expect_close(y, want_y, rows, n, tolerance(spec, false), fmt::format("{} forward {}", key(spec), label));

  std::vector<std::int32_t> sizes(rows);
  support.download(sizes.data(), rows * 4);
  const double row_tolerance = tolerance(spec, false).row;
  for (std::int64_t r = 0; r < rows; ++r) {
    int strict = 0, loose = 0;  // support size within rounding of the threshold
    // A weight that expect_close lets be 0 (within the row part of the tolerance) may be out of the
    // support: near the threshold y = d^(1/(alpha-1)) is steep for alpha > 2 (one draw: 2.5-entmax, f32,
    // a weight above 1e-5 that fp32's threshold put at 0).
    double row_max = 0;
    for (int i = 0; i < n; ++i) row_max = std::max(row_max, want_y[r * n + i]);
    const double in_support = std::max(1e-5, row_tolerance * row_max);
    for (int i = 0; i < n; ++i) {
      const double w = want_y[r * n + i];
      strict += w > in_support ? 1 : 0;
      // An input exactly at the threshold (ties are common among bf16 values) has weight 0 in float64
      // and may come out a hair above it in fp32: counted if the GPU gave it a (tiny) weight, which
      // expect_close above has already bounded.
      loose += w > 0 || y[r * n + i] != 0.f ? 1 : 0;
    }
    if (std::isnan(want_y[r * n])) continue;
    if (spec.dtype == DType::f32 && spec.kind == NormKind::softmax) strict = 0;  // tiny values may underflow
    if (!(sizes[r] >= strict && sizes[r] <= loose))
      FAIL(fmt::format("{} {}: row {} support size {} outside [{}, {}]", key(spec), label, r, sizes[r], strict, loose));
  }

  // Backward on the reference's y (rounded to the dtype, as a user would hold it) and a random dy.
  std::vector<float> y_in(want_y.begin(), want_y.end());
  y_in = test::quantized(spec.dtype, y_in);
  const std::vector<float> g = test::quantized(spec.dtype, test::random_rows(rng, rows, n, 1.0f));
  Device2D dev_y(spec.dtype, rows * n), dev_g(spec.dtype, rows * n), dev_dx(spec.dtype, rows * n);
  dev_y.upload(y_in);
  dev_g.upload(g);
  dev_dx.poison();
  op.backward({dev_y.buffer.data(), dev_g.buffer.data(), dev_dx.buffer.data(), rows, 0, 0, 0, temperature});
  synchronize();
  expect_close(dev_dx.download(), reference_backward(spec, y_in, g, rows, temperature), rows, n, tolerance(spec, true),
               fmt::format("{} backward {}", key(spec), label), backward_scale(spec, y_in, g, rows));
}

// Compiling hundreds of kernels one by one would dominate the suite: warm them up in parallel first.
void prepare_all(const std::vector<RowNormSpec>& specs) {
  std::vector<std::future<void>> jobs;
  const unsigned workers = std::max(2u, std::thread::hardware_concurrency());
  std::atomic<std::size_t> next{0};
  for (unsigned w = 0; w < workers; ++w)
    jobs.push_back(std::async(std::launch::async, [&] {
      for (std::size_t i = next++; i < specs.size(); i = next++) RowNorm(specs[i]).prepare();
    }));
  for (auto& j : jobs) j.get();
}

}  // namespace

TEST_CASE("every kind, dtype and size matches the float64 reference", "[gpu][rownorm]") {
  std::vector<RowNormSpec> all;
  for (DType d : kDTypes)
    for (int n : kSizes)
      for (const auto& s : kinds(n, d)) all.push_back(s);
  prepare_all(all);

  const auto seed = test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  for (const auto& spec : all) {
    const std::int64_t rows = spec.n <= 64 ? 301 : spec.n <= 1024 ? 67 : 9;
    const float scale = std::uniform_real_distribution<float>(0.3f, 4.0f)(rng);
    const auto x = test::quantized(spec.dtype, test::random_rows(rng, rows, spec.n, scale));
    check_spec(spec, x, rows, 1.0f, rng, fmt::format("scale {:.2f}", scale));
  }
}

TEST_CASE("edge rows behave as the math says", "[gpu][rownorm]") {
  const auto seed = test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  for (DType d : kDTypes)
    for (int n : {1, 7, 64, 1024, 8192})
      for (const auto& spec : kinds(n, d)) {
        const float inf = INFINITY;
        std::vector<std::vector<float>> rows_of;
        rows_of.push_back(std::vector<float>(n, 0.37f));                        // all equal: uniform
        auto dominant = test::random_rows(rng, 1, n, 0.1f);
        dominant[n / 2] = 50.0f;                                                // one dominant
        rows_of.push_back(dominant);
        for (float s : {1e-3f, 1e4f}) rows_of.push_back(test::random_rows(rng, 1, n, s));  // scales
        auto with_neg_inf = test::random_rows(rng, 1, n, 1.0f);
        for (int i = 0; i < n; i += 3) with_neg_inf[i] = -inf;
        if (n > 1) with_neg_inf[1] = 0.5f;                                      // keep a finite entry
        rows_of.push_back(with_neg_inf);
        auto with_pos_inf = test::random_rows(rng, 1, n, 1.0f);
        with_pos_inf[n - 1] = inf;
        with_pos_inf[0] = inf;
        rows_of.push_back(with_pos_inf);                                        // +inf entries share the mass
        auto with_nan = test::random_rows(rng, 1, n, 1.0f);
        with_nan[n / 3] = NAN;
        rows_of.push_back(with_nan);                                            // NaN row -> NaN row only
        rows_of.push_back(std::vector<float>(n, -inf));                         // undefined -> NaN
        auto huge = test::random_rows(rng, 1, n, 1.0f);
        for (float& v : huge) v = v * 1e37f;                                    // huge magnitudes
        rows_of.push_back(huge);
        std::vector<float> x;
        for (const auto& r : rows_of) x.insert(x.end(), r.begin(), r.end());
        x = test::quantized(spec.dtype, x);
        check_spec(spec, x, std::int64_t(rows_of.size()), 1.0f, rng, "edge rows");
        // A single row, and temperature.
        check_spec(spec, std::vector<float>(x.begin(), x.begin() + n), 1, 0.5f, rng, "one row, temperature 0.5");
      }
}

TEST_CASE("zero rows launch nothing and fail nothing", "[gpu][rownorm]") {
  RowNorm op(entmax_spec(1.5f, 64));
  DeviceBuffer buf(64 * 4);
  REQUIRE_NOTHROW(op.forward({buf.data(), buf.data(), 0}));
  REQUIRE_NOTHROW(op.forward({nullptr, nullptr, 0}));
  synchronize();
}

TEST_CASE("strided and in-place rows", "[gpu][rownorm]") {
  const auto seed = test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  for (const auto& spec : {sparsemax_spec(33), entmax_spec(1.5f, 64, DType::bf16), softmax_spec(1024, DType::f16)}) {
    const int n = spec.n;
    const std::int64_t rows = 37, ld = n + 5;  // odd stride: narrower packets are chosen
    auto x = test::quantized(spec.dtype, test::random_rows(rng, rows, int(ld), 2.0f));
    Device2D dev(spec.dtype, rows * ld);
    dev.upload(x);
    RowNorm op(spec);
    op.forward({dev.buffer.data(), dev.buffer.data(), rows, ld, ld});  // in place
    synchronize();
    const auto got = dev.download();
    std::vector<float> packed, got_packed;
    for (std::int64_t r = 0; r < rows; ++r) {
      packed.insert(packed.end(), x.begin() + r * ld, x.begin() + r * ld + n);
      got_packed.insert(got_packed.end(), got.begin() + r * ld, got.begin() + r * ld + n);
      for (std::int64_t i = n; i < ld; ++i)  // the gap between rows is untouched
        REQUIRE(std::bit_cast<std::uint32_t>(got[r * ld + i]) == std::bit_cast<std::uint32_t>(x[r * ld + i]));
    }
    expect_close(got_packed, reference_forward(spec, packed, rows, 1.0f), rows, n, tolerance(spec, false),
                 key(spec) + " in place, stride " + std::to_string(ld));
  }
}

TEST_CASE("eight threads asking for one new kernel compile it once", "[gpu][jit]") {
  // A spec no other test uses, so that it is new to this process.
  const RowNormSpec spec = entmax_spec(1.375f, 24, DType::f32);
  const auto before = jit_counters();
  std::vector<std::future<void>> threads;
  for (int t = 0; t < 8; ++t) threads.push_back(std::async(std::launch::async, [&] { RowNorm(spec).prepare(); }));
  for (auto& t : threads) t.get();
  const auto after = jit_counters();
  CHECK(after.compiles - before.compiles == 2);  // forward and backward, once each
}

#include "tune/tuner_support.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <future>
#include <thread>
#include <vector>

#include "sparsejit/device.h"

namespace sjit::tuning {

void run_in_parallel(std::size_t count, const std::function<void(std::size_t)>& job) {
  std::atomic<std::size_t> next{0};
  std::vector<std::future<void>> workers;
  const unsigned n_workers = std::max(2u, std::thread::hardware_concurrency());
  for (unsigned t = 0; t < n_workers; ++t)
    workers.push_back(std::async(std::launch::async, [&] {
      for (std::size_t i = next++; i < count; i = next++) job(i);
    }));
  for (auto& w : workers) w.get();
}

namespace {

// compare_rows on whole rows [begin, end) of the element arrays.
std::string compare_row_range(double rel, std::size_t row_length, std::span<const float> got,
                              std::span<const float> want, std::size_t begin, std::size_t end) {
  for (; begin < end; begin += row_length) {
    const std::size_t row_end = std::min(end, begin + row_length);
    double row_max = 0;
    for (std::size_t k = begin; k < row_end; ++k)
      if (std::isfinite(want[k])) row_max = std::max(row_max, std::abs(double(want[k])));
    for (std::size_t k = begin; k < row_end; ++k) {
      if (got[k] == want[k]) continue;
      const double diff = std::abs(double(got[k]) - double(want[k]));
      if (!(diff <= rel * (std::abs(double(want[k])) + row_max) + 1e-30))
        return fmt::format("row {} element {} is {:.7g}, the default gives {:.7g}", begin / row_length, k - begin,
                           got[k], want[k]);
    }
  }
  return {};
}

}  // namespace

std::string compare_rows(DType dtype, std::size_t row_length, std::span<const float> got, std::span<const float> want) {
  const double rel = dtype == DType::f32 ? 1e-5 : dtype == DType::f16 ? 2e-3 : 1.6e-2;
  // Attention outputs run to 10^8 elements: chunks of whole rows on every core, the first difference
  // reported.
  const std::size_t rows = (want.size() + row_length - 1) / row_length;
  const std::size_t rows_per_chunk = std::max<std::size_t>(1, (std::size_t(1) << 20) / row_length);
  const std::size_t chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
  std::vector<std::string> found(chunks);
  run_in_parallel(chunks, [&](std::size_t c) {
    const std::size_t begin = c * rows_per_chunk * row_length;
    const std::size_t end = std::min(want.size(), begin + rows_per_chunk * row_length);
    found[c] = compare_row_range(rel, row_length, got, want, begin, end);
  });
  for (const std::string& f : found)
    if (!f.empty()) return f;
  return {};
}

double median_launch_us(int warmup, int iterations, const std::function<void(int)>& run) {
  for (int i = 0; i < warmup; ++i) run(i);
  synchronize();
  EventTimer timer;
  std::vector<double> us;
  for (int i = 0; i < std::max(1, iterations); ++i) {
    timer.start();
    run(i);
    us.push_back(timer.stop_ms() * 1000.0);
  }
  std::nth_element(us.begin(), us.begin() + us.size() / 2, us.end());
  return us[us.size() / 2];
}

}  // namespace sjit::tuning

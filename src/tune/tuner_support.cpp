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

std::string compare_rows(DType dtype, std::size_t row_length, std::span<const float> got, std::span<const float> want) {
  const double rel = dtype == DType::f32 ? 1e-5 : dtype == DType::f16 ? 2e-3 : 1.6e-2;
  for (std::size_t begin = 0; begin < want.size(); begin += row_length) {
    const std::size_t end = std::min(want.size(), begin + row_length);
    double row_max = 0;
    for (std::size_t k = begin; k < end; ++k)
      if (std::isfinite(want[k])) row_max = std::max(row_max, std::abs(double(want[k])));
    for (std::size_t k = begin; k < end; ++k) {
      if (got[k] == want[k]) continue;
      const double diff = std::abs(double(got[k]) - double(want[k]));
      if (!(diff <= rel * (std::abs(double(want[k])) + row_max) + 1e-30))
        return fmt::format("row {} element {} is {:.7g}, the default gives {:.7g}", begin / row_length, k - begin,
                           got[k], want[k]);
    }
  }
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

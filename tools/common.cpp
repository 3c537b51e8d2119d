#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <sstream>
#include <thread>

#include "commands.h"

namespace sjit::tool {

RowNormSpec kind_from_name(const std::string& name, int n, DType dtype, Pass pass) {
  if (name == "softmax") return softmax_spec(n, dtype, pass);
  if (name == "sparsemax") return sparsemax_spec(n, dtype, pass);
  if (name == "entmax15") return entmax_spec(1.5f, n, dtype, pass);
  if (name.rfind("entmax:", 0) == 0) {
    float alpha = 0;
    const std::string v = name.substr(7);
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), alpha);
    if (ec == std::errc() && end == v.data() + v.size()) return entmax_spec(alpha, n, dtype, pass);
  }
  throw InvalidArgument(fmt::format("kind '{}' is unknown: use softmax, sparsemax, entmax15 or entmax:ALPHA", name));
}

std::string short_kind_name(const RowNormSpec& spec) {
  if (spec.kind == NormKind::entmax) return spec.alpha == 1.5f ? "entmax15" : fmt::format("entmax:{}", spec.alpha);
  return std::string(name(spec.kind));
}

std::string describe_device(const DeviceInfo& device) {
  const std::string dram =
      device.memory_bandwidth > 0 ? fmt::format(", DRAM {:.2f} TB/s", device.memory_bandwidth / 1e12) : std::string();
  return fmt::format("{} ({} SMs, L2 {} MiB{})", device.name, device.multiprocessors, device.l2_bytes >> 20, dram);
}

void require_at_least(const char* flag, std::int64_t value, std::int64_t least) {
  if (value < least) throw InvalidArgument(fmt::format("{} {}: give at least {}", flag, value, least));
}

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

void Table::print() const {
  std::vector<std::size_t> width(headers_.size());
  for (std::size_t c = 0; c < headers_.size(); ++c) width[c] = headers_[c].size();
  for (const auto& r : rows_)
    for (std::size_t c = 0; c < r.size() && c < width.size(); ++c) width[c] = std::max(width[c], r[c].size());
  auto line = [&](const std::vector<std::string>& cells) {
    std::string out;
    for (std::size_t c = 0; c < width.size(); ++c)
      out += fmt::format("{:<{}}", c < cells.size() ? cells[c] : "", width[c] + (c + 1 < width.size() ? 2 : 0));
    while (!out.empty() && out.back() == ' ') out.pop_back();
    fmt::print("{}\n", out);
  };
  line(headers_);
  std::vector<std::string> rule;
  for (auto w : width) rule.push_back(std::string(w, '-'));
  line(rule);
  for (const auto& r : rows_) line(r);
}

DeviceBuffer random_device_tensor(std::int64_t elements, DType dtype, std::mt19937_64& rng, float scale) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> values(static_cast<std::size_t>(elements));
  for (float& x : values) x = dist(rng);
  std::vector<unsigned char> bytes(values.size() * size_of(dtype));
  encode(dtype, values, bytes.data());
  DeviceBuffer buffer(std::max<std::size_t>(bytes.size(), 16));
  buffer.upload(bytes.data(), bytes.size());
  return buffer;
}

static double median_of(std::vector<double>& ms) {
  if (ms.empty()) throw InvalidArgument("a median of no timed runs: give at least one (--iters)");
  std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
  return ms[ms.size() / 2];
}

// Queued: every run has its own events and all are enqueued before the first wait, so the host's
// launch latency hides behind the GPU's work, as in a training loop. Otherwise each run is timed alone
// and includes the time from its start event to its first kernel.
static std::vector<double> timed_runs(int iterations, bool queued, const std::vector<std::function<void()>>& runs) {
  std::vector<double> ms;
  if (!queued) {
    EventTimer timer;
    for (int i = 0; i < iterations; ++i)
      for (const auto& run : runs) {
        timer.start();
        run();
        ms.push_back(timer.stop_ms());
      }
    return ms;
  }
  std::vector<EventTimer> timers(std::size_t(iterations) * runs.size());
  for (std::size_t t = 0; t < timers.size(); ++t) {
    timers[t].start();
    runs[t % runs.size()]();
    timers[t].stop();
  }
  for (const EventTimer& timer : timers) ms.push_back(timer.elapsed_ms());
  return ms;
}

double median_gpu_ms(int warmup, int iterations, const std::function<void(int)>& run, bool queued) {
  for (int i = 0; i < warmup; ++i) run(i);
  synchronize();
  int i = 0;
  std::vector<double> ms = timed_runs(iterations, queued, {[&] { run(i++); }});
  return median_of(ms);
}

double median_host_us(int iterations, const std::function<void()>& run) {
  std::vector<double> us;
  for (int i = 0; i < iterations; ++i) {
    synchronize();
    const auto start = std::chrono::steady_clock::now();
    run();
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
  }
  synchronize();
  return median_of(us);
}

StepTimes median_step_ms(int warmup, int iterations, const std::vector<std::function<void()>>& parts, bool queued) {
  for (int i = 0; i < warmup; ++i)
    for (const auto& part : parts) part();
  synchronize();
  // A timer a part, each started where the one before stopped: the parts run back to back as in the
  // step, and each one's time includes what the one before left behind (write-backs from the L2, a
  // tail of CTAs), which timing the parts apart does not see.
  std::vector<EventTimer> timers(std::size_t(iterations) * parts.size());
  for (int i = 0; i < iterations; ++i) {
    for (std::size_t k = 0; k < parts.size(); ++k) {
      EventTimer& timer = timers[std::size_t(i) * parts.size() + k];
      timer.start();
      parts[k]();
      timer.stop();
    }
    if (!queued) timers[std::size_t(i + 1) * parts.size() - 1].elapsed_ms();  // waits: each step alone
  }
  std::vector<std::vector<double>> part_ms(parts.size());
  std::vector<double> step_ms(std::size_t(iterations), 0.0);
  for (std::size_t t = 0; t < timers.size(); ++t) {
    part_ms[t % parts.size()].push_back(timers[t].elapsed_ms());
    step_ms[t / parts.size()] += part_ms[t % parts.size()].back();
  }
  StepTimes times;
  for (auto& ms : part_ms) times.parts.push_back(median_of(ms));
  times.step = median_of(step_ms);
  return times;
}

std::pair<double, double> paired_median_gpu_ms(int warmup, int iterations, const std::function<void()>& a,
                                               const std::function<void()>& b, bool queued) {
  for (int i = 0; i < warmup; ++i) a(), b();
  synchronize();
  const std::vector<double> ms = timed_runs(iterations, queued, {a, b});
  std::vector<double> ms_a, ms_b;  // a, b, a, b, ...
  for (std::size_t t = 0; t < ms.size(); ++t) (t % 2 ? ms_b : ms_a).push_back(ms[t]);
  return {median_of(ms_a), median_of(ms_b)};
}

void run_parallel(std::size_t count, int jobs, const std::function<void(std::size_t)>& work) {
  std::atomic<std::size_t> next{0};
  auto worker = [&] {
    for (std::size_t i = next++; i < count; i = next++) work(i);
  };
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < std::min<std::size_t>(std::size_t(std::max(jobs, 1)), count); ++t) threads.emplace_back(worker);
  for (auto& t : threads) t.join();
}

void draw_progress(int done, int total, const std::string& tail) {
  const int width = 30, filled = total ? width * done / total : width;
  fmt::print(stderr, "\r[{:#<{}}{:.<{}}] {}/{}  {}", "", filled, "", width - filled, done, total, tail);
  if (done == total) fmt::print(stderr, "\n");
}

}  // namespace sjit::tool

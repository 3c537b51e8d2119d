// The sjit subcommands. Each registers its options on the app and runs through the public API only.
#pragma once

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "sparsejit/sparsejit.h"

namespace sjit::tool {

using Runner = std::function<int()>;

Runner add_info(CLI::App& app);
Runner add_compile(CLI::App& app);
Runner add_bench(CLI::App& app);
Runner add_demo(CLI::App& app);
Runner add_warmup(CLI::App& app);
Runner add_cache(CLI::App& app);
Runner add_tune(CLI::App& app);
Runner add_pattern(CLI::App& app);
Runner add_check(CLI::App& app);
Runner add_bench_jit(CLI::App& bench);        // "bench jit", under the bench command
Runner add_bench_attention(CLI::App& bench);  // "bench attention"
Runner add_bench_e23(CLI::App& bench);        // "bench e23"

// "softmax", "sparsemax", "entmax15", "entmax:1.25" -> a spec with that kind (n and dtype filled by caller).
RowNormSpec kind_from_name(const std::string& name, int n, DType dtype, Pass pass = Pass::forward);
std::string short_kind_name(const RowNormSpec& spec);
// "NVIDIA H200 (132 SMs, L2 60 MiB, DRAM 4.81 TB/s)": what a bench's figures depend on, in its header.
std::string describe_device(const DeviceInfo& device);

// "a,b,,c" -> {"a", "b", "c"}: the comma-separated lists of the options.
std::vector<std::string> split_commas(const std::string& text);

// A count flag refused before any GPU work, with the flag and its value: "--iters 0: give at least 1".
void require_at_least(const char* flag, std::int64_t value, std::int64_t least);

// parse(text) for a flag's value, its refusal prefixed with the flag and the text: "--config bogus=1: ...".
template <class Parse>
auto parse_flag(const char* flag, const std::string& text, Parse&& parse) {
  try {
    return parse(text);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(fmt::format("{} {}: {}", flag, text, e.what()));
  }
}

// Median GPU time of run(i) in milliseconds: `warmup` untimed calls, then `iterations` calls timed with
// events on the default stream. Each call is timed alone, so its time includes the host's work from its
// start event to its first kernel; `queued` enqueues them all before the first wait (each with its own
// events), which hides that latency behind the previous call's kernels, as in a training loop.
double median_gpu_ms(int warmup, int iterations, const std::function<void(int)>& run, bool queued = false);
// The medians of `a` and `b` timed alternately (a, b, a, b, ...): both see the same clocks and
// temperature, which drift by several percent over a long benchmark, so their ratio is fair.
std::pair<double, double> paired_median_gpu_ms(int warmup, int iterations, const std::function<void()>& a,
                                               const std::function<void()>& b, bool queued = false);

// The median wall-clock microseconds that one call of `run` keeps the host, with the GPU idle before
// each (a synchronize between calls): what a call adds before its first kernel when timed alone.
double median_host_us(int iterations, const std::function<void()>& run);

// A step of several calls timed as one, as a training step runs them (`parts` back to back, each part
// between its own events, no wait between them): the medians of each part's time within the step and
// of the step's. Each step is timed alone, or with `queued` all are enqueued before the first wait.
struct StepTimes {
  std::vector<double> parts;
  double step = 0;
};
StepTimes median_step_ms(int warmup, int iterations, const std::vector<std::function<void()>>& parts,
                         bool queued = false);

// Calls work(i) for every i in [0, count) from min(jobs, count) threads, each taking the next index
// when it is done with one (the compiles of `sjit warmup` and `sjit demo`).
void run_parallel(std::size_t count, int jobs, const std::function<void(std::size_t)>& work);

// One progress line redrawn on stderr, "[####......] done/total  <tail>", ended once done == total.
void draw_progress(int done, int total, const std::string& tail);

// A device buffer of `elements` values drawn from N(0, scale^2), rounded to dtype (at least 16 bytes).
DeviceBuffer random_device_tensor(std::int64_t elements, DType dtype, std::mt19937_64& rng, float scale = 1.0f);

// A plain table printed with aligned columns.
class Table {
 public:
  explicit Table(std::vector<std::string> headers) : headers_(std::move(headers)) {}
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  void print() const;

 private:
  std::vector<std::string> headers_;
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace sjit::tool

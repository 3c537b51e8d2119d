// sjit bench rownorm: median kernel time after warm-up, bandwidth, and the share of a device-to-device
// copy's bandwidth measured in the same run.
#include <fmt/format.h>

#include <algorithm>
#include <random>
#include <sstream>

#include "commands.h"

namespace sjit::tool {
namespace {

struct BenchOptions {
  std::vector<std::string> kinds = {"softmax", "sparsemax", "entmax15", "entmax:1.25", "entmax:1.3"};
  std::vector<int> sizes = {8, 16, 32, 64, 1024};
  std::string dtype = "f32";
  std::string passes = "both";
  double elements = 16.0 * 1024 * 1024;
  int iterations = 100;
  int warmup = 10;
  std::vector<std::string> configs = {""};  // layouts to compare; "" is the heuristic default
};

// Median time of `run` in microseconds, each run timed alone with events.
template <class F>
double median_us(int warmup, int iterations, F&& run) {
  return 1000.0 * median_gpu_ms(warmup, iterations, run);
}

// Sets of buffers to rotate through so that small problems are not served from L2.
int rotation_for(std::size_t bytes_per_set, int l2_bytes) {
  return int(std::clamp<std::size_t>(2 * std::size_t(l2_bytes) / std::max<std::size_t>(bytes_per_set, 1) + 1, 1, 16));
}

int run_rownorm(const BenchOptions& o) {
  // Every flag refused or taken before any GPU work.
  require_at_least("--iters", o.iterations, 1);
  require_at_least("--warmup", o.warmup, 0);
  if (!(o.elements >= 1 && o.elements <= 0x1p40))  // NaN too
    throw InvalidArgument(fmt::format("--elements {}: give 1 to 2^40", o.elements));
  const DType dtype = parse_dtype(o.dtype);
  for (const std::string& kind : o.kinds)
    for (int n : o.sizes) kind_from_name(kind, n, dtype);  // an unknown kind, or a row length out of range
  for (const std::string& config_text : o.configs)
    if (!config_text.empty()) parse_flag("--config", config_text, parse_rownorm_config);
  if (!gpu_available()) throw NoDevice("sjit bench needs a GPU: " + system_info().no_gpu_reason);
  const DeviceInfo dev = current_device();
  const std::size_t elem = size_of(dtype);
  const bool fwd = o.passes != "bwd", bwd = o.passes != "fwd";
  fmt::print("device {}, {} elements of {}, median of {} runs after {} warm-up\n", describe_device(dev),
             std::int64_t(o.elements), name(dtype), o.iterations, o.warmup);

  Table table({"kind", "n", "pass", "config", "rows", "time", "GB/s", "% of copy", "vs copy time"});
  std::mt19937_64 rng(12345);
  for (int n : o.sizes) {
    const std::int64_t rows = std::max<std::int64_t>(1, std::int64_t(o.elements) / n);
    const std::size_t bytes = std::size_t(rows) * n * elem;
    const int sets = rotation_for(3 * bytes, dev.l2_bytes);
    std::vector<DeviceBuffer> x, y, dy, dx;
    {
      std::normal_distribution<float> dist(0.0f, 1.0f);
      std::vector<float> host(std::size_t(rows) * n);
      std::vector<unsigned char> raw(bytes);
      for (int s = 0; s < sets; ++s) {
        for (float& v : host) v = dist(rng);
        encode(dtype, host, raw.data());
        x.emplace_back(bytes), y.emplace_back(bytes), dy.emplace_back(bytes), dx.emplace_back(bytes);
        x.back().upload(raw.data(), bytes);
        for (float& v : host) v = dist(rng);
        encode(dtype, host, raw.data());
        dy.back().upload(raw.data(), bytes);
      }
    }
    // The yardstick: a device-to-device copy of one matrix (bytes read + bytes written).
    const double copy_us = median_us(o.warmup, o.iterations, [&](int i) {
      copy_device_to_device(y[i % sets].data(), x[i % sets].data(), bytes);
    });
    const double copy_gbs = 2.0 * bytes / copy_us / 1e3;
    for (const std::string& kind : o.kinds)
    for (const std::string& config_text : o.configs) {
      const RowNormSpec spec = kind_from_name(kind, n, dtype);
      const RowNormConfig wanted = config_text.empty() ? RowNormConfig{} : parse_rownorm_config(config_text);
      try {
        resolve(spec, wanted);
      } catch (const InvalidArgument&) {
        continue;  // a layout that does not fit this n (too many elements per thread, say)
      }
      RowNorm op(spec, wanted);
      op.prepare();
      const std::string layout = key(op.config_for({x[0].data(), y[0].data(), rows}));
      for (int s = 0; s < sets; ++s) op.forward({x[s].data(), y[s].data(), rows});  // y: a real forward output
      auto report = [&](const char* pass, double us, double moved) {
        const double gbs = moved / us / 1e3;
        table.add({kind, std::to_string(n), pass, layout, std::to_string(rows), fmt::format("{:.1f} us", us),
                   fmt::format("{:.0f}", gbs), fmt::format("{:.0f}%", 100.0 * gbs / copy_gbs),
                   fmt::format("{:.2f}x", us / (copy_us * moved / (2.0 * bytes)))});
      };
      if (fwd)
        report("fwd", median_us(o.warmup, o.iterations, [&](int i) {
                 op.forward({x[i % sets].data(), y[i % sets].data(), rows});
               }), 2.0 * bytes);
      if (bwd)
        report("bwd", median_us(o.warmup, o.iterations, [&](int i) {
                 op.backward({y[i % sets].data(), dy[i % sets].data(), dx[i % sets].data(), rows});
               }), 3.0 * bytes);
    }
    table.add({"copy", std::to_string(n), "-", "-", "-", fmt::format("{:.1f} us", copy_us), fmt::format("{:.0f}", copy_gbs),
               "100%", "1.00x"});
  }
  table.print();
  return 0;
}

}  // namespace

Runner add_bench(CLI::App& app) {
  auto* bench = app.add_subcommand("bench", "Benchmarks on the GPU");
  bench->require_subcommand(1);
  auto* rownorm = bench->add_subcommand("rownorm", "Row normalizers: time, GB/s, share of copy bandwidth");
  auto o = std::make_shared<BenchOptions>();
  auto kinds = std::make_shared<std::string>("softmax,sparsemax,entmax15,entmax:1.25,entmax:1.3");
  rownorm->add_option("--kinds", *kinds, "Comma-separated: softmax, sparsemax, entmax15, entmax:ALPHA");
  rownorm->add_option("--n", o->sizes, "Row lengths")->delimiter(',');
  rownorm->add_option("--dtype", o->dtype, "f32 | f16 | bf16");
  rownorm->add_option("--pass", o->passes, "fwd | bwd | both")->check(CLI::IsMember({"fwd", "bwd", "both"}));
  rownorm->add_option("--elements", o->elements, "Elements per matrix (default 16M)");
  rownorm->add_option("--iters", o->iterations, "Timed runs (median reported)");
  rownorm->add_option("--config", o->configs, "Layouts to compare, e.g. --config tpr=4 --config tpr=8 (default: chosen)");
  rownorm->add_option("--warmup", o->warmup, "Untimed runs first");
  Runner jit = add_bench_jit(*bench);
  Runner attention = add_bench_attention(*bench);
  Runner e23 = add_bench_e23(*bench);
  return [=] {
    if (rownorm->parsed()) {
      o->kinds = split_commas(*kinds);
      return run_rownorm(*o);
    }
    if (const int result = attention(); result != -1) return result;
    if (const int result = e23(); result != -1) return result;
    return jit();
  };
}

}  // namespace sjit::tool

// sjit demo: the main job. Specializes and compiles a set of kernels; with a GPU, runs each against
// the float64 reference on fresh random rows and prints what matched.
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <random>

#include "commands.h"

namespace sjit::tool {
namespace {

struct Outcome {
  double max_error = 0;    // largest |gpu - reference| over forward and backward
  double worst_sum = 0;    // largest |sum(y) - 1| over the rows
  double mean_support = 0;
};

Outcome run_against_reference(const RowNormSpec& spec, std::mt19937_64& rng) {
  const int n = spec.n;
  const std::int64_t rows = 64;
  const std::size_t elem = size_of(spec.dtype), bytes = std::size_t(rows) * n * elem;
  std::normal_distribution<float> dist(0.0f, 2.0f);
  std::vector<float> x(std::size_t(rows) * n), g(x.size());
  for (float& v : x) v = dist(rng);
  for (float& v : g) v = dist(rng);
  std::vector<unsigned char> raw(bytes);
  DeviceBuffer dx(bytes), dy(bytes), dg(bytes), dgrad(bytes), support(rows * 4);
  encode(spec.dtype, x, raw.data());
  decode(spec.dtype, raw.data(), x);  // the values the GPU sees
  dx.upload(raw.data(), bytes);
  encode(spec.dtype, g, raw.data());
  decode(spec.dtype, raw.data(), g);
  dg.upload(raw.data(), bytes);
  dy.fill_bytes(0xFF);
  dgrad.fill_bytes(0xFF);

  RowNorm op(spec);
  op.forward({dx.data(), dy.data(), rows, 0, 0, 1.0f, support.as<std::int32_t>()});
  op.backward({dy.data(), dg.data(), dgrad.data(), rows});
  synchronize();
  std::vector<float> y(x.size()), grad(x.size());
  dy.download(raw.data(), bytes);
  decode(spec.dtype, raw.data(), y);
  dgrad.download(raw.data(), bytes);
  decode(spec.dtype, raw.data(), grad);
  std::vector<std::int32_t> sizes(rows);
  support.download(sizes.data(), rows * 4);

  Outcome out;
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::vector<double> z(x.begin() + r * n, x.begin() + (r + 1) * n);
    const std::vector<double> yr(y.begin() + r * n, y.begin() + (r + 1) * n);
    const std::vector<double> gr(g.begin() + r * n, g.begin() + (r + 1) * n);
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

}  // namespace

Runner add_demo(CLI::App& app) {
  app.add_subcommand("demo", "Specialize, compile and (with a GPU) check a set of kernels against the reference");
  return [] {
    const SystemInfo info = system_info();
    const bool gpu = info.gpu_available;
    const std::string arch = gpu ? current_device().arch : "sm_90a";
    fmt::print("sparsejit {} | NVRTC {} | {}\n\n", info.library_version, info.nvrtc_version,
               gpu ? fmt::format("GPU {} ({})", info.devices[0].name, arch)
                   : fmt::format("no GPU ({}): compiling for {} only", info.no_gpu_reason, arch));
    std::vector<RowNormSpec> specs;
    for (DType d : {DType::f32, DType::bf16})
      for (int n : {8, 64, 1000})
        for (const char* kind : {"softmax", "sparsemax", "entmax15", "entmax:1.25"})
          specs.push_back(kind_from_name(kind, n, d));

    Table table({"spec", "compile", "regs", "max |err|", "|sum-1|", "support", "result"});
    std::mt19937_64 rng(std::random_device{}());
    int failures = 0;
    for (const RowNormSpec& spec : specs) {
      const CompiledKernel k = compile(spec, {}, arch);
      std::vector<std::string> row = {key(spec), fmt::format("{:.0f} ms", k.compile_ms), std::to_string(k.usage.registers)};
      if (!gpu) {
        row.insert(row.end(), {"-", "-", "-", "compiled"});
      } else {
        const Outcome o = run_against_reference(spec, rng);
        const double tolerance = spec.dtype == DType::f32 ? 1e-4 : 2e-2;
        const bool ok = o.max_error <= tolerance && o.worst_sum <= (spec.dtype == DType::f32 ? 1e-5 : 2e-2);
        failures += ok ? 0 : 1;
        row.insert(row.end(), {fmt::format("{:.1e}", o.max_error), fmt::format("{:.1e}", o.worst_sum),
                               fmt::format("{:.1f}/{}", o.mean_support, spec.n), ok ? "ok" : "MISMATCH"});
      }
      table.add(row);
    }
    table.print();
    const JitCounters c = jit_counters();
    fmt::print("\n{} kernels specialized; NVRTC ran {} times in this process.{}\n", specs.size(), c.compiles,
               gpu ? fmt::format(" {} of {} matched the float64 reference.", specs.size() - failures, specs.size())
                   : " Run on a machine with a GPU to check results against the float64 reference.");
    return failures == 0 ? 0 : 1;
  };
}

}  // namespace sjit::tool

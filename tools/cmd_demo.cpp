// sjit demo: the main job. Specializes and compiles a kernel of every op family (row normalizers,
// attention dense and block-sparse forward and backward, the E23 cell forward and backward), in
// parallel, with progress; with a GPU, runs each against its float64 reference on fresh random inputs
// and prints what matched. Without a GPU it compiles for sm_90a and says so.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "demo.h"

namespace sjit::tool {
namespace {

// ---- Compiling every kernel key up front, in parallel, with progress.

struct Compiled {
  std::map<std::string, CompiledKernel> kernels;
  std::map<std::string, std::string> failures;  // key -> what went wrong
  int from_cache = 0;
  double nvrtc_ms = 0, wall_s = 0;
  int jobs = 0;
};

// With `load`, each kernel is also loaded into this process (from the disk cache just written, or by a
// second compile where the cache is off), so that the checks find them all in memory.
Compiled compile_all(const std::vector<std::string>& keys, const std::string& arch, bool load) {
  Compiled out;
  out.jobs = std::clamp(int(std::thread::hardware_concurrency()), 1, 8);
  out.jobs = std::min<int>(out.jobs, int(keys.size()));
  const bool terminal = isatty(STDERR_FILENO);
  fmt::print("Compiling {} kernels for {}, {} at a time\n", keys.size(), arch, out.jobs);
  std::fflush(stdout);
  std::mutex mutex;
  int done = 0;
  const auto start = std::chrono::steady_clock::now();
  run_parallel(keys.size(), out.jobs, [&](std::size_t i) {
    std::optional<CompiledKernel> k;
    std::string failure;
    try {
      k = compile_key(keys[i], arch);
      if (load) prepare_key(keys[i]);
    } catch (const CompileError& e) {
      failure = fmt::format("NVRTC failed:\n{}", e.log());
    } catch (const std::exception& e) {
      failure = e.what();
    }
    std::lock_guard lock(mutex);
    ++done;
    const std::string what = !k ? "FAILED" : k->from_cache ? "cached" : "compiled";
    if (k) {
      out.from_cache += k->from_cache;
      out.nvrtc_ms += k->from_cache ? 0 : k->compile_ms;
      out.kernels.emplace(keys[i], std::move(*k));
    } else {
      out.failures.emplace(keys[i], failure);
    }
    if (terminal) {  // one line redrawn, as `sjit warmup` draws it
      draw_progress(done, int(keys.size()), fmt::format("failed {}", out.failures.size()));
    } else {
      fmt::print("  {:<8} {}\n", what, keys[i]);
      std::fflush(stdout);
    }
  });
  out.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  fmt::print("NVRTC {:.1f} s in all, {:.1f} s wall; {} of {} were in the disk cache ({})\n\n", out.nvrtc_ms / 1000,
             out.wall_s, out.from_cache, keys.size(), cache_settings().dir);
  return out;
}

// Compile time and registers of a row's kernels ("750 ms", "26/168/26"), or why one failed.
struct RowKernels {
  std::string compile, registers;
  bool failed = false;
};

RowKernels describe(const Compiled& compiled, const std::vector<std::string>& keys) {
  RowKernels r;
  double ms = 0;
  for (const std::string& k : keys) {
    auto it = compiled.kernels.find(k);
    if (it == compiled.kernels.end()) {
      r.failed = true;
      continue;
    }
    ms += it->second.compile_ms;
    r.registers += (r.registers.empty() ? "" : "/") + std::to_string(it->second.usage.registers);
  }
  r.compile = fmt::format("{:.0f} ms", ms);
  return r;
}

}  // namespace

Runner add_demo(CLI::App& app) {
  auto* cmd = app.add_subcommand("demo", "Specialize, compile and (with a GPU) check a kernel of every op against its reference");
  auto compile_only = std::make_shared<bool>(false);
  cmd->add_flag("--compile-only", *compile_only, "Compile every kernel but run nothing, even with a GPU");
  return [=] {
    const SystemInfo info = system_info();
    const bool gpu = info.gpu_available;
    const bool run = gpu && !*compile_only;
    const std::string arch = gpu ? current_device().arch : "sm_90a";
    fmt::print("sparsejit {} | NVRTC {} | {}\n\n", info.library_version, info.nvrtc_version,
               gpu ? fmt::format("GPU {} ({})", info.devices[0].name, arch)
                   : fmt::format("no GPU ({}): compiling for {} only", info.no_gpu_reason, arch));

    std::vector<RowNormSpec> rownorms;
    for (DType d : {DType::f32, DType::bf16})
      for (int n : {8, 64, 1000})
        for (const char* kind : {"softmax", "sparsemax", "entmax15", "entmax:1.25"})
          rownorms.push_back(kind_from_name(kind, n, d));
    auto rownorm_keys = [](const RowNormSpec& spec) {
      RowNormSpec backward = spec;
      backward.pass = Pass::backward;
      return std::vector<std::string>{key(spec), key(backward)};
    };
    std::mt19937_64 rng(std::random_device{}());
    std::vector<demo::Case> ops = demo::attention_cases(gpu, arch, rng);
    for (demo::Case& c : demo::e23_cases(rng)) ops.push_back(std::move(c));

    std::vector<std::string> keys;
    for (const RowNormSpec& spec : rownorms)
      for (const std::string& k : rownorm_keys(spec)) keys.push_back(k);
    for (const demo::Case& c : ops) keys.insert(keys.end(), c.kernel_keys.begin(), c.kernel_keys.end());
    const Compiled compiled = compile_all(keys, arch, run);
    const std::string not_run = gpu ? "compiled (not run)" : "compiled (no GPU)";

    int checks = 0, failures = 0;
    Table rownorm_table({"spec", "compile", "regs fwd/bwd", "max |err|", "|sum-1|", "support", "result"});
    for (const RowNormSpec& spec : rownorms) {
      const RowKernels k = describe(compiled, rownorm_keys(spec));
      std::vector<std::string> row = {key(spec), k.compile, k.registers};
      if (k.failed) {
        row.insert(row.end(), {"-", "-", "-", "COMPILE FAILED"});
      } else if (!run) {
        row.insert(row.end(), {"-", "-", "-", not_run});
      } else {
        const demo::RowNormOutcome o = demo::check_rownorm(spec, 64, rng);
        const bool ok = o.ok(spec.dtype);
        ++checks, failures += ok ? 0 : 1;
        row.insert(row.end(), {fmt::format("{:.1e}", o.max_error), fmt::format("{:.1e}", o.worst_sum),
                               fmt::format("{:.1f}/{}", o.mean_support, spec.n), ok ? "ok" : "MISMATCH"});
      }
      rownorm_table.add(row);
    }
    fmt::print("Row normalizers: forward and backward of 64 random rows, against the float64 reference\n");
    rownorm_table.print();

    Table op_table({"spec", "runs", "compile", "regs", "max err", "tolerance", "result"});
    for (const demo::Case& c : ops) {
      const RowKernels k = describe(compiled, c.kernel_keys);
      std::vector<std::string> row = {c.spec, c.run, k.compile, k.registers};
      if (k.failed) {
        row.insert(row.end(), {"-", c.tolerance, "COMPILE FAILED"});
      } else if (!run) {
        row.insert(row.end(), {"-", c.tolerance, not_run});
      } else {
        const demo::Outcome o = c.check();
        ++checks, failures += o.ok() ? 0 : 1;
        row.insert(row.end(), {fmt::format("{:.1e}", o.max_error), c.tolerance,
                               fmt::format("{} ({:.0f}% of the bound){}", o.ok() ? "ok" : "MISMATCH", 100 * o.worst,
                                           o.note.empty() ? "" : ", " + o.note)});
      }
      op_table.add(row);
    }
    fmt::print("\nAttention and E23: random bf16 inputs against the float64 references, with the GPU tests' bounds\n");
    op_table.print();

    for (const auto& [k, why] : compiled.failures) fmt::print(stderr, "\n{} for {}: {}\n", k, arch, why);
    const JitCounters counters = jit_counters();
    fmt::print("\n{} kernels specialized; NVRTC ran {} times in this process.", keys.size(), counters.compiles);
    if (!compiled.failures.empty()) fmt::print(" {} did not compile.", compiled.failures.size());
    if (run) fmt::print(" {} of {} checks matched the float64 reference.\n", checks - failures, checks);
    else fmt::print(" {} to check the results against the float64 references.\n",
                    gpu ? "Run without --compile-only" : "Run on a machine with a GPU");
    return failures == 0 && compiled.failures.empty() ? 0 : 1;
  };
}

}  // namespace sjit::tool

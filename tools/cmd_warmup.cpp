// sjit warmup FILE...: compile every kernel key of the files for each arch into the disk cache, in
// parallel, without a GPU. A progress bar on a terminal, plain lines otherwise; a summary at the end.
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <set>
#include <mutex>
#include <thread>

#include "commands.h"

namespace sjit::tool {
namespace {

struct Job {
  std::string key, arch;
};

struct Tally {
  int compiled = 0, cached = 0, failed = 0;
  double compile_ms = 0;
};

void draw_bar(int done, int total, const std::map<std::string, Tally>& tallies) {
  int compiled = 0, cached = 0, failed = 0;
  for (const auto& [arch, t] : tallies) compiled += t.compiled, cached += t.cached, failed += t.failed;
  draw_progress(done, total, fmt::format("compiled {}  cached {}  failed {}", compiled, cached, failed));
}

}  // namespace

Runner add_warmup(CLI::App& app) {
  auto* cmd = app.add_subcommand("warmup", "Compile every kernel key of the files into the disk cache (no GPU needed)");
  auto files = std::make_shared<std::vector<std::string>>();
  auto archs = std::make_shared<std::string>();
  auto jobs = std::make_shared<int>(int(std::max(1u, std::thread::hardware_concurrency())));
  cmd->add_option("files", *files, "Files of kernel keys, one a line, '#' comments (SJIT_RECORD writes these)")->required();
  cmd->add_option("--arch", *archs, "Comma-separated targets, e.g. sm_80,sm_90a (default: the GPU's, else sm_90a)");
  cmd->add_option("--jobs", *jobs, "Compiles at once")->check(CLI::Range(1, 256));
  return [=] {
    std::vector<WarmupRequest> requests;
    for (const std::string& f : *files) {
      std::vector<WarmupRequest> r = read_warmup_file(f);  // a bad line stops everything, named
      requests.insert(requests.end(), r.begin(), r.end());
    }
    std::vector<std::string> targets = split_commas(*archs);
    if (targets.empty()) targets.push_back(gpu_available() ? current_device().arch : "sm_90a");
    std::vector<Job> work;
    std::set<std::pair<std::string, std::string>> seen;
    for (const std::string& arch : targets)
      for (const WarmupRequest& r : requests)
        if (seen.emplace(r.key, arch).second) work.push_back({r.key, arch});

    const bool terminal = isatty(STDERR_FILENO);
    std::map<std::string, Tally> tallies;
    std::vector<std::string> failures;
    std::mutex mutex;
    int done = 0;
    const auto start = std::chrono::steady_clock::now();
    run_parallel(work.size(), *jobs, [&](std::size_t i) {
      const Job& job = work[i];
      std::string failure;
      double ms = 0;
      bool cached = false;
      try {
        const CompiledKernel k = compile_key(job.key, job.arch);
        cached = k.from_cache;
        ms = k.compile_ms;
      } catch (const CompileError& e) {
        failure = fmt::format("{} for {}: NVRTC failed\n{}", job.key, job.arch, e.log());
      } catch (const std::exception& e) {
        failure = fmt::format("{} for {}: {}", job.key, job.arch, e.what());
      }
      std::lock_guard lock(mutex);
      Tally& t = tallies[job.arch];
      ++done;
      if (!failure.empty()) ++t.failed, failures.push_back(failure);
      else if (cached) ++t.cached;
      else ++t.compiled, t.compile_ms += ms;
      if (terminal) draw_bar(done, int(work.size()), tallies);
      else fmt::print("{:<8} {} {} {}\n", !failure.empty() ? "FAILED" : cached ? "cached" : "compiled", job.arch,
                      job.key, cached || !failure.empty() ? "" : fmt::format("({:.0f} ms)", ms));
    });
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

    for (const std::string& f : failures) fmt::print(stderr, "\n{}\n", f);
    fmt::print("\nwarm-up of {} kernel keys from {} file(s) into {}\n", requests.size(), files->size(),
               cache_settings().dir);
    Table table({"arch", "compiled", "already cached", "failed", "NVRTC time"});
    Tally total;
    for (const auto& [arch, t] : tallies) {
      table.add({arch, std::to_string(t.compiled), std::to_string(t.cached), std::to_string(t.failed),
                 fmt::format("{:.1f} s", t.compile_ms / 1000)});
      total.compiled += t.compiled, total.cached += t.cached, total.failed += t.failed, total.compile_ms += t.compile_ms;
    }
    table.add({"total", std::to_string(total.compiled), std::to_string(total.cached), std::to_string(total.failed),
               fmt::format("{:.1f} s ({:.1f} s wall, {} jobs)", total.compile_ms / 1000, seconds, *jobs)});
    table.print();
    fmt::print("warmup: compiled {}, already cached {}, failed {}\n", total.compiled, total.cached, total.failed);
    return total.failed == 0 ? 0 : 1;
  };
}

}  // namespace sjit::tool

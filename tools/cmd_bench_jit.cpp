// sjit bench jit: what the JIT costs a user. Cold NVRTC compile, disk-cache hit in a fresh process
// (read, verify, load), in-memory hit, and the host time of one launch.
#include <fmt/format.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "commands.h"

namespace sjit::tool {
namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// In a fresh process: the time to get the kernel ready from the disk cache (with a GPU: read, verify,
// load into the context; without: read and verify). Driver start-up is excluded.
int child_disk_hit(const std::string& key, const std::string& arch) {
  const bool gpu = gpu_available();
  if (gpu) (void)current_device();  // context creation is the process's cost, not the cache's
  const auto t = Clock::now();
  if (gpu) prepare_key(key);
  else (void)compile_key(key, arch);
  const double ms = ms_since(t);
  const JitCounters c = jit_counters();
  fmt::print("disk-hit-ms {:.4f} compiles {} disk-hits {}\n", ms, c.compiles, c.disk_hits);
  return 0;
}

double fresh_process_disk_hit_ms(const std::string& self, const std::string& dir, const std::string& key,
                                 const std::string& arch) {
  const std::string command = fmt::format("SJIT_CACHE_DIR='{}' '{}' bench jit --child-disk-hit '{}' --arch {}", dir,
                                          self, key, arch);
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) throw Error("could not start a child process for the disk-hit measurement");
  char line[256] = {};
  double ms = -1;
  unsigned long long compiles = 1, hits = 0;
  while (fgets(line, sizeof(line), pipe) != nullptr)
    if (std::sscanf(line, "disk-hit-ms %lf compiles %llu disk-hits %llu", &ms, &compiles, &hits) == 3) break;
  pclose(pipe);
  if (ms < 0 || compiles != 0 || hits != 1)
    throw Error(fmt::format("the child process did not hit the disk cache (compiles {}, disk hits {})", compiles, hits));
  return ms;
}

int run_jit_bench(const std::string& key, int repeats) {
  const bool gpu = gpu_available();
  const std::string arch = gpu ? current_device().arch : "sm_90a";
  char dir_template[] = "/tmp/sjit-bench-jit-XXXXXX";
  if (mkdtemp(dir_template) == nullptr) throw Error("could not create a temporary cache folder");
  const std::string dir = dir_template;
  set_cache_settings({dir, CacheMode::rw, 1ull << 30});
  fmt::print("kernel {} for {}, cache in {}, {} repeats\n\n", key, arch, dir, repeats);

  std::vector<double> cold;
  for (int i = 0; i < repeats; ++i) {
    cache_clear();
    const auto t = Clock::now();
    const CompiledKernel k = compile_key(key, arch);
    cold.push_back(ms_since(t));
    if (k.from_cache) throw Error("a cold compile was served from the cache");
  }
  std::vector<double> disk;
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  for (int i = 0; i < repeats; ++i) disk.push_back(fresh_process_disk_hit_ms(self, dir, key, arch));

  Table table({"what", "median", "goal", "note"});
  table.add({"cold compile (NVRTC + publish)", fmt::format("{:.1f} ms", median(cold)), "-", "generate, NVRTC, CUBIN, write entry"});
  table.add({"disk hit, fresh process", fmt::format("{:.3f} ms", median(disk)), "<= 2 ms",
             gpu ? "read, verify checksum, load module" : "read, verify checksum (no GPU: no load)"});
  if (gpu) {
    prepare_key(key);
    std::vector<double> memory_us;
    for (int batch = 0; batch < 20; ++batch) {
      const auto t = Clock::now();
      for (int i = 0; i < 1000; ++i) prepare_key(key);
      memory_us.push_back(ms_since(t));  // ms for 1000 = us each
    }
    table.add({"in-memory hit", fmt::format("{:.3f} us", median(memory_us)), "<= 1 us", "key lookup by text, per call"});

    const RowNormSpec spec = parse_rownorm(key.substr(0, key.find('|')));
    DeviceBuffer x(spec.n * size_of(spec.dtype)), y(spec.n * size_of(spec.dtype));
    x.fill_bytes(0);
    RowNorm op(spec);
    op.forward({x.data(), y.data(), 1});
    synchronize();
    OwnedStream stream;
    std::vector<double> prepared_us, own_stream_us, oneshot_us;
    for (int batch = 0; batch < 20; ++batch) {
      auto t = Clock::now();
      for (int i = 0; i < 200; ++i) op.forward({x.data(), y.data(), 1});
      prepared_us.push_back(ms_since(t) * 1000 / 200);
      synchronize();
      t = Clock::now();
      for (int i = 0; i < 200; ++i) op.forward({x.data(), y.data(), 1}, stream.get());
      own_stream_us.push_back(ms_since(t) * 1000 / 200);
      synchronize(stream.get());
      t = Clock::now();
      for (int i = 0; i < 200; ++i) rownorm_forward(spec, {x.data(), y.data(), 1});
      oneshot_us.push_back(ms_since(t) * 1000 / 200);
      synchronize();
    }
    table.add({"launch, prepared RowNorm", fmt::format("{:.2f} us", median(prepared_us)), "<= 3 us", "host time per call: checks + cuLaunchKernel"});
    table.add({"launch, prepared, own stream", fmt::format("{:.2f} us", median(own_stream_us)), "<= 3 us", "the same on a non-blocking stream"});
    table.add({"launch, one-shot rownorm_forward", fmt::format("{:.2f} us", median(oneshot_us)), "-", "adds the cache lookup per call"});
  } else {
    table.add({"in-memory hit", "n/a", "<= 1 us", "needs a GPU (the memory cache holds loaded kernels)"});
    table.add({"launch host overhead", "n/a", "<= 3 us", "needs a GPU"});
  }
  table.print();
  std::filesystem::remove_all(dir);
  return 0;
}

}  // namespace

Runner add_bench_jit(CLI::App& bench) {
  auto* cmd = bench.add_subcommand("jit", "JIT costs: cold compile, disk hit in a fresh process, memory hit, launch");
  auto key = std::make_shared<std::string>("rownorm:kind=entmax,alpha=1.5,n=64,dtype=bf16,pass=fwd");
  auto repeats = std::make_shared<int>(5);
  auto child = std::make_shared<std::string>();
  auto arch = std::make_shared<std::string>("sm_90a");
  cmd->add_option("--key", *key, "Kernel key to measure");
  cmd->add_option("--repeats", *repeats, "Cold compiles and fresh processes (median reported)")->check(CLI::Range(1, 100));
  cmd->add_option("--child-disk-hit", *child, "Internal: measure one disk hit in this process")->group("");
  cmd->add_option("--arch", *arch, "Internal: the arch of the child's measurement")->group("");
  return [=] {
    if (!cmd->parsed()) return -1;  // not this subcommand
    return child->empty() ? run_jit_bench(*key, *repeats) : child_disk_hit(*child, *arch);
  };
}

}  // namespace sjit::tool

// sjit info: versions, devices (or why there are none), paths.
#include <fmt/format.h>

#include <string>

#include "commands.h"

namespace sjit::tool {

Runner add_info(CLI::App& app) {
  app.add_subcommand("info", "Versions, GPUs (or why there are none) and paths");
  return [] {
    const SystemInfo info = system_info();
    fmt::print("sparsejit       {}\n", info.library_version);
    fmt::print("NVRTC           {}\n", info.nvrtc_version);
    fmt::print("CUDA headers    {}\n", info.cuda_include_dir);
    fmt::print("PNG pictures    {}\n", png_support() ? "yes (libpng)" : "no: built without libpng (libpng-dev)");
    if (!info.gpu_available) {
      fmt::print("GPU             none: {}\n", info.no_gpu_reason);
      return 0;
    }
    fmt::print("driver          {}.{}\n", info.driver_version / 1000, info.driver_version % 1000 / 10);
    for (const DeviceInfo& d : info.devices)
      fmt::print("GPU {}           {} (compute {}.{}, arch {}, {} SMs, {:.1f} GiB at {}, L2 {} MiB)\n", d.ordinal,
                 d.name, d.cc_major, d.cc_minor, d.arch, d.multiprocessors, double(d.memory_bytes) / (1 << 30),
                 d.memory_bandwidth > 0 ? fmt::format("{:.2f} TB/s peak", d.memory_bandwidth / 1e12)
                                        : std::string("an unreported bandwidth"),
                 d.l2_bytes >> 20);
    return 0;
  };
}

}  // namespace sjit::tool

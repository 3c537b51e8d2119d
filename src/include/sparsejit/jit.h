// The JIT core's inspectable side: compile a spec for any arch (no GPU needed), see the generated
// source, PTX, CUBIN, NVRTC's log and the resource report, and the process's cache counters.
#pragma once

#include <cstdint>
#include <string>

#include "sparsejit/rownorm.h"

namespace sjit {

struct ResourceUsage {     // from ptxas' report (-v) in the NVRTC log; -1 where it was not reported
  int registers = -1;
  int spill_store_bytes = -1, spill_load_bytes = -1;
  int stack_frame_bytes = -1;
  int shared_bytes = -1;   // static shared memory
};

enum class Emit { cubin, ptx };

struct CompiledKernel {
  std::string kernel_key;   // spec key text | config key text
  std::string arch;         // "sm_90a"
  std::string source;       // the generated unit
  std::string source_name;
  std::string name_expression, lowered_name;
  std::string binary;       // CUBIN bytes or PTX text
  Emit emit = Emit::cubin;
  std::string log;          // NVRTC's log
  double compile_ms = 0;     // NVRTC's time when it was compiled (also for entries read from disk)
  bool from_cache = false;   // read from the disk cache: NVRTC did not run now
  ResourceUsage usage;
};

// Generates and compiles without loading: works without a GPU. arch "" means the current device's.
CompiledKernel compile(const RowNormSpec& spec, const RowNormConfig& config = {}, const std::string& arch = "",
                       Emit emit = Emit::cubin);
std::string generate_source(const RowNormSpec& spec, const RowNormConfig& config = {});

ResourceUsage parse_resource_usage(const std::string& nvrtc_log);

struct JitCounters {
  std::uint64_t compiles = 0;      // NVRTC runs in this process
  std::uint64_t disk_hits = 0;     // binaries read from the disk cache
  std::uint64_t memory_hits = 0;   // lookups answered by the in-memory cache
  std::uint64_t loads = 0;         // modules loaded into a context
};
JitCounters jit_counters();

// Drops every loaded kernel of this process (the next launch compiles or reads a cache again).
// Handles (RowNorm objects) made before keep their own kernels alive.
void clear_memory_cache();

}  // namespace sjit

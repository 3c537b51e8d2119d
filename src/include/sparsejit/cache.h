// The persistent kernel cache and the warm-up of caches for deployment (docs/cache.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sparsejit/jit.h"

namespace sjit {

enum class CacheMode { rw, ro, off };

struct CacheSettings {
  std::string dir;                       // the cache folder
  CacheMode mode = CacheMode::rw;        // rw: use and write; ro: use only (shipped caches); off
  std::uint64_t max_bytes = 2ull << 30;  // size cap, least recently used entries evicted first
};

// In effect for this process: from SJIT_CACHE_DIR / XDG_CACHE_HOME / HOME, SJIT_CACHE and
// SJIT_CACHE_MAX_SIZE unless set_cache_settings() replaced them.
CacheSettings cache_settings();
void set_cache_settings(const CacheSettings& settings);

struct CacheEntryInfo {
  std::string key_text, arch, emit, nvrtc_version, library_version, path;
  std::uint64_t bytes = 0;
  double compile_ms = 0;
  std::string created;
};
std::vector<CacheEntryInfo> cache_entries();

struct CacheStats {
  std::string dir;
  CacheMode mode = CacheMode::rw;
  bool writable = false;
  std::uint64_t entries = 0, bytes = 0, max_bytes = 0;
};
CacheStats cache_stats();

struct CacheVerifyReport {
  std::uint64_t checked = 0, removed = 0;
  std::vector<std::string> problems;  // path: what is wrong
};
CacheVerifyReport cache_verify(bool fix);
std::uint64_t cache_prune(std::uint64_t max_bytes);  // entries removed
void cache_clear();

// Warm-up files: one kernel key per line ("spec" or "spec|config"), '#' starts a comment. Files
// written by SJIT_RECORD=FILE have this format. Throws InvalidSpec naming file:line for a bad line.
struct WarmupRequest {
  std::string file;
  int line = 0;
  std::string key;
};
std::vector<WarmupRequest> read_warmup_file(const std::string& path);

// Compiles a kernel key for an arch through the disk cache (result.from_cache says whether NVRTC ran).
CompiledKernel compile_key(const std::string& kernel_key, const std::string& arch, Emit emit = Emit::cubin);
// The generated unit of a kernel key ("spec" or "spec|config"), without compiling it.
std::string source_for_key(const std::string& kernel_key);

// Makes the kernel ready to launch in the current context: memory cache, else disk cache, else NVRTC.
void prepare_key(const std::string& kernel_key);

}  // namespace sjit

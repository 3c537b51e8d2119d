// The public face of cache/: settings, maintenance, warm-up files, compiling a kernel key.
#include "sparsejit/cache.h"

#include <fmt/chrono.h>
#include <fmt/format.h>

#include <fstream>

#include "cache/disk_cache.h"
#include "jit/jit.h"
#include "ops/kernel_key.h"
#include "sparsejit/error.h"
#include "spec/key_text.h"

namespace sjit {
namespace {

CacheMode to_public(cache::Mode m) { return m == cache::Mode::rw ? CacheMode::rw : m == cache::Mode::ro ? CacheMode::ro : CacheMode::off; }
cache::Mode to_internal(CacheMode m) { return m == CacheMode::rw ? cache::Mode::rw : m == CacheMode::ro ? cache::Mode::ro : cache::Mode::off; }

std::string trim(std::string s) {
  const auto first = s.find_first_not_of(" \t\r");
  if (first == std::string::npos) return {};
  return s.substr(first, s.find_last_not_of(" \t\r") - first + 1);
}

}  // namespace

CacheSettings cache_settings() {
  const cache::Settings& s = cache::process_disk_cache().settings();
  return {s.root.string(), to_public(s.mode), s.max_bytes};
}

void set_cache_settings(const CacheSettings& s) {
  if (s.dir.empty()) throw InvalidArgument("cache settings: dir is empty");
  cache::replace_process_disk_cache({s.dir, to_internal(s.mode), s.max_bytes});
}

std::vector<CacheEntryInfo> cache_entries() {
  std::vector<CacheEntryInfo> out;
  for (const cache::EntryInfo& e : cache::process_disk_cache().list()) {
    const cache::EntryMeta& m = e.meta;
    out.push_back({m.key_text, m.arch, m.emit, m.nvrtc_version, m.library_version, e.binary_path.string(),
                   e.bytes_on_disk, m.compile_ms, m.created});
  }
  return out;
}

CacheStats cache_stats() {
  cache::DiskCache& disk = cache::process_disk_cache();
  const cache::Stats s = disk.stats();
  return {s.root.string(), to_public(s.mode), disk.writable(), s.entries, s.bytes, s.max_bytes};
}

CacheVerifyReport cache_verify(bool fix) {
  const cache::VerifyReport r = cache::process_disk_cache().verify(fix);
  return {r.checked, r.removed, r.problems};
}

std::uint64_t cache_prune(std::uint64_t max_bytes) { return cache::process_disk_cache().prune(max_bytes); }
void cache_clear() { cache::process_disk_cache().clear(); }

std::vector<WarmupRequest> read_warmup_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InvalidArgument(fmt::format("warm-up file {} cannot be read", path));
  std::vector<WarmupRequest> requests;
  int number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    const std::string key = trim(line.substr(0, line.find('#')));
    if (key.empty()) continue;
    try {
      (void)ops::source_for_key(key);  // refuse a bad line now, naming it, not midway through a warm-up
    } catch (const InvalidArgument& e) {
      throw InvalidSpec(fmt::format("{}:{}: {}", path, number, e.what()));
    }
    requests.push_back({path, number, key});
  }
  return requests;
}

}  // namespace sjit

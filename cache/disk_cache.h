// The persistent kernel cache: content-addressed binaries on disk, shared by every process.
//
// An entry is two files in <root>/v1/<arch>/<first two hex digits>/:
//   <digest>.bin   the CUBIN (or PTX) bytes
//   <digest>.json  its metadata record (EntryMeta), published after the binary
// Both are written to a temporary file in the same folder and renamed into place, so a reader never
// sees a partial file. A reader checks the binary's checksum against the record before using it; a
// truncated, corrupt or foreign entry is reported once (with its path), removed, and reported as a miss.
#pragma once

#include <cstdint>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace sjit::cache {

enum class Mode { rw, ro, off };

struct Settings {
  std::filesystem::path root;                 // the cache folder
  Mode mode = Mode::rw;
  std::uint64_t max_bytes = 2ull << 30;       // size cap; least recently used entries go first
};

// SJIT_CACHE_DIR, else $XDG_CACHE_HOME/sparsejit, else ~/.cache/sparsejit; SJIT_CACHE=rw|ro|off
// (default rw); SJIT_CACHE_MAX_SIZE (bytes, or with a K/M/G suffix; default 2G). Throws InvalidArgument
// naming the variable for a bad value.
Settings settings_from_environment();

struct EntryMeta {
  std::string digest;            // hex content key: names the entry
  std::string key_text;          // the kernel's key text (spec | config)
  std::string arch;              // "sm_90a"
  std::string emit;              // "cubin" | "ptx"
  std::string nvrtc_version;     // "13.0"
  std::string library_version;   // "0.1.0"
  std::vector<std::string> options;
  std::string lowered_name;      // the kernel's symbol in the binary
  double compile_ms = 0;
  std::uint64_t size = 0;        // bytes of the binary
  std::string checksum;          // XXH3-128 of the binary, hex
  std::string log;               // NVRTC's log
  std::string created;           // UTC, ISO 8601
};

struct Entry {
  EntryMeta meta;
  std::string binary;
};

struct EntryInfo {               // for `sjit cache ls`
  EntryMeta meta;
  std::filesystem::path binary_path;
  std::uint64_t bytes_on_disk = 0;          // binary + record
  std::filesystem::file_time_type last_used;
};

struct Stats {
  std::uint64_t entries = 0, bytes = 0;
  std::uint64_t max_bytes = 0;
  std::filesystem::path root;
  Mode mode = Mode::rw;
};

struct VerifyReport {
  std::uint64_t checked = 0;
  std::vector<std::string> problems;        // one line each: path and what is wrong
  std::uint64_t removed = 0;                // with fix: one per problem
};

class DiskCache {
 public:
  explicit DiskCache(Settings settings);

  const Settings& settings() const { return settings_; }
  bool writable() const;                    // rw and no write failure seen yet

  // The entry for `digest`, verified; nullopt on a miss or a bad entry (which is then removed, with
  // one warning on stderr naming its path). `expected` fields that are non-empty (arch, nvrtc and
  // library versions, emit) must match, else the entry is foreign: treated as bad. Marks the entry used.
  // expected.arch is required: it names the folder the entry is in. Throws InvalidArgument for a
  // malformed digest or arch.
  std::optional<Entry> load(const std::string& digest, const EntryMeta& expected);

  // Publishes an entry atomically; fills meta.digest/size/checksum/created in the record it writes.
  // Never throws for I/O: a failure (read-only folder, full disk) prints one warning and turns writing
  // off for this object. Evicts least recently used entries beyond the cap afterwards. Throws
  // InvalidArgument for a malformed digest or arch, or an empty binary.
  void store(const std::string& digest, Entry entry);

  // Maintenance, for `sjit cache`. These throw Error for a file system failure; with Mode::ro, those
  // that remove files (verify with fix, prune, clear) throw Error instead of removing anything.
  std::vector<EntryInfo> list() const;
  Stats stats() const;
  VerifyReport verify(bool fix);
  std::uint64_t prune(std::uint64_t max_bytes);  // returns entries removed
  void clear();

 private:
  Settings settings_;
  mutable std::mutex mutex_;
  bool write_failed_ = false;
};

// The process's cache, from the environment, made on first use.
DiskCache& process_disk_cache();

// From now on, process_disk_cache() returns a cache with these settings (sjit::set_cache_settings).
// A reference to the one it replaces stays valid: that object is kept alive, just no longer returned.
void replace_process_disk_cache(Settings settings);

std::string to_string(Mode mode);

}  // namespace sjit::cache

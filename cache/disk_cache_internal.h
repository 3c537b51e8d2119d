// Shared by disk_cache.cpp (settings, load, store) and disk_cache_maintenance.cpp (list, verify, prune,
// clear): where an entry's files live, how they are read and checked, how they are removed.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cache/disk_cache.h"
#include "sparsejit/error.h"

namespace sjit::cache::detail {

namespace fs = std::filesystem;

// A failed file system call, with the path and the reason. Caught by store(), which turns writing off;
// the maintenance functions let it through to their caller (the `sjit cache` command).
class IoError : public Error {
 public:
  using Error::Error;
};

// Throws IoError "cannot <what> <path>: <strerror(errno)>".
[[noreturn]] void throw_io_error(const char* what, const fs::path& path, int error);

// A store publishes the binary and then the record within milliseconds, so a lone binary, a lone record
// or a temporary file older than this was left behind by a process that died or failed half-way.
inline constexpr auto kAbandonedAfter = std::chrono::minutes(1);

bool is_digest(std::string_view text);  // [0-9a-f]{16,64}
bool is_arch(std::string_view text);    // [a-z0-9_]+

fs::path layout_root(const fs::path& root);  // <root>/v1: everything the cache writes lies below it

struct EntryPaths {
  fs::path folder;  // <root>/v1/<arch>/<digest[0..2)>
  fs::path binary;  // <folder>/<digest>.bin
  fs::path record;  // <folder>/<digest>.json
};
EntryPaths entry_paths(const fs::path& root, const std::string& arch, const std::string& digest);

// An exclusive advisory lock (flock) on an entry folder. A store holds it while it renames its two files
// into place, and whoever removes an entry holds it, so that the pair on disk always comes from one
// store: NVRTC does not promise byte-identical output (names with internal linkage, for one, change
// from compile to compile), so two stores of a digest may hold different binaries. Readers take no
// lock, but confirm a bad verdict under it before acting.
// Where the file system has no locks (some network file systems) work goes on unlocked: every pair is
// still verified before use.
class FolderLock {
 public:
  explicit FolderLock(const fs::path& folder);
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;
  ~FolderLock();

 private:
  int fd_ = -1;
};

// The outcome of reading and checking one entry's two files.
struct EntryCheck {
  enum class Status { ok, missing, unreadable, bad } status = Status::missing;
  Entry entry;          // with ok
  std::string problem;  // with unreadable and bad: what is wrong, without the path
};

// Reads both files whole and checks the record against the binary (digest, arch, size, checksum). A
// missing file is a plain miss, except a binary whose record has been missing for kAbandonedAfter.
EntryCheck check_entry(const EntryPaths& paths, const std::string& arch, const std::string& digest);

// The record alone, parsed; nullopt if it is missing, unreadable or unparsable (for listing only).
std::optional<EntryMeta> read_record(const fs::path& path);

// Removes the binary first, so that a reader racing with the removal sees a plain miss, then the record.
// A file already gone is fine. The caller holds the folder's lock. Throws IoError.
void remove_entry_files(const EntryPaths& paths);

// Removes entries, least recently used first, until the entries take at most max_bytes; returns how many
// it removed. Throws IoError.
std::uint64_t evict_least_recently_used(const fs::path& root, std::uint64_t max_bytes);

}  // namespace sjit::cache::detail

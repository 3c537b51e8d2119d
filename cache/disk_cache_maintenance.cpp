// The persistent kernel cache's maintenance, for `sjit cache` and for eviction after a store: walking the
// v1 tree, listing, verifying, pruning and clearing. Other processes may store, load and remove entries
// meanwhile: a file that vanishes between listing a folder and looking at it is simply skipped.
#include <errno.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <system_error>

#include "cache/atomic_file.h"
#include "cache/disk_cache.h"
#include "cache/disk_cache_internal.h"

namespace sjit::cache {

using namespace detail;

namespace {

struct ScannedEntry {
  std::string arch, digest;
  EntryPaths paths;
  bool has_binary = false, has_record = false;
  std::uint64_t bytes = 0;  // binary + record
  fs::file_time_type binary_time, record_time;

  fs::file_time_type last_used() const { return has_binary ? binary_time : record_time; }
  const fs::path& shown_path() const { return has_binary ? paths.binary : paths.record; }
};

struct TemporaryFileSeen {
  fs::path path;
  fs::file_time_type written;
};

struct Scan {
  std::vector<ScannedEntry> entries;          // lone binaries and lone records included
  std::vector<TemporaryFileSeen> temporaries;
  std::vector<fs::path> folders;              // deepest first, for clear()
  std::uint64_t bytes = 0;                    // of the entries
};

bool is_prefix_folder_name(const std::string& name) {
  auto lower_hex = [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); };
  return name.size() == 2 && std::all_of(name.begin(), name.end(), lower_hex);
}

// Removed by another process since we listed its folder (or replaced by a file, for a folder).
bool vanished(const std::error_code& ec) {
  return ec == std::errc::no_such_file_or_directory || ec == std::errc::not_a_directory;
}

// Calls visit(entry) for each thing in `folder`; a folder that does not exist (yet, or any more) is empty.
template <class Visit>
void for_each_in(const fs::path& folder, Visit visit) {
  std::error_code ec;
  fs::directory_iterator it(folder, ec);
  if (vanished(ec)) return;
  if (ec) throw IoError(fmt::format("cannot list {}: {}", folder.string(), ec.message()));
  for (const fs::directory_iterator end; it != end;) {
    visit(*it);
    it.increment(ec);
    if (ec) throw IoError(fmt::format("cannot list {}: {}", folder.string(), ec.message()));
  }
}

// Size and mtime of one file; false if it vanished meanwhile.
bool file_facts(const fs::directory_entry& file, std::uint64_t* bytes, fs::file_time_type* written) {
  std::error_code ec;
  *bytes = file.file_size(ec);
  if (!ec) *written = file.last_write_time(ec);
  if (vanished(ec)) return false;
  if (ec) throw IoError(fmt::format("cannot inspect {}: {}", file.path().string(), ec.message()));
  return true;
}

void scan_prefix_folder(const fs::path& root, const fs::path& folder, const std::string& arch,
                        const std::string& prefix, std::map<std::string, ScannedEntry>& entries, Scan& scan) {
  for_each_in(folder, [&](const fs::directory_entry& file) {
    const std::string name = file.path().filename().string();
    const std::string stem = file.path().stem().string();
    const std::string extension = file.path().extension().string();
    const bool temporary = is_temporary_file_name(name);
    const bool entry_file = (extension == ".bin" || extension == ".json") && is_digest(stem) &&
                            stem.starts_with(prefix);
    if (!temporary && !entry_file) return;  // not ours: left alone
    std::uint64_t bytes = 0;
    fs::file_time_type written;
    if (!file_facts(file, &bytes, &written)) return;
    if (temporary) {
      scan.temporaries.push_back({file.path(), written});
      return;
    }
    ScannedEntry& entry = entries[arch + "/" + stem];
    entry.arch = arch;
    entry.digest = stem;
    entry.paths = entry_paths(root, arch, stem);
    (extension == ".bin" ? entry.has_binary : entry.has_record) = true;
    (extension == ".bin" ? entry.binary_time : entry.record_time) = written;
    entry.bytes += bytes;
    scan.bytes += bytes;
  });
}

// Everything under <root>/v1/<arch>/<prefix>/ that the cache wrote; anything else is left alone.
Scan scan(const fs::path& root) {
  Scan scan;
  std::map<std::string, ScannedEntry> entries;
  const fs::path top = layout_root(root);
  for_each_in(top, [&](const fs::directory_entry& arch_folder) {
    const std::string arch = arch_folder.path().filename().string();
    std::error_code ec;
    if (!is_arch(arch) || !arch_folder.is_directory(ec)) return;
    for_each_in(arch_folder.path(), [&](const fs::directory_entry& prefix_folder) {
      const std::string prefix = prefix_folder.path().filename().string();
      if (!is_prefix_folder_name(prefix) || !prefix_folder.is_directory(ec)) return;
      scan_prefix_folder(root, prefix_folder.path(), arch, prefix, entries, scan);
      scan.folders.push_back(prefix_folder.path());
    });
    scan.folders.push_back(arch_folder.path());
  });
  scan.folders.push_back(top);
  for (auto& [key, entry] : entries) scan.entries.push_back(std::move(entry));
  return scan;
}

bool abandoned(fs::file_time_type written) { return fs::file_time_type::clock::now() - written > kAbandonedAfter; }

// A record whose binary has been gone for long: what an interrupted removal leaves.
bool abandoned_lone_record(const EntryPaths& paths) {
  std::error_code ec;
  if (fs::exists(paths.binary, ec) || ec) return false;
  const fs::file_time_type written = fs::last_write_time(paths.record, ec);
  return !ec && abandoned(written);
}

// What verify() reports for an entry, from the files as they are now; empty when the entry is good or a
// store or removal may still be under way.
std::string entry_problem(const ScannedEntry& entry) {
  const EntryCheck check = check_entry(entry.paths, entry.arch, entry.digest);
  switch (check.status) {
    case EntryCheck::Status::ok: return {};
    case EntryCheck::Status::bad:
    case EntryCheck::Status::unreadable: return check.problem;
    case EntryCheck::Status::missing: break;
  }
  return abandoned_lone_record(entry.paths) ? "the record has no binary (left by an interrupted removal)" : "";
}

void remove_entry(const EntryPaths& paths) {
  const FolderLock lock(paths.folder);
  remove_entry_files(paths);
}

void remove_file(const fs::path& path) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) throw_io_error("remove", path, errno);
}

// An empty folder goes; one holding anything (a store in progress, a user's file) stays.
void remove_folder_if_empty(const fs::path& folder) {
  if (::rmdir(folder.c_str()) != 0 && errno != ENOTEMPTY && errno != EEXIST && errno != ENOENT)
    throw_io_error("remove folder", folder, errno);
}

void refuse_if_read_only(const Settings& settings, const char* action) {
  if (settings.mode == Mode::ro)
    throw Error(fmt::format("cannot {} the kernel cache at {}: it is read-only here (SJIT_CACHE=ro)", action,
                            settings.root.string()));
}

}  // namespace

std::uint64_t detail::evict_least_recently_used(const fs::path& root, std::uint64_t max_bytes) {
  Scan found = scan(root);
  if (found.bytes <= max_bytes) return 0;
  std::sort(found.entries.begin(), found.entries.end(), [](const ScannedEntry& a, const ScannedEntry& b) {
    if (a.last_used() != b.last_used()) return a.last_used() < b.last_used();
    return a.digest < b.digest;  // ties (coarse file system clocks) in a stable order
  });
  std::uint64_t bytes = found.bytes, removed = 0;
  for (const ScannedEntry& entry : found.entries) {
    if (bytes <= max_bytes) break;
    remove_entry(entry.paths);
    bytes -= entry.bytes;
    ++removed;
  }
  return removed;
}

std::vector<EntryInfo> DiskCache::list() const {
  std::vector<EntryInfo> infos;
  for (const ScannedEntry& entry : scan(settings_.root).entries) {
    if (!entry.has_binary || !entry.has_record) continue;  // half an entry: verify() reports it
    std::optional<EntryMeta> meta = read_record(entry.paths.record);
    if (!meta) continue;
    infos.push_back({std::move(*meta), entry.paths.binary, entry.bytes, entry.binary_time});
  }
  std::sort(infos.begin(), infos.end(), [](const EntryInfo& a, const EntryInfo& b) {
    return a.last_used > b.last_used;  // most recently used first
  });
  return infos;
}

Stats DiskCache::stats() const {
  const Scan found = scan(settings_.root);
  return {found.entries.size(), found.bytes, settings_.max_bytes, settings_.root, settings_.mode};
}

VerifyReport DiskCache::verify(bool fix) {
  if (fix) refuse_if_read_only(settings_, "fix");
  VerifyReport report;
  const Scan found = scan(settings_.root);
  for (const ScannedEntry& entry : found.entries) {
    ++report.checked;
    if (entry_problem(entry).empty()) continue;
    // We may have read one store's record and another's binary: look again where no store is half-way.
    const FolderLock lock(entry.paths.folder);
    const std::string problem = entry_problem(entry);
    if (problem.empty()) continue;
    report.problems.push_back(fmt::format("{}: {}", entry.shown_path().string(), problem));
    if (!fix) continue;
    remove_entry_files(entry.paths);
    ++report.removed;
  }
  for (const TemporaryFileSeen& temporary : found.temporaries) {
    if (!abandoned(temporary.written)) continue;  // a store is writing it right now
    report.problems.push_back(fmt::format("{}: temporary file left by an interrupted store", temporary.path.string()));
    if (!fix) continue;
    remove_file(temporary.path);
    ++report.removed;
  }
  return report;
}

std::uint64_t DiskCache::prune(std::uint64_t max_bytes) {
  refuse_if_read_only(settings_, "prune");
  return evict_least_recently_used(settings_.root, max_bytes);
}

void DiskCache::clear() {
  refuse_if_read_only(settings_, "clear");
  const Scan found = scan(settings_.root);
  for (const ScannedEntry& entry : found.entries) remove_entry(entry.paths);
  // A recent temporary file belongs to a store in progress: removing it would make that store fail.
  for (const TemporaryFileSeen& temporary : found.temporaries)
    if (abandoned(temporary.written)) remove_file(temporary.path);
  for (const fs::path& folder : found.folders) remove_folder_if_empty(folder);
}

}  // namespace sjit::cache

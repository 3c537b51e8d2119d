// The persistent kernel cache: settings, the layout, reading and checking an entry, load and store.
// list/stats/verify/prune/clear are in disk_cache_maintenance.cpp.
#include "cache/disk_cache.h"

#include <errno.h>
#include <fcntl.h>
#include <fmt/chrono.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <sys/file.h>
#include <sys/stat.h>  // utimensat
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <mutex>
#include <set>
#include <utility>

#include "cache/atomic_file.h"
#include "cache/disk_cache_internal.h"

namespace sjit::cache {

// The record is EntryMeta as a JSON object; a missing field or a field of the wrong type fails parsing.
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(EntryMeta, digest, key_text, arch, emit, nvrtc_version, library_version,
                                   options, lowered_name, compile_ms, size, checksum, log, created)

namespace detail {

void throw_io_error(const char* what, const fs::path& path, int error) {
  throw IoError(fmt::format("cannot {} {}: {}", what, path.string(), std::strerror(error)));
}

bool is_digest(std::string_view text) {
  return text.size() >= 16 && text.size() <= 64 &&
         std::all_of(text.begin(), text.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

bool is_arch(std::string_view text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  });
}

fs::path layout_root(const fs::path& root) { return root / "v1"; }

EntryPaths entry_paths(const fs::path& root, const std::string& arch, const std::string& digest) {
  const fs::path folder = layout_root(root) / arch / digest.substr(0, 2);
  return {folder, folder / (digest + ".bin"), folder / (digest + ".json")};
}

void remove_entry_files(const EntryPaths& paths) {
  for (const fs::path* path : {&paths.binary, &paths.record})
    if (::unlink(path->c_str()) != 0 && errno != ENOENT) throw_io_error("remove", *path, errno);
}

namespace {

struct FileContents {
  enum class Status { ok, missing, failed } status = Status::missing;
  std::string bytes;
  int error = 0;  // errno, with failed
};

// Appends everything left in `fd` to `bytes`; false (errno set) on a read error.
bool read_to_end(int fd, std::string& bytes) {
  char buffer[64 * 1024];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n == 0) return true;
    if (n > 0) bytes.append(buffer, static_cast<std::size_t>(n));
    else if (errno != EINTR) return false;
  }
}

// Reads the whole file into memory: once open, the bytes stay readable even if another process
// removes or replaces the file meanwhile (POSIX keeps an unlinked open file alive).
FileContents read_whole_file(const fs::path& path) {
  FileContents out;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    // ENOTDIR: a folder on the way is a file, so the entry is not there either.
    out.status = errno == ENOENT || errno == ENOTDIR ? FileContents::Status::missing : FileContents::Status::failed;
    out.error = errno;
    return out;
  }
  const bool complete = read_to_end(fd, out.bytes);
  out.error = errno;
  ::close(fd);  // opened read-only: closing cannot lose data, so its result tells nothing
  out.status = complete ? FileContents::Status::ok : FileContents::Status::failed;
  return out;
}

std::string checksum_hex(std::string_view bytes) {
  XXH128_canonical_t canonical;  // big-endian bytes: the hex is what `xxhsum -H2` prints
  XXH128_canonicalFromHash(&canonical, XXH3_128bits(bytes.data(), bytes.size()));
  std::string hex;
  for (unsigned char byte : canonical.digest) hex += fmt::format("{:02x}", byte);
  return hex;
}

std::string record_text(const EntryMeta& meta) {
  // NVRTC's log may hold bytes that are not UTF-8: replace them rather than fail the store.
  return nlohmann::json(meta).dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

std::optional<EntryMeta> parse_record(const std::string& text, std::string* problem) {
  try {
    return nlohmann::json::parse(text).get<EntryMeta>();
  } catch (const nlohmann::json::exception& e) {
    *problem = fmt::format("unparsable record ({})", e.what());
    return std::nullopt;
  }
}

std::string integrity_problem(const EntryMeta& meta, const std::string& binary, const std::string& arch,
                              const std::string& digest) {
  if (meta.digest != digest) return fmt::format("the record names digest '{}'", meta.digest);
  if (meta.arch != arch) return fmt::format("the record names arch '{}'", meta.arch);
  if (binary.empty()) return "the binary is empty";
  if (binary.size() != meta.size)
    return fmt::format("the binary has {} bytes, the record says {}", binary.size(), meta.size);
  if (checksum_hex(binary) != meta.checksum) return "the binary's checksum does not match the record";
  return {};
}

EntryCheck unreadable(const char* which, const FileContents& file) {
  return {EntryCheck::Status::unreadable, {}, fmt::format("cannot read the {}: {}", which, std::strerror(file.error))};
}

// A store renames the binary into place just before the record: a binary alone is a store in progress,
// unless it has been alone for so long that the store must have died.
EntryCheck binary_without_record(const EntryPaths& paths) {
  std::error_code ec;
  const fs::file_time_type written = fs::last_write_time(paths.binary, ec);
  if (ec || fs::file_time_type::clock::now() - written < kAbandonedAfter) return {EntryCheck::Status::missing};
  return {EntryCheck::Status::bad, {}, "the binary has no record (left by an interrupted store)"};
}

EntryCheck check_pair(const FileContents& record, FileContents binary, const std::string& arch,
                      const std::string& digest) {
  EntryCheck check;
  std::optional<EntryMeta> meta = parse_record(record.bytes, &check.problem);
  if (meta) check.problem = integrity_problem(*meta, binary.bytes, arch, digest);
  if (!check.problem.empty()) {
    check.status = EntryCheck::Status::bad;
    return check;
  }
  check.status = EntryCheck::Status::ok;
  check.entry = {std::move(*meta), std::move(binary.bytes)};
  return check;
}

}  // namespace

std::optional<EntryMeta> read_record(const fs::path& path) {
  const FileContents record = read_whole_file(path);
  if (record.status != FileContents::Status::ok) return std::nullopt;
  std::string problem;
  return parse_record(record.bytes, &problem);
}

EntryCheck check_entry(const EntryPaths& paths, const std::string& arch, const std::string& digest) {
  const FileContents record = read_whole_file(paths.record);
  if (record.status == FileContents::Status::missing) return binary_without_record(paths);
  if (record.status == FileContents::Status::failed) return unreadable("record", record);
  FileContents binary = read_whole_file(paths.binary);
  if (binary.status == FileContents::Status::missing) return {EntryCheck::Status::missing};  // being removed
  if (binary.status == FileContents::Status::failed) return unreadable("binary", binary);
  return check_pair(record, std::move(binary), arch, digest);
}

FolderLock::FolderLock(const fs::path& folder) {
  fd_ = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd_ < 0) return;  // no folder, so no entry in it to guard
  while (::flock(fd_, LOCK_EX) != 0) {
    if (errno == EINTR) continue;
    ::close(fd_);  // no locks here (ENOLCK, or EBADF on NFS): go on unlocked, as documented above
    fd_ = -1;
    return;
  }
}

FolderLock::~FolderLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

}  // namespace detail

using namespace detail;

namespace {

std::optional<std::string> environment_value(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;  // empty counts as unset
  return std::string(value);
}

Mode mode_from_environment() {
  const auto value = environment_value("SJIT_CACHE");
  if (!value || *value == "rw") return Mode::rw;
  if (*value == "ro") return Mode::ro;
  if (*value == "off") return Mode::off;
  throw InvalidArgument(fmt::format("SJIT_CACHE='{}' is not a cache mode: use rw (read and write, the default), "
                                    "ro (read only) or off", *value));
}

std::optional<std::uint64_t> parse_size(const std::string& text) {
  std::uint64_t number = 0;
  const char* end = text.data() + text.size();
  const auto [rest, ec] = std::from_chars(text.data(), end, number);
  if (ec != std::errc() || rest == text.data()) return std::nullopt;
  std::uint64_t unit = 1;
  if (rest != end) {
    if (rest + 1 != end) return std::nullopt;
    switch (*rest) {
      case 'K': case 'k': unit = 1ull << 10; break;
      case 'M': case 'm': unit = 1ull << 20; break;
      case 'G': case 'g': unit = 1ull << 30; break;
      default: return std::nullopt;
    }
  }
  if (number == 0 || number > UINT64_MAX / unit) return std::nullopt;
  return number * unit;
}

std::uint64_t max_bytes_from_environment() {
  const auto value = environment_value("SJIT_CACHE_MAX_SIZE");
  if (!value) return Settings{}.max_bytes;
  if (const auto bytes = parse_size(*value)) return *bytes;
  throw InvalidArgument(fmt::format("SJIT_CACHE_MAX_SIZE='{}' is not a size: use a positive number of bytes, "
                                    "optionally with a K, M or G suffix (e.g. 512M)", *value));
}

fs::path root_from_environment(Mode mode) {
  if (const auto dir = environment_value("SJIT_CACHE_DIR")) return fs::absolute(*dir);
  // The XDG base directory spec says to ignore a relative XDG_CACHE_HOME.
  if (const auto xdg = environment_value("XDG_CACHE_HOME"); xdg && fs::path(*xdg).is_absolute())
    return fs::path(*xdg) / "sparsejit";
  if (const auto home = environment_value("HOME")) return fs::path(*home) / ".cache" / "sparsejit";
  if (mode == Mode::off) return {};
  throw InvalidArgument("no folder for the kernel cache: SJIT_CACHE_DIR, XDG_CACHE_HOME and HOME are all unset; "
                        "set SJIT_CACHE_DIR to a folder, or SJIT_CACHE=off");
}

void require_valid_key(const std::string& digest, const std::string& arch) {
  if (!is_digest(digest))
    throw InvalidArgument(fmt::format("cache digest '{}' is not valid: use 16 to 64 lowercase hex digits", digest));
  if (!is_arch(arch))
    throw InvalidArgument(fmt::format("cache entry arch '{}' is not valid: use lowercase letters, digits and "
                                      "'_' (e.g. sm_90a)", arch));
}

// Each bad path is reported once per process: a long-running job that meets it again stays quiet.
void warn_once(const fs::path& path, const std::string& message) {
  static std::mutex mutex;
  static std::set<std::string> warned;
  std::lock_guard lock(mutex);
  if (warned.insert(path.string()).second)
    fmt::print(stderr, "sparsejit: warning: kernel cache entry {}: {}\n", path.string(), message);
}

std::string foreign_problem(const EntryMeta& meta, const EntryMeta& expected) {
  auto differs = [](const std::string& want, const std::string& have) { return !want.empty() && want != have; };
  if (differs(expected.library_version, meta.library_version))
    return fmt::format("written by sparsejit {}, this is sparsejit {}", meta.library_version, expected.library_version);
  if (differs(expected.nvrtc_version, meta.nvrtc_version))
    return fmt::format("compiled by NVRTC {}, this process uses NVRTC {}", meta.nvrtc_version, expected.nvrtc_version);
  if (differs(expected.emit, meta.emit))
    return fmt::format("holds {}, {} was asked for", meta.emit, expected.emit);
  return {};
}

// check_entry, and then whether this process can use the entry.
EntryCheck check_for_use(const EntryPaths& paths, const std::string& digest, const EntryMeta& expected) {
  EntryCheck check = check_entry(paths, expected.arch, digest);
  if (check.status == EntryCheck::Status::ok) {
    check.problem = foreign_problem(check.entry.meta, expected);
    if (!check.problem.empty()) check.status = EntryCheck::Status::bad;
  }
  return check;
}

// Called with the folder's lock held. A read-only cache keeps the entry: this process may not write.
void refuse_bad_entry(const EntryPaths& paths, const std::string& problem, Mode mode) {
  if (mode == Mode::ro) {
    warn_once(paths.binary, problem + "; refused (read-only cache: left in place)");
    return;
  }
  try {
    remove_entry_files(paths);
    warn_once(paths.binary, problem + "; removed");
  } catch (const IoError& e) {
    warn_once(paths.binary, fmt::format("{}; refused, but {}", problem, e.what()));
  }
}

// The folders are owner-only (as the XDG spec asks): a folder others could write to would let them plant
// binaries that this user's processes then load and run. The files are 0644, like any cache's.
void publish_entry(const EntryPaths& paths, const Entry& entry) {
  try {
    make_private_folder(paths.folder);
    // clear() in another process may remove the folder after we made it: the files make it again.
    constexpr auto kRecreate = TemporaryFile::MissingFolder::recreate;
    TemporaryFile binary(paths.binary, 0644, kRecreate), record(paths.record, 0644, kRecreate);
    binary.write(entry.binary);
    record.write(record_text(entry.meta));
    const FolderLock lock(paths.folder);
    // No fsync: a file torn by a power cut fails its checksum and is removed by the next load. A temporary
    // file left by a failure is reported by verify().
    binary.publish();  // binary first: a record always has its binary in place
    record.publish();
  } catch (const FileError& e) {
    throw_io_error(e.operation(), e.path(), e.error());
  }
}

std::string utc_now_iso8601() { return fmt::format("{:%Y-%m-%dT%H:%M:%SZ}", fmt::gmtime(std::time(nullptr))); }

}  // namespace

Settings settings_from_environment() {
  Settings settings;
  settings.mode = mode_from_environment();
  settings.max_bytes = max_bytes_from_environment();
  settings.root = root_from_environment(settings.mode);
  return settings;
}

std::string to_string(Mode mode) {
  switch (mode) {
    case Mode::rw: return "rw";
    case Mode::ro: return "ro";
    case Mode::off: return "off";
  }
  return "unknown";
}

DiskCache::DiskCache(Settings settings) : settings_(std::move(settings)) {
  if (settings_.root.empty() && settings_.mode != Mode::off)
    throw InvalidArgument(fmt::format("the kernel cache needs a folder: Settings::root is empty (mode {})",
                                      to_string(settings_.mode)));
}

bool DiskCache::writable() const {
  std::lock_guard lock(mutex_);
  return settings_.mode == Mode::rw && !write_failed_;
}

std::optional<Entry> DiskCache::load(const std::string& digest, const EntryMeta& expected) {
  require_valid_key(digest, expected.arch);
  if (settings_.mode == Mode::off) return std::nullopt;
  const EntryPaths paths = entry_paths(settings_.root, expected.arch, digest);
  EntryCheck check = check_for_use(paths, digest, expected);
  if (check.status == EntryCheck::Status::bad) {
    // We may have read one store's record and another's binary: look again where no store is half-way.
    const FolderLock lock(paths.folder);
    check = check_for_use(paths, digest, expected);
    if (check.status == EntryCheck::Status::bad) {
      refuse_bad_entry(paths, check.problem, settings_.mode);
      return std::nullopt;
    }
  }
  if (check.status == EntryCheck::Status::unreadable) warn_once(paths.binary, check.problem + "; treated as a miss");
  if (check.status != EntryCheck::Status::ok) return std::nullopt;
  // The binary's mtime is its last use, for eviction. Failing to set it (a cache shared read-only with
  // this user) only makes eviction less fair, so it is not worth a warning.
  if (settings_.mode == Mode::rw) (void)::utimensat(AT_FDCWD, paths.binary.c_str(), nullptr, 0);
  return std::move(check.entry);
}

void DiskCache::store(const std::string& digest, Entry entry) {
  require_valid_key(digest, entry.meta.arch);
  if (entry.binary.empty()) throw InvalidArgument(fmt::format("cache entry {}: the binary is empty", digest));
  if (!writable()) return;
  entry.meta.digest = digest;
  entry.meta.size = entry.binary.size();
  entry.meta.checksum = checksum_hex(entry.binary);
  entry.meta.created = utc_now_iso8601();
  const EntryPaths paths = entry_paths(settings_.root, entry.meta.arch, digest);
  try {
    publish_entry(paths, entry);
    evict_least_recently_used(settings_.root, settings_.max_bytes);
  } catch (const IoError& e) {
    std::lock_guard lock(mutex_);
    if (std::exchange(write_failed_, true)) return;  // another thread has said it already
    fmt::print(stderr, "sparsejit: warning: kernel cache writes are off for this process: {}\n", e.what());
  }
}

namespace {

// Neither this nor any cache it has held is ever destroyed: threads still compiling during static
// teardown, or holding a reference across replace_process_disk_cache(), may store into it.
struct ProcessCache {
  std::mutex mutex;
  DiskCache* current = nullptr;  // made from the environment on first use
  std::vector<DiskCache*> replaced;  // kept reachable, so that leak checkers see them as kept on purpose
};

ProcessCache& process_cache() {
  static ProcessCache* cache = new ProcessCache;
  return *cache;
}

}  // namespace

DiskCache& process_disk_cache() {
  ProcessCache& process = process_cache();
  std::lock_guard lock(process.mutex);
  if (process.current == nullptr) process.current = new DiskCache(settings_from_environment());
  return *process.current;
}

void replace_process_disk_cache(Settings settings) {
  auto replacement = std::make_unique<DiskCache>(std::move(settings));  // if this throws, nothing changes
  ProcessCache& process = process_cache();
  std::lock_guard lock(process.mutex);
  if (process.current != nullptr) process.replaced.push_back(process.current);
  process.current = replacement.release();
}

}  // namespace sjit::cache

// The tuning database: one JSON file per (device model, op, spec, shape bucket), published by rename so
// that readers never see half an entry, and checked on every read against the key that was asked for.
#include "tune/tuning_db.h"

#include <errno.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <set>
#include <tuple>
#include <utility>

#include "cache/atomic_file.h"
#include "sparsejit/error.h"

namespace sjit::tune {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kFormat = "sparsejit-tuning";
constexpr int kVersion = 1;

// ---- the layout -----------------------------------------------------------------------------------

// A device name made safe for a folder name: lower case, every run of other characters one '-'.
// Cut short so that a long marketing name cannot exceed the file system's name limit; the digest, not
// the folder, tells keys apart.
std::string folder_safe_name(const std::string& name) {
  constexpr std::size_t kMaxLength = 64;
  std::string safe;
  bool pending_dash = false;
  for (char c : name) {
    const char lower = (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
    const bool keep = (lower >= 'a' && lower <= 'z') || (lower >= '0' && lower <= '9');
    if (!keep) {
      pending_dash = !safe.empty();
      continue;
    }
    if (pending_dash) safe += '-';
    pending_dash = false;
    safe += lower;
  }
  if (safe.size() > kMaxLength) safe.resize(kMaxLength);
  return safe;
}

// e.g. "nvidia-h100-80gb-hbm3_sm90_132sm": entries of one device model sit together, for people and `ls`.
std::string device_slug(const DeviceModel& device) {
  return fmt::format("{}_sm{}{}_{}sm", folder_safe_name(device.name), device.cc_major, device.cc_minor,
                     device.multiprocessors);
}

// Every field length-prefixed, so that no two different keys hash the same text ("a|b" + "c" vs "a" + "b|c").
std::string key_text_for_digest(const TuningKey& key) {
  std::string text;
  auto add = [&](const std::string& field) { text += fmt::format("{}:{};", field.size(), field); };
  add(key.device.name);
  add(std::to_string(key.device.cc_major));
  add(std::to_string(key.device.cc_minor));
  add(std::to_string(key.device.multiprocessors));
  add(key.op);
  add(key.spec_key);
  add(key.bucket);
  return text;
}

std::string key_digest(const TuningKey& key) {
  const std::string text = key_text_for_digest(key);
  XXH128_canonical_t canonical;  // big-endian bytes: the hex is what `xxhsum -H2` prints
  XXH128_canonicalFromHash(&canonical, XXH3_128bits(text.data(), text.size()));
  std::string hex;
  for (unsigned char byte : canonical.digest) hex += fmt::format("{:02x}", byte);
  return hex;
}

// <device slug>/<digest>.json: where the entry lives under <root>/v1.
fs::path entry_place(const TuningKey& key) { return fs::path(device_slug(key.device)) / (key_digest(key) + ".json"); }

fs::path entry_path(const fs::path& root, const TuningKey& key) { return root / "v1" / entry_place(key); }

fs::path place_of_file(const fs::path& path) { return path.parent_path().filename() / path.filename(); }

// Temporary files are hidden (cache::temporary_name_for: ".<final name>.<pid>.<thread>.<random>.tmp") so that
// listings skip them.
bool is_entry_file_name(const std::string& name) {
  return !name.empty() && name.front() != '.' && name.ends_with(".json");
}

// ---- entries as JSON ------------------------------------------------------------------------------

json key_to_json(const TuningKey& key) {
  return {{"device",
           {{"name", key.device.name},
            {"cc_major", key.device.cc_major},
            {"cc_minor", key.device.cc_minor},
            {"multiprocessors", key.device.multiprocessors}}},
          {"op", key.op},
          {"spec_key", key.spec_key},
          {"bucket", key.bucket}};
}

json entry_to_json(const TuningEntry& entry) {
  return {{"key", key_to_json(entry.key)},
          {"winner_config", entry.winner_config},
          {"winner_us", entry.winner_us},
          {"default_config", entry.default_config},
          {"default_us", entry.default_us},
          {"candidates", entry.candidates},
          {"measured_at", entry.measured_at},
          {"library_version", entry.library_version},
          {"kernels", entry.kernels}};
}

// Reads fields out of one JSON object, throwing InvalidArgument that names the field by its full path
// ("key.device.cc_major") so that a person can find it in a file or an import document.
class FieldReader {
 public:
  FieldReader(const json& object, std::string prefix) : object_(object), prefix_(std::move(prefix)) {}

  const json& object(const char* name) const { return require(name, &json::is_object, "an object"); }
  std::string text(const char* name) const { return require(name, &json::is_string, "a string").get<std::string>(); }

  // A time is finite: JSON cannot hold NaN or infinity, so a store must not try to write one.
  double number(const char* name) const {
    const double value = require(name, &json::is_number, "a number").get<double>();
    if (!std::isfinite(value))
      throw InvalidArgument(fmt::format("field '{}' = {} must be a finite number", path_of(name), value));
    return value;
  }

  int integer(const char* name) const {
    const json& value = require(name, &json::is_number_integer, "an integer");
    const bool fits = value.is_number_unsigned()
                          ? value.get<std::uint64_t>() <= static_cast<std::uint64_t>(std::numeric_limits<int>::max())
                          : value.get<std::int64_t>() >= std::numeric_limits<int>::min() &&
                                value.get<std::int64_t>() <= std::numeric_limits<int>::max();
    if (!fits) throw InvalidArgument(fmt::format("field '{}' = {} does not fit an int", path_of(name), value.dump()));
    return value.get<int>();
  }

 private:
  std::string path_of(const char* name) const { return prefix_ + name; }

  const json& require(const char* name, bool (json::*is_kind)() const noexcept, const char* kind) const {
    const auto it = object_.find(name);
    if (it == object_.end()) throw InvalidArgument(fmt::format("field '{}' is missing", path_of(name)));
    if (!((*it).*is_kind)())
      throw InvalidArgument(fmt::format("field '{}' must be {}, not {}", path_of(name), kind, it->type_name()));
    return *it;
  }

  const json& object_;
  std::string prefix_;
};

// Throws InvalidArgument naming the first missing or mistyped field. Fields it does not know are ignored,
// so that a later version may add some without breaking this reader.
TuningEntry entry_from_json(const json& object) {
  if (!object.is_object())
    throw InvalidArgument(fmt::format("the entry must be an object, not {}", object.type_name()));
  const FieldReader top(object, "");
  const FieldReader key(top.object("key"), "key.");
  const FieldReader device(key.object("device"), "key.device.");
  TuningEntry entry;
  entry.key.device.name = device.text("name");
  entry.key.device.cc_major = device.integer("cc_major");
  entry.key.device.cc_minor = device.integer("cc_minor");
  entry.key.device.multiprocessors = device.integer("multiprocessors");
  entry.key.op = key.text("op");
  entry.key.spec_key = key.text("spec_key");
  entry.key.bucket = key.text("bucket");
  entry.winner_config = top.text("winner_config");
  entry.winner_us = top.number("winner_us");
  entry.default_config = top.text("default_config");
  entry.default_us = top.number("default_us");
  entry.candidates = top.integer("candidates");
  entry.measured_at = top.text("measured_at");
  entry.library_version = top.text("library_version");
  // Optional: entries written before it was kept have none (and count as measured with other kernels).
  if (object.contains("kernels")) entry.kernels = top.text("kernels");
  return entry;
}

// The file's text, held to the reader's rules: a NaN time (nlohmann writes null) or a string that is not
// UTF-8 would make a file that every later read rejects, so the caller hears of it now instead.
std::string entry_file_text(const TuningEntry& entry) {
  const json object = entry_to_json(entry);
  try {
    entry_from_json(object);
    return object.dump(2) + "\n";
  } catch (const std::exception& e) {  // InvalidArgument from the reader, json::type_error from dump
    throw InvalidArgument(fmt::format("tuning entry for {} '{}' ({}) cannot be stored: {}", entry.key.op,
                                      entry.key.spec_key, entry.key.bucket, e.what()));
  }
}

// ---- reading an entry file ------------------------------------------------------------------------

struct FileContents {
  enum class Status { ok, missing, unreadable } status = Status::missing;
  std::string bytes;
  std::string problem;  // with unreadable
  dev_t device = 0;     // with ok: which file was read, to remove that one only
  ino_t inode = 0;
};

// Reads the whole file at once: once open, its bytes stay readable even if another process replaces it.
FileContents read_whole_file(const fs::path& path) {
  FileContents out;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    // ENOTDIR: a folder on the way is a file, so the entry is not there either.
    if (errno == ENOENT || errno == ENOTDIR) return out;
    out.status = FileContents::Status::unreadable;
    out.problem = fmt::format("cannot open it: {}", std::strerror(errno));
    return out;
  }
  out.status = FileContents::Status::ok;
  struct stat st {};
  if (::fstat(fd, &st) == 0) {
    out.device = st.st_dev;
    out.inode = st.st_ino;
  } else {
    out.status = FileContents::Status::unreadable;
    out.problem = fmt::format("cannot stat it: {}", std::strerror(errno));
  }
  char buffer[16 * 1024];
  while (out.status == FileContents::Status::ok) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n == 0) break;
    if (n > 0) {
      out.bytes.append(buffer, static_cast<std::size_t>(n));
    } else if (errno != EINTR) {
      out.status = FileContents::Status::unreadable;
      out.problem = fmt::format("cannot read it: {}", std::strerror(errno));
    }
  }
  ::close(fd);  // read-only: closing cannot lose data, so its result tells nothing
  return out;
}

// Empty when `bytes` hold a whole entry that belongs at `path`; otherwise what is wrong with them. The key
// inside must lead to `path` (a file copied from another name could never be found) and, when given, be
// `expected` (two keys whose digests collide).
std::string entry_problem(const std::string& bytes, const fs::path& path, const TuningKey* expected,
                          TuningEntry* entry) {
  try {
    *entry = entry_from_json(json::parse(bytes));
  } catch (const json::exception& e) {  // parse_error, or out_of_range for a number like 1e400
    return fmt::format("not valid JSON ({})", e.what());
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  if ((expected != nullptr && entry->key != *expected) || entry_place(entry->key) != place_of_file(path))
    return fmt::format("it holds the entry of another key ({} '{}', {}, on {})", entry->key.op, entry->key.spec_key,
                       entry->key.bucket, device_slug(entry->key.device));
  return {};
}

// Removes the bad file we read, but not a good one that a store has renamed over it since.
std::string remove_bad_file(const fs::path& path, const FileContents& read) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || st.st_dev != read.device || st.st_ino != read.inode)
    return "already replaced or removed";
  if (::unlink(path.c_str()) != 0 && errno != ENOENT)
    return fmt::format("left in place (cannot remove it: {})", std::strerror(errno));
  return "removed";
}

// The entry at `path` if it is whole and belongs there (see entry_problem). A bad file is reported and
// removed, an unreadable one reported, and both count as a miss: the tuner measures again.
std::optional<TuningEntry> read_entry(const fs::path& path, const TuningKey* expected) {
  const FileContents file = read_whole_file(path);
  if (file.status == FileContents::Status::missing) return std::nullopt;
  if (file.status == FileContents::Status::unreadable) {
    warn_once(path.string(), fmt::format("{}: {}; treated as a miss", path.string(), file.problem));
    return std::nullopt;
  }
  TuningEntry entry;
  const std::string problem = entry_problem(file.bytes, path, expected, &entry);
  if (problem.empty()) return entry;
  warn_once(path.string(), fmt::format("{}: {}; treated as a miss, {}", path.string(), problem,
                                       remove_bad_file(path, file)));
  return std::nullopt;
}

// ---- publishing an entry file ---------------------------------------------------------------------

// The folders (make_private_folder) and the file (0600) are owner-only: what runs on which machine is
// nobody else's business. The file is synced before the rename: a result took minutes of measuring and a
// store is rare, so a power cut should leave the old entry or the new one, not an empty file.
void publish_file(const fs::path& target, const std::string& text) {
  cache::make_private_folder(target.parent_path());
  cache::TemporaryFile temporary(target, 0600);
  temporary.write(text);
  temporary.sync();
  temporary.publish();
}

// What a failed publish_file reports: the folder, or the entry file (not its temporary name, so that one
// read-only folder is one warning), with the OS error.
std::string failure_text(const cache::FileError& e) {
  using Step = cache::FileError::Step;
  auto text = [&](const char* what, const fs::path& path) {
    return fmt::format("cannot {} {}: {}", what, path.string(), std::strerror(e.error()));
  };
  switch (e.step()) {
    case Step::create_folder: return text("create folder", e.path());
    case Step::create: return text("create a file in", e.target().parent_path());
    case Step::write: return text("write", e.target());
    case Step::rename: return text("rename into place", e.target());
  }
  return e.what();
}

// ---- listing --------------------------------------------------------------------------------------

// Entry files under <root>/v1/<device slug>/. A folder that cannot be read is reported and skipped.
std::vector<fs::path> entry_files(const fs::path& root) {
  std::vector<fs::path> files;
  const fs::path layout = root / "v1";
  std::error_code ec;
  if (!fs::is_directory(layout, ec)) return files;
  auto report = [](const fs::path& folder, const std::error_code& error) {
    warn_once(folder.string(), fmt::format("cannot list {}: {}; its entries are skipped", folder.string(),
                                           error.message()));
  };
  for (fs::directory_iterator device(layout, ec), end; !ec && device != end; device.increment(ec)) {
    std::error_code vanished;  // removed since it was listed: nothing to read there
    if (!device->is_directory(vanished)) continue;
    std::error_code inner;
    for (fs::directory_iterator file(device->path(), inner); !inner && file != end; file.increment(inner))
      if (is_entry_file_name(file->path().filename().string())) files.push_back(file->path());
    if (inner) report(device->path(), inner);
  }
  if (ec) report(layout, ec);
  return files;
}

// Buckets compare by length first: "rows<=64" before "rows<=1024", as the numbers do.
bool listed_before(const TuningEntry& a, const TuningEntry& b) {
  using Order = std::tuple<const std::string&, int, int, int, const std::string&, const std::string&, std::size_t,
                           const std::string&>;
  auto order = [](const TuningKey& k) {
    return Order(k.device.name, k.device.cc_major, k.device.cc_minor, k.device.multiprocessors, k.op, k.spec_key,
                 k.bucket.size(), k.bucket);
  };
  return order(a.key) < order(b.key);
}

// ---- importing ------------------------------------------------------------------------------------

json parse_document(const std::string& document) {
  try {
    return json::parse(document);
  } catch (const json::exception& e) {  // parse_error, or out_of_range for a number like 1e400
    throw InvalidArgument(fmt::format("tuning import: the document is not valid JSON ({})", e.what()));
  }
}

void check_header(const json& doc) {
  if (!doc.is_object())
    throw InvalidArgument(fmt::format("tuning import: the document must be a JSON object, not {}", doc.type_name()));
  const auto format = doc.find("format");
  if (format == doc.end() || !format->is_string() || format->get<std::string>() != kFormat)
    throw InvalidArgument(fmt::format("tuning import: format is {}, expected \"{}\"",
                                      format == doc.end() ? "missing" : format->dump(), kFormat));
  const auto version = doc.find("version");
  if (version == doc.end() || !version->is_number_integer() || version->get<std::int64_t>() != kVersion)
    throw InvalidArgument(fmt::format("tuning import: version is {}, this library reads version {}",
                                      version == doc.end() ? "missing" : version->dump(), kVersion));
  const auto entries = doc.find("entries");
  if (entries == doc.end() || !entries->is_array())
    throw InvalidArgument(fmt::format("tuning import: 'entries' is {}, expected an array",
                                      entries == doc.end() ? "missing" : entries->type_name()));
}

// Everything is checked before anything is stored, so a bad document leaves the database as it was.
std::vector<TuningEntry> entries_of_document(const std::string& document) {
  const json doc = parse_document(document);
  check_header(doc);
  std::vector<TuningEntry> entries;
  const json& array = doc.at("entries");
  for (std::size_t index = 0; index < array.size(); ++index) {
    try {
      entries.push_back(entry_from_json(array[index]));
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(fmt::format("tuning import: entry {}: {}", index, e.what()));
    }
  }
  return entries;
}

std::optional<std::string> environment_value(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;  // empty counts as unset
  return std::string(value);
}

}  // namespace

// ---- free functions -------------------------------------------------------------------------------

// Each subject (a bad file, an unwritable folder) is reported once per process: a long tuning job that
// meets it again stays quiet.
void warn_once(const std::string& subject, const std::string& message) {
  static std::mutex mutex;
  static std::set<std::string> warned;
  std::lock_guard lock(mutex);
  if (warned.insert(subject).second) fmt::print(stderr, "sparsejit: warning: tuning database: {}\n", message);
}

std::string shape_bucket(std::int64_t rows) {
  if (rows < 1) throw InvalidArgument(fmt::format("shape_bucket: rows = {} must be at least 1", rows));
  // Every int64 >= 1 has a power of two >= it within uint64 (at most 2^63).
  return fmt::format("rows<={}", std::bit_ceil(static_cast<std::uint64_t>(rows)));
}

fs::path default_tuning_dir() {
  if (const auto dir = environment_value("SJIT_TUNE_DIR")) return fs::absolute(*dir);
  // The XDG base directory spec says to ignore a relative XDG_DATA_HOME.
  if (const auto xdg = environment_value("XDG_DATA_HOME"); xdg && fs::path(*xdg).is_absolute())
    return fs::path(*xdg) / "sparsejit" / "tuning";
  if (const auto home = environment_value("HOME")) return fs::path(*home) / ".local" / "share" / "sparsejit" / "tuning";
  throw InvalidArgument("no folder for the tuning database: SJIT_TUNE_DIR, XDG_DATA_HOME and HOME are all unset; "
                        "set SJIT_TUNE_DIR to a folder");
}

Policy parse_policy(const std::string& text) {
  if (text == "off") return Policy::off;
  if (text == "on") return Policy::on;
  if (text == "force") return Policy::force;
  throw InvalidArgument(fmt::format("SJIT_AUTOTUNE = '{}' is not a policy: use off, on or force", text));
}

Policy policy_from_environment() {
  const auto value = environment_value("SJIT_AUTOTUNE");
  return value ? parse_policy(*value) : Policy::off;
}

std::string to_string(Policy policy) {
  switch (policy) {
    case Policy::off: return "off";
    case Policy::on: return "on";
    case Policy::force: return "force";
  }
  return "unknown";
}

// ---- the database ---------------------------------------------------------------------------------

TuningDb::TuningDb(fs::path root) : root_(std::move(root)) {}

std::optional<TuningEntry> TuningDb::find(const TuningKey& key) const {
  return read_entry(entry_path(root_, key), &key);
}

bool TuningDb::store(const TuningEntry& entry) {
  const std::string text = entry_file_text(entry);
  const fs::path target = entry_path(root_, entry.key);
  try {
    publish_file(target, text);
    return true;
  } catch (const cache::FileError& e) {
    // The failure names the folder or file and the OS error; a tuner storing many results into the same
    // read-only folder says so once.
    const std::string failure = failure_text(e);
    warn_once(failure, fmt::format("{}; tuning results are not kept", failure));
    return false;
  }
}

std::vector<TuningEntry> TuningDb::list() const {
  std::vector<TuningEntry> entries;
  for (const fs::path& file : entry_files(root_))
    if (auto entry = read_entry(file, nullptr)) entries.push_back(std::move(*entry));
  std::sort(entries.begin(), entries.end(), listed_before);
  return entries;
}

std::string TuningDb::export_json() const {
  json entries = json::array();
  for (const TuningEntry& entry : list()) entries.push_back(entry_to_json(entry));
  const json doc = {{"format", kFormat}, {"version", kVersion}, {"entries", std::move(entries)}};
  return doc.dump(2) + "\n";
}

int TuningDb::import_json(const std::string& document) {
  int stored = 0;
  for (const TuningEntry& entry : entries_of_document(document))
    if (store(entry)) ++stored;
  return stored;
}

}  // namespace sjit::tune

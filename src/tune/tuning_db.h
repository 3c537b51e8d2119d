// The tuning database: the best launch configuration found for (device model, op, spec, shape
// bucket), kept apart from the kernel cache because it is a measurement, not a build product.
//
// One entry is one JSON file <root>/v1/<device slug>/<digest>.json, published like kernel-cache
// entries (temporary file in the same folder, then rename), so any number of processes may write and
// read at once. A read-only folder is still readable. The whole database exports to one JSON file and
// imports from one, so a team can ship tuned results for a device model.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace sjit::tune {

struct DeviceModel {
  std::string name;        // "NVIDIA H100 80GB HBM3"
  int cc_major = 0, cc_minor = 0;
  int multiprocessors = 0;
  friend bool operator==(const DeviceModel&, const DeviceModel&) = default;
};

struct TuningKey {
  DeviceModel device;
  std::string op;          // "rownorm"
  std::string spec_key;    // the spec's canonical key text
  std::string bucket;      // shape bucket, e.g. "rows<=65536" (see shape_bucket)
  friend bool operator==(const TuningKey&, const TuningKey&) = default;
};

struct TuningEntry {
  TuningKey key;
  std::string winner_config;   // config key text, e.g. "tpr=4,vec=4,block=256,smem=0"
  double winner_us = 0;        // median time of the winner
  std::string default_config;
  double default_us = 0;       // median time of the heuristic default, same run
  int candidates = 0;          // how many were timed
  std::string measured_at;     // UTC, ISO 8601
  std::string library_version;
  // The kernels the times were measured with (tuning::current_kernels: the templates' hash and the
  // fingerprint of the sources that choose kernels, 16 hex digits; empty in entries written before it
  // was kept): lookups pass over an entry of other kernels, whose winner may no longer be the fastest
  // (tuning::current_entry).
  std::string kernels;
};

// Rows are bucketed by the next power of two: 1, 2, 4, ..., so one tuning serves every size that
// launches the same way. Returns e.g. "rows<=65536". rows must be >= 1.
std::string shape_bucket(std::int64_t rows);

// Prints "sparsejit: warning: tuning database: <message>" on stderr, once per process for each subject
// (a file, a folder, an entry): a long job that meets the same trouble again stays quiet.
void warn_once(const std::string& subject, const std::string& message);

// SJIT_TUNE_DIR, else $XDG_DATA_HOME/sparsejit/tuning, else ~/.local/share/sparsejit/tuning.
std::filesystem::path default_tuning_dir();

enum class Policy { off, on, force };
// SJIT_AUTOTUNE=off (default) | on | force; throws InvalidArgument naming the variable and value.
Policy policy_from_environment();
Policy parse_policy(const std::string& text);
std::string to_string(Policy policy);

class TuningDb {
 public:
  explicit TuningDb(std::filesystem::path root);
  const std::filesystem::path& root() const { return root_; }

  // nullopt on a miss; a corrupt or unreadable entry is reported once on stderr (with its path) and
  // treated as a miss (removed when the folder is writable).
  std::optional<TuningEntry> find(const TuningKey& key) const;

  // Publishes atomically, replacing an older entry for the same key. Returns false (with one warning
  // on stderr) if the folder cannot be written; never throws for I/O.
  bool store(const TuningEntry& entry);

  std::vector<TuningEntry> list() const;   // every readable entry, sorted by device, op, spec, bucket

  // One JSON document holding every entry ({"format": "sparsejit-tuning", "version": 1, "entries": [...]}).
  std::string export_json() const;
  // Stores every entry of a document made by export_json (replacing same keys); returns how many.
  // Throws InvalidArgument naming what is wrong for a malformed document (nothing is stored then).
  int import_json(const std::string& document);

 private:
  std::filesystem::path root_;
};

}  // namespace sjit::tune

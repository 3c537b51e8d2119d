#include "tune/tuned_configs.h"

#include <fmt/chrono.h>
#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>

#include <xxhash.h>

#include "codegen/embedded_templates.h"
#include "jit/jit.h"
#include "sparsejit/error.h"
#include "sparsejit/tune.h"
#include "tune/tuning_db.h"

namespace sjit {
namespace {

std::atomic<int> policy_override{-1};  // -1: read SJIT_AUTOTUNE

// Lookups and tunings already done in this process, by database key text.
struct Decisions {
  std::mutex mutex;
  std::map<std::string, std::optional<RowNormConfig>> by_key;
};
Decisions& decisions() {
  static Decisions* d = new Decisions;
  return *d;
}

}  // namespace

namespace tuning {

tune::TuningDb database() { return tune::TuningDb(tune::default_tuning_dir()); }

tune::DeviceModel model_of(const runtime::DeviceFacts& d) { return {d.name, d.cc_major, d.cc_minor, d.multiprocessors}; }

tune::TuningEntry measured_entry(const std::string& op, const std::string& spec_key, const std::string& bucket,
                                 const std::string& winner, double winner_us, const std::string& default_config,
                                 double default_us, int candidates) {
  tune::TuningEntry e;
  e.key = {model_of(*jit::current_target().device), op, spec_key, bucket};
  e.winner_config = winner;
  e.winner_us = winner_us;
  e.default_config = default_config;
  e.default_us = default_us;
  e.candidates = candidates;
  e.measured_at = fmt::format("{:%Y-%m-%dT%H:%M:%SZ}", fmt::gmtime(std::time(nullptr)));  // UTC, ISO 8601
  e.library_version = SJIT_VERSION;
  e.kernels = current_kernels();
  return e;
}

std::string current_kernels() {
  // The templates and the sources that choose and generate kernels from them (a default tiling, a
  // rule): either may change what a tuning measured.
  static const std::string kernels = [] {
    const std::string both = fmt::format("templates {:016x}\nchoices {}\n", codegen::templates_hash(),
                                         codegen::kernel_choices_fingerprint());
    return fmt::format("{:016x}", XXH3_64bits(both.data(), both.size()));
  }();
  return kernels;
}

std::optional<tune::TuningEntry> current_entry(const tune::TuningDb& db, const tune::TuningKey& key) {
  std::optional<tune::TuningEntry> entry = db.find(key);
  if (!entry || entry->kernels == current_kernels()) return entry;
  tune::warn_once(fmt::format("{}|{}|{}|{}|kernels {}", key.device.name, key.op, key.spec_key, key.bucket, entry->kernels),
                  fmt::format("the {} tuning of '{}' ({}, measured {}) was made with other kernels ({}; these are "
                              "{}): passed over; run `sjit tune` again for this device",
                              key.op, key.spec_key, key.bucket, entry->measured_at,
                              entry->kernels.empty() ? "not recorded" : entry->kernels, current_kernels()));
  return std::nullopt;
}

}  // namespace tuning

using tuning::database;
using tuning::model_of;

AutotunePolicy autotune_policy() {
  const int forced = policy_override.load();
  if (forced >= 0) return AutotunePolicy(forced);
  static const tune::Policy from_env = tune::policy_from_environment();
  return from_env == tune::Policy::off ? AutotunePolicy::off : from_env == tune::Policy::on ? AutotunePolicy::on : AutotunePolicy::force;
}

void set_autotune_policy(AutotunePolicy policy) { policy_override.store(int(policy)); }

std::string tuning_dir() { return database().root().string(); }

std::vector<TunedEntry> tuning_entries() {
  std::vector<TunedEntry> out;
  for (const tune::TuningEntry& e : database().list()) {
    const tune::DeviceModel& d = e.key.device;
    out.push_back({fmt::format("{} (sm_{}{}, {} SMs)", d.name, d.cc_major, d.cc_minor, d.multiprocessors), e.key.op,
                   e.key.spec_key, e.key.bucket, e.winner_config, e.default_config, e.measured_at, e.winner_us,
                   e.default_us, e.candidates, e.kernels == tuning::current_kernels()});
  }
  return out;
}

std::string export_tuning() { return database().export_json(); }
int import_tuning(const std::string& document) { return database().import_json(document); }

namespace tuning {

bool store_result(const RowNormSpec& pass_spec, const std::string& bucket, const RowNormConfig& winner,
                  double winner_us, const RowNormConfig& default_config, double default_us, int candidates) {
  const tune::TuningEntry e = measured_entry("rownorm", key(pass_spec), bucket, key(winner), winner_us,
                                             key(default_config), default_us, candidates);
  const bool stored = database().store(e);
  std::lock_guard lock(decisions().mutex);
  decisions().by_key[fmt::format("{}|{}|{}", e.key.device.name, e.key.spec_key, bucket)] = winner;
  return stored;
}

std::optional<RowNormConfig> tuned_config(const RowNormSpec& pass_spec, std::int64_t rows,
                                          const runtime::DeviceFacts& device, Stream stream) {
  const AutotunePolicy policy = autotune_policy();
  const std::string bucket = tune::shape_bucket(rows);
  const std::string memo_key = fmt::format("{}|{}|{}", device.name, key(pass_spec), bucket);
  Decisions& d = decisions();
  {
    std::lock_guard lock(d.mutex);
    if (auto it = d.by_key.find(memo_key); it != d.by_key.end()) return it->second;
  }
  std::optional<RowNormConfig> chosen;
  if (policy != AutotunePolicy::force)
    if (auto hit = current_entry(database(), {model_of(device), "rownorm", key(pass_spec), bucket}))
      chosen = parse_rownorm_config(hit->winner_config);
  if (!chosen && policy != AutotunePolicy::off) {
    if (stream_is_capturing(stream)) return std::nullopt;  // tune later, outside the capture
    TuneOptions options;
    options.rows = rows;
    chosen = tune_rownorm(pass_spec, options).winner;  // stores the result, which memoizes it too
  }
  std::lock_guard lock(d.mutex);
  return d.by_key.emplace(memo_key, chosen).first->second;
}

}  // namespace tuning
}  // namespace sjit

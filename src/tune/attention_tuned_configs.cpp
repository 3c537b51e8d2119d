#include "tune/attention_tuned_configs.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <map>
#include <mutex>

#include "jit/jit.h"
#include "sparsejit/error.h"
#include "sparsejit/tune.h"
#include "tune/tuned_configs.h"

namespace sjit::tuning {
namespace {

constexpr std::string_view kBucketPrefix = "sk<=";
constexpr int kLongestBucketLog2 = 31;  // seq_k is an int in the kernels' parameters

// The power of two of an attention bucket's text, or -1 for another text.
int bucket_log2(const std::string& bucket) {
  if (!bucket.starts_with(kBucketPrefix)) return -1;
  std::uint64_t keys = 0;
  const char* begin = bucket.data() + kBucketPrefix.size();
  const char* end = bucket.data() + bucket.size();
  const auto [stop, error] = std::from_chars(begin, end, keys);
  if (error != std::errc() || stop != end || !std::has_single_bit(keys)) return -1;
  return std::countr_zero(keys);
}

// Lookups done in this process, by database folder, device and spec: one Attention per layer, or the
// one-shot attention_forward() on every call, must not probe the folder each time.
struct Remembered {
  std::mutex mutex;
  std::map<std::string, std::optional<AttentionConfig>> by_key;
  std::map<std::string, std::optional<DqSummation>> dq_by_key;  // by remembered_key + "|" + bucket
  std::map<std::string, std::optional<TunedWalk>> walk_by_key;   // the same
  std::map<std::string, std::optional<std::string>> pick_by_key;  // the same
  std::optional<tune::DeviceModel> device_for_tests;
};
Remembered& remembered() {
  static Remembered* r = new Remembered;  // never destroyed: Attention objects may outlive static teardown
  return *r;
}

std::string remembered_key(const tune::TuningDb& db, const tune::DeviceModel& d, const AttentionSpec& spec) {
  return fmt::format("{}|{}|{}.{}|{}|{}", db.root().string(), d.name, d.cc_major, d.cc_minor, d.multiprocessors,
                     key(spec));
}

// The value remembered under `memo` in `by_key`, else compute()'s, remembered there (computed outside the
// lock: it reads the database folder).
template <class Value, class Compute>
std::optional<Value> remembered_lookup(std::map<std::string, std::optional<Value>>& by_key, const std::string& memo,
                                       Compute compute) {
  Remembered& r = remembered();
  {
    std::lock_guard lock(r.mutex);
    if (auto it = by_key.find(memo); it != by_key.end()) return it->second;
  }
  const std::optional<Value> value = compute();
  std::lock_guard lock(r.mutex);
  by_key[memo] = value;
  return value;
}

// The device the hook keys by: the test override, else the current device; nullopt without a GPU.
std::optional<tune::DeviceModel> hook_device() {
  {
    std::lock_guard lock(remembered().mutex);
    if (remembered().device_for_tests) return remembered().device_for_tests;
  }
  if (!gpu_available()) return std::nullopt;
  try {
    return model_of(*jit::current_target().device);
  } catch (const NoDevice&) {
    return std::nullopt;  // a driver but no usable device: the heuristic default, as everywhere
  }
}

// The stored winner as a config this library accepts for the spec, or nullopt (reported once).
std::optional<AttentionConfig> usable_config(const tune::TuningEntry& entry, const AttentionSpec& spec) {
  try {
    const AttentionConfig stored = parse_attention_config(entry.winner_config);
    return resolve(spec, stored);
  } catch (const Error& e) {
    tune::warn_once(entry.key.spec_key + "|" + entry.key.bucket + "|" + entry.winner_config,
                    fmt::format("the stored winner '{}' for {} ({}) is not a tiling this library accepts ({}); "
                                "the heuristic default is used: tune again",
                                entry.winner_config, entry.key.spec_key, entry.key.bucket, e.what()));
    return std::nullopt;
  }
}

// The choice stored under (op, the current device, spec, bucket) where the autotune policy is on or
// force, parsed by `parse` (nullopt: not a choice this library writes, reported once with `accepted`,
// what it writes); remembered in `by_key`. nullopt with the policy off, without a device, or where
// nothing is stored.
template <class Value, class Parse>
std::optional<Value> stored_choice(std::map<std::string, std::optional<Value>> Remembered::*by_key,
                                   const std::string& op, const AttentionSpec& spec, const std::string& bucket,
                                   Parse parse, std::string_view accepted) {
  if (autotune_policy() == AutotunePolicy::off) return std::nullopt;  // opted into, as tilings are
  const std::optional<tune::DeviceModel> device = hook_device();
  if (!device) return std::nullopt;
  const tune::TuningDb db = database();
  const std::string memo = remembered_key(db, *device, spec) + "|" + bucket;
  return remembered_lookup(remembered().*by_key, memo, [&]() -> std::optional<Value> {
    const auto entry = current_entry(db, {*device, op, key(spec), bucket});
    if (!entry) return std::nullopt;
    if (std::optional<Value> value = parse(entry->winner_config)) return value;
    tune::warn_once(memo, fmt::format("the stored {} '{}' for {} ({}) is not {}; the library chooses by its rules: "
                                      "tune again",
                                      op, entry->winner_config, key(spec), bucket, accepted));
    return std::nullopt;
  });
}

// Writes a choice measured now under (op, the current device, spec, bucket), and forgets what
// `by_key` remembered of it; false if the folder cannot be written.
template <class Value>
bool store_choice(std::map<std::string, std::optional<Value>> Remembered::*by_key, const std::string& op,
                  const AttentionSpec& spec, const std::string& bucket, const std::string& winner, double winner_us,
                  const std::string& chosen_before, double chosen_before_us, int candidates) {
  tune::TuningDb db = database();
  const tune::TuningEntry e =
      measured_entry(op, key(spec), bucket, winner, winner_us, chosen_before, chosen_before_us, candidates);
  const bool stored = db.store(e);
  std::lock_guard lock(remembered().mutex);
  (remembered().*by_key).erase(remembered_key(db, e.key.device, spec) + "|" + bucket);
  return stored;
}

}  // namespace

std::string attention_bucket(std::int64_t seq_k) {
  if (seq_k < 1) throw InvalidArgument(fmt::format("attention_bucket: seq_k = {} must be at least 1", seq_k));
  return fmt::format("{}{}", kBucketPrefix, std::bit_ceil(static_cast<std::uint64_t>(seq_k)));
}

std::optional<std::string> best_attention_bucket(const std::vector<std::string>& buckets, std::int64_t seq_k) {
  const int wanted = seq_k > 0 ? bucket_log2(attention_bucket(seq_k)) : kLongestBucketLog2 + 1;
  std::optional<std::string> best;
  int best_log2 = -1;
  for (const std::string& bucket : buckets) {
    const int log2 = bucket_log2(bucket);
    if (log2 < 0) continue;
    const int distance = std::abs(log2 - wanted), best_distance = std::abs(best_log2 - wanted);
    if (!best || distance < best_distance || (distance == best_distance && log2 > best_log2)) {
      best = bucket;
      best_log2 = log2;
    }
  }
  return best;
}

std::optional<AttentionConfig> stored_attention_config(const tune::TuningDb& db, const tune::DeviceModel& device,
                                                       const AttentionSpec& spec, std::int64_t seq_k) {
  // Every bucket an int key length can have: 32 file probes, answered from the directory cache.
  std::map<std::string, tune::TuningEntry> stored;
  for (int log2 = 0; log2 <= kLongestBucketLog2; ++log2) {
    const std::string bucket = attention_bucket(std::int64_t(1) << log2);
    if (auto entry = current_entry(db, {device, "attention", key(spec), bucket})) stored.emplace(bucket, std::move(*entry));
  }
  // Best bucket first; one whose winner is no longer usable gives way to the next best.
  while (!stored.empty()) {
    std::vector<std::string> buckets;
    for (const auto& [bucket, entry] : stored) buckets.push_back(bucket);
    const std::string best = *best_attention_bucket(buckets, seq_k);
    if (auto config = usable_config(stored.at(best), spec)) return config;
    stored.erase(best);
  }
  return std::nullopt;
}

AttentionConfig attention_config_for(const AttentionSpec& spec, const AttentionConfig& config) {
  // An explicit config always wins; with the policy off the database is not consulted (a stored winner
  // was measured at one shape and is chosen here without knowing the shape, so using it is opted into).
  if (config != AttentionConfig{} || autotune_policy() == AutotunePolicy::off) return config;
  const std::optional<tune::DeviceModel> device = hook_device();
  if (!device) return config;
  const tune::TuningDb db = database();
  return remembered_lookup(remembered().by_key, remembered_key(db, *device, spec), [&] {
           return stored_attention_config(db, *device, spec);
         }).value_or(config);
}

bool store_attention_result(const AttentionSpec& spec, const std::string& bucket, const AttentionConfig& winner,
                            double winner_us, const AttentionConfig& default_config, double default_us,
                            int candidates) {
  tune::TuningDb db = database();
  const tune::TuningEntry e = measured_entry("attention", key(spec), bucket, key(winner), winner_us,
                                             key(default_config), default_us, candidates);
  const bool stored = db.store(e);
  std::lock_guard lock(remembered().mutex);
  remembered().by_key.erase(remembered_key(db, e.key.device, spec));  // the next Attention looks again
  return stored;
}

std::string dq_bucket(std::int64_t group, double key_tiles_per_row, DqBucketKind kind) {
  if (group < 1 || !(key_tiles_per_row >= 0) || key_tiles_per_row > double(std::int64_t(1) << 40))
    throw InvalidArgument(fmt::format("dq_bucket: group = {} must be at least 1 and key_tiles_per_row = {} in "
                                      "[0, 2^40]", group, key_tiles_per_row));
  if (kind.gathered && kind.narrow_queries)
    throw InvalidArgument("dq_bucket: a pattern runs the gathered backward or the 64-query tiles, not both");
  if (kind.gathered && kind.banded)
    throw InvalidArgument("dq_bucket: the gathered backward's walks are not counted as a band");
  const auto tiles = static_cast<std::uint64_t>(std::ceil(key_tiles_per_row));
  return fmt::format("group={},tiles<={}{}{}{}", group, std::bit_ceil(std::max<std::uint64_t>(tiles, 1)),
                     kind.gathered ? ",walk=gathered" : kind.narrow_queries ? ",walk=narrow" : "",
                     kind.banded ? ",banded" : "", kind.beyond_l2 ? ",beyond_l2" : "");
}

std::optional<DqSummation> tuned_dq_summation(const AttentionSpec& spec, std::int64_t group, double key_tiles_per_row,
                                              DqBucketKind kind) {
  return stored_choice(
      &Remembered::dq_by_key, "attention_dq", spec, dq_bucket(group, key_tiles_per_row, kind),
      [](const std::string& text) -> std::optional<DqSummation> {
        if (text == name(DqSummation::atomic)) return DqSummation::atomic;
        if (text == name(DqSummation::pass)) return DqSummation::pass;
        return std::nullopt;
      },
      "atomic or pass");
}

bool store_dq_result(const AttentionSpec& spec, const std::string& bucket, DqSummation winner, double winner_us,
                     DqSummation chosen_before, double chosen_before_us) {
  return store_choice(&Remembered::dq_by_key, "attention_dq", spec, bucket, std::string(name(winner)), winner_us,
                      std::string(name(chosen_before)), chosen_before_us, 2);
}

std::string walk_choice_text(const TunedWalk& c) {
  return fmt::format("walk={},query_tiles={},dq={}", name(c.walk), c.query_tile_cols, name(c.dq));
}

std::optional<TunedWalk> parse_walk_choice(std::string_view text) {
  // Exactly the three fields, in walk_choice_text's order, with values it writes.
  for (const BackwardWalk walk : {BackwardWalk::tiles, BackwardWalk::packed, BackwardWalk::gathered})
    for (const int cols : {0, 64, 128})
      for (const DqSummation dq : {DqSummation::atomic, DqSummation::pass}) {
        const TunedWalk choice{walk, cols, dq};
        if (text == walk_choice_text(choice) && (cols == 0) == (walk == BackwardWalk::gathered)) return choice;
      }
  return std::nullopt;
}

std::string walk_bucket(std::uint64_t pattern_digest, std::int64_t group) {
  if (group < 1) throw InvalidArgument(fmt::format("walk_bucket: group = {} must be at least 1", group));
  return fmt::format("pattern={:016x},group={}", pattern_digest, group);
}

std::optional<TunedWalk> tuned_backward_walk(const AttentionSpec& spec, std::uint64_t pattern_digest,
                                             std::int64_t group) {
  return stored_choice(&Remembered::walk_by_key, "attention_walk", spec, walk_bucket(pattern_digest, group),
                       parse_walk_choice, "walk=tiles|packed|gathered,query_tiles=0|64|128,dq=atomic|pass");
}

bool store_walk_result(const AttentionSpec& spec, const std::string& bucket, const TunedWalk& winner, double winner_us,
                       const TunedWalk& chosen_before, double chosen_before_us, int candidates) {
  return store_choice(&Remembered::walk_by_key, "attention_walk", spec, bucket, walk_choice_text(winner), winner_us,
                      walk_choice_text(chosen_before), chosen_before_us, candidates);
}

bool is_forward_pick(std::string_view pick) {
  return pick == "narrow" || pick == "wide" || pick == "gathered_heads=1" || pick == "gathered_heads=2" ||
         pick == "gathered_heads=4";
}

std::string forward_pick_bucket(std::uint64_t pattern_digest, int heads) {
  if (heads != 1 && heads != 2 && heads != 4)
    throw InvalidArgument(fmt::format("forward_pick_bucket: heads = {} must be 1, 2 or 4", heads));
  return fmt::format("pattern={:016x},heads={}", pattern_digest, heads);
}

std::optional<std::string> tuned_forward_pick(const AttentionSpec& spec, std::uint64_t pattern_digest, int heads) {
  return stored_choice(
      &Remembered::pick_by_key, "attention_pattern", spec, forward_pick_bucket(pattern_digest, heads),
      [](const std::string& text) { return is_forward_pick(text) ? std::optional<std::string>(text) : std::nullopt; },
      "narrow, wide or gathered_heads=1|2|4");
}

bool store_forward_pick(const AttentionSpec& spec, const std::string& bucket, const std::string& pick, double pick_us,
                        const std::string& chosen_before, double chosen_before_us, int candidates) {
  return store_choice(&Remembered::pick_by_key, "attention_pattern", spec, bucket, pick, pick_us, chosen_before,
                      chosen_before_us, candidates);
}

void set_attention_device_for_tests(std::optional<tune::DeviceModel> device) {
  std::lock_guard lock(remembered().mutex);
  remembered().device_for_tests = std::move(device);
  remembered().by_key.clear();
  remembered().dq_by_key.clear();
  remembered().walk_by_key.clear();
  remembered().pick_by_key.clear();
}

}  // namespace sjit::tuning

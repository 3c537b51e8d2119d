// Where an Attention meets the tuning database: the tiling a default-configured Attention uses, the
// shape buckets of attention results, and storing a tuning's winner (docs/tuning.md, "Attention").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sparsejit/attention.h"
#include "tune/tuning_db.h"

namespace sjit::tuning {

// Attention results are stored per key length rounded up to a power of two: "sk<=8192". The key length
// sets the trip count of every CTA's loop; batch, heads and query length only add CTAs. seq_k >= 1.
std::string attention_bucket(std::int64_t seq_k);

// The stored bucket that serves a problem best, or nullopt when `buckets` holds none (texts that are not
// attention buckets are skipped). With seq_k > 0: its own bucket, else the nearest one by powers of two,
// a tie going to the longer keys. With seq_k == 0 (an Attention is built before any shape is known): the
// longest keys, where a forward spends the most time.
std::optional<std::string> best_attention_bucket(const std::vector<std::string>& buckets, std::int64_t seq_k = 0);

// The stored winner for (device, spec) in `db` whose bucket best_attention_bucket picks; nullopt if none
// is stored or usable. A winner the library no longer accepts (its text does not parse, resolve() refuses
// it) is reported once on stderr and skipped.
std::optional<AttentionConfig> stored_attention_config(const tune::TuningDb& db, const tune::DeviceModel& device,
                                                       const AttentionSpec& canonical_spec, std::int64_t seq_k = 0);

// The constructors' hook: the config an Attention resolves. That is `config` itself, except that an
// all-unset config becomes the stored winner for this device and spec (the bucket picked with seq_k 0
// above) when the autotune policy is on or force. Never tunes; touches neither the database nor the GPU
// when the policy is off or the config is explicit. The lookup is done once per process for each
// (database folder, device, spec); a tuning in this process renews it.
AttentionConfig attention_config_for(const AttentionSpec& canonical_spec, const AttentionConfig& config);

// Writes an attention tuning's winner for the current device; false if the folder cannot be written.
bool store_attention_result(const AttentionSpec& canonical_spec, const std::string& bucket,
                            const AttentionConfig& winner, double winner_us, const AttentionConfig& default_config,
                            double default_us, int candidates);

// ---- how the backward sums dQ (op "attention_dq") ----

// dQ results are stored per GQA group (query heads a K/V head) and mean active key tiles a query row
// rounded up to a power of two: "group=1,tiles<=8". Both decide which way wins (the accumulator's
// costs grow with the rows, the dQ pass's second products with the tiles). A problem whose pattern
// runs the gathered backward (pattern blocks of 16 and 32, docs/attention.md) has buckets of its own,
// ",walk=gathered" added: its kernels, and so which way wins, are not the 128-key passes'. So does one
// whose accumulator spills out of the L2 (attention::accumulator_spills: long sequences, wide groups),
// ",beyond_l2" added: there the adds cost DRAM traffic, and the pass wins far more often. And so does
// one whose pattern runs d = 64's 64-query dK/dV tiles (`narrow_queries`: blocks of 16 or 32 on short
// walks, attention/packed_queries.h), ",walk=narrow": on them the pass wins at counts where atomic dQ
// wins on the 128-query tiles. And one whose dK/dV walks make a band (`banded`: a sliding window,
// attention::contiguous_walks), ",banded": its adds stay in the L2, and atomic dQ wins at counts where
// the pass wins for random blocks. (Tiles a row are counted as the rule counts them: contiguous.)
struct DqBucketKind {
  bool gathered = false;        // ",walk=gathered"
  bool beyond_l2 = false;       // ",beyond_l2"
  bool narrow_queries = false;  // ",walk=narrow"
  bool banded = false;          // ",banded"
};
std::string dq_bucket(std::int64_t group, double key_tiles_per_row, DqBucketKind kind = {});

// The way tune_dq_summation stored for the current device, the backward spec (canonical, pass=bwd)
// and the problem's bucket, where the autotune policy is on or force; nullopt when it is off, without
// a device, when nothing is stored for that very bucket, or when the stored text is not a way (reported
// once). Looked up once per process for each (database folder, device, spec, bucket).
std::optional<DqSummation> tuned_dq_summation(const AttentionSpec& backward_spec, std::int64_t group,
                                              double key_tiles_per_row, DqBucketKind kind = {});

// Writes a dQ tuning's winner for the current device; false if the folder cannot be written.
bool store_dq_result(const AttentionSpec& backward_spec, const std::string& bucket, DqSummation winner,
                     double winner_us, DqSummation chosen_before, double chosen_before_us);

// ---- how the backward walks one pattern (op "attention_walk") ----

// A backward's choices for one pattern that tune_backward_walk times together: the dK/dV pass's walk,
// the queries of its tiles (0 for the gathered walk, which has none to choose) and how dQ is summed.
struct TunedWalk {
  BackwardWalk walk = BackwardWalk::tiles;
  int query_tile_cols = 0;
  DqSummation dq = DqSummation::atomic;
  friend bool operator==(const TunedWalk&, const TunedWalk&) = default;
};
// As stored: "walk=packed,query_tiles=128,dq=atomic".
std::string walk_choice_text(const TunedWalk& choice);
// The choice of such a text, or nullopt for any other text (a field missing, unknown or out of place).
std::optional<TunedWalk> parse_walk_choice(std::string_view text);

// Walk results are stored per pattern (its digest: the walk that wins depends on where its blocks lie,
// not only on how many there are) and GQA group: "pattern=00c0ffee00c0ffee,group=1".
std::string walk_bucket(std::uint64_t pattern_digest, std::int64_t group);

// The choice tune_backward_walk stored for the current device, the backward spec (canonical, pass=bwd),
// the pattern and the group, where the autotune policy is on or force; nullopt when it is off, without
// a device, when nothing is stored for them, or when the stored text is not a choice (reported once).
// Looked up once per process for each (database folder, device, spec, bucket).
std::optional<TunedWalk> tuned_backward_walk(const AttentionSpec& backward_spec, std::uint64_t pattern_digest,
                                             std::int64_t group);

// Writes a walk tuning's winner for the current device; false if the folder cannot be written.
bool store_walk_result(const AttentionSpec& backward_spec, const std::string& bucket, const TunedWalk& winner,
                       double winner_us, const TunedWalk& chosen_before, double chosen_before_us, int candidates);

// ---- the forward's tiling picked for one pattern (op "attention_pattern") ----

// Where an untuned Attention picks its forward's tiling per pattern (pattern blocks of 16 or 32 on
// Hopper), the picks a tuning may store for one pattern: "narrow" (the spec's tiling), "wide", and
// "gathered_heads=1", "=2" or "=4" (the gathered-key kernel with that many query heads a CTA).
bool is_forward_pick(std::string_view pick);
// Stored per pattern and the query heads a CTA of the gathered kernel could take for the call
// (attention::gathered_heads: 1, 2 or 4): "pattern=00c0ffee00c0ffee,heads=2".
std::string forward_pick_bucket(std::uint64_t pattern_digest, int heads);
// The pick tune_attention stored for the current device, the spec (canonical, pass=fwd), the pattern
// and the heads, where the autotune policy is on or force; nullopt as tuned_backward_walk's.
std::optional<std::string> tuned_forward_pick(const AttentionSpec& spec, std::uint64_t pattern_digest, int heads);
bool store_forward_pick(const AttentionSpec& spec, const std::string& bucket, const std::string& pick,
                        double pick_us, const std::string& chosen_before, double chosen_before_us, int candidates);

// Tests on a machine without a GPU: the device model the hook keys by instead of the current device's
// (nullopt restores the device's). Clears the lookups remembered so far.
void set_attention_device_for_tests(std::optional<tune::DeviceModel> device);

}  // namespace sjit::tuning

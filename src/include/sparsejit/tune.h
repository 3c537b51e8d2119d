// Autotuning: time every layout of a kernel on this device, keep the fastest whose output matches
// the heuristic default's, remember it per device model in the tuning database (docs/tuning.md).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "sparsejit/rownorm.h"

namespace sjit {

enum class AutotunePolicy { off, on, force };
// SJIT_AUTOTUNE: off (default: heuristic default or a database hit), on (tune a missing entry on
// first use, once per process), force (tune again, once per process). Never while a stream captures.
AutotunePolicy autotune_policy();
void set_autotune_policy(AutotunePolicy policy);

struct TuneCandidate {
  RowNormConfig config;
  double median_us = 0;     // 0 when rejected
  double gb_per_s = 0;
  std::string rejected;     // why it was not eligible ("" when it was): compile, launch or wrong output
};

struct TuneReport {
  RowNormSpec spec;         // with its pass
  std::int64_t rows = 0;
  std::string bucket;       // the shape bucket the result is stored under
  std::string device;
  RowNormConfig default_config, winner;
  double default_us = 0, winner_us = 0;
  std::vector<TuneCandidate> candidates;  // every candidate, the default included
  bool stored = false;      // written to the tuning database
};

struct TuneOptions {
  std::int64_t rows = 0;    // problem size timed (0: enough rows for 16M elements, at least 1)
  double budget_s = 60;     // stop timing new candidates after this long (the default is always timed)
  int warmup = 5, iterations = 30;
  bool store = true;        // write the winner to the tuning database
  // Called after each candidate: (done, total, what was just timed).
  std::function<void(int, int, const std::string&)> progress;
  // Extra layouts to try besides the op's own space (tests use this for a deliberately wrong one).
  std::vector<RowNormConfig> extra_candidates;
};

// The layouts the tuner tries for a spec: every valid mix of threads per row, access width, block
// size and row storage. The heuristic default is always among them.
std::vector<RowNormConfig> rownorm_candidates(const RowNormSpec& spec);

// Tunes one spec (its pass decides forward or backward) on the current device. Needs a GPU.
TuneReport tune_rownorm(const RowNormSpec& spec, const TuneOptions& options = {});

struct TunedEntry {
  std::string device, op, spec_key, bucket, winner_config, default_config, measured_at;
  double winner_us = 0, default_us = 0;
  int candidates = 0;
};
std::vector<TunedEntry> tuning_entries();
std::string tuning_dir();
std::string export_tuning();                     // one JSON document with every entry
int import_tuning(const std::string& document);  // entries stored

}  // namespace sjit

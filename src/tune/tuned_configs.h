// Where launches meet the tuning database: the layout a default-configured launch uses.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "runtime/context.h"
#include "sparsejit/rownorm.h"
#include "tune/tuning_db.h"

namespace sjit::tuning {

// The database in the folder the environment names now (SJIT_TUNE_DIR, ...; see default_tuning_dir):
// read on every call, so that a program (or a test) that changes SJIT_TUNE_DIR uses the new folder.
tune::TuningDb database();
tune::DeviceModel model_of(const runtime::DeviceFacts& device);

// A result measured now on the current device, as the database stores it (config texts are key(config)).
tune::TuningEntry measured_entry(const std::string& op, const std::string& spec_key, const std::string& bucket,
                                 const std::string& winner, double winner_us, const std::string& default_config,
                                 double default_us, int candidates);

// This build's kernels as a tuning entry names them (TuningEntry::kernels): 16 hex digits of XXH3-64 over
// the templates' hash and the fingerprint of the sources that choose and generate kernels.
std::string current_kernels();

// The entry for `key` if it was measured with this build's kernels. One measured with other kernels (an
// earlier or later sparsejit, or an import from one) is passed over, with a warning once per process
// that says to tune again: its winner may no longer be the fastest.
std::optional<tune::TuningEntry> current_entry(const tune::TuningDb& db, const tune::TuningKey& key);

// For a launch that left its layout to sparsejit: the tuned layout for (device model, spec, bucket
// of rows) from the database, or one tuned now (policy on: if missing; force: again), or nullopt for
// the heuristic default. Each key is looked up (and tuned) at most once per process. Never tunes
// while `stream` is capturing a graph.
std::optional<RowNormConfig> tuned_config(const RowNormSpec& pass_spec, std::int64_t rows,
                                          const runtime::DeviceFacts& device, Stream stream);

// Writes a tuning result for the current device; false if the database folder cannot be written.
bool store_result(const RowNormSpec& pass_spec, const std::string& bucket, const RowNormConfig& winner,
                  double winner_us, const RowNormConfig& default_config, double default_us, int candidates);

}  // namespace sjit::tuning

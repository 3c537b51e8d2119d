// Autotuning: time every layout of a kernel on this device, keep the fastest whose output matches
// the heuristic default's, remember it per device model in the tuning database (docs/tuning.md).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "sparsejit/attention.h"
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
  std::int64_t rows = 0;    // rownorm: problem size timed (0: enough rows for 16M elements, at least 1)
  double budget_s = 60;     // stop timing new candidates after this long (the default is always timed)
  int warmup = 5, iterations = 30;
  bool store = true;        // write the winner to the tuning database
  // Called after each candidate: (done, total, what was just timed).
  std::function<void(int, int, const std::string&)> progress;
  // rownorm: extra layouts to try besides the op's own space (tests use this for a deliberately wrong one).
  std::vector<RowNormConfig> extra_candidates;
};

// The layouts the tuner tries for a spec: every valid mix of threads per row, access width, block
// size and row storage. The heuristic default is always among them.
std::vector<RowNormConfig> rownorm_candidates(const RowNormSpec& spec);

// Tunes one spec (its pass decides forward or backward) on the current device. Needs a GPU.
TuneReport tune_rownorm(const RowNormSpec& spec, const TuneOptions& options = {});

// ---- attention forward -----------------------------------------------------------------------------

// The problem an attention tuning times. Results are stored per key length rounded up to a power of two
// ("sk<=8192"): tune at the batch and heads of the real workload, since they decide how full the GPU is.
struct AttentionTuneShape {
  std::int64_t batch = 1, heads_q = 1, heads_kv = 1, seq_q = 0, seq_k = 0;
  // bsr specs: a random pattern of this density (patterns::random, diagonal + random key blocks), unless
  // `pattern` is given. Below 1: a pattern with every block active runs on the dense kernels.
  double density = 0.1;
  // bsr: the pattern to tune on (instead of a random one); baked: required, it is the pattern baked in.
  const BlockPattern* pattern = nullptr;
};

struct AttentionTuneCandidate {
  AttentionConfig config;
  double median_us = 0;     // 0 when not timed
  double tflops = 0;        // over the (query, key) pairs the mask allows, as attention_forward_flops counts
  std::string rejected;     // why it was not timed ("" when it was): resolve(), compile, launch, wrong output, budget
};

struct AttentionTuneReport {
  AttentionSpec spec;       // canonical; baked: with the pattern's digest
  AttentionTuneShape shape; // pattern: null (the pattern timed is described by density)
  double density = 1;       // of the pattern timed (1 for dense)
  std::string bucket;       // the shape bucket the result is stored under (a pattern's, for a pick)
  std::string device;
  AttentionConfig default_config, winner;
  double default_us = 0, winner_us = 0;
  double compile_s = 0, timing_s = 0;
  std::vector<AttentionTuneCandidate> candidates;  // every candidate, the default first
  bool stored = false;      // written to the tuning database
  std::string note;         // where the winner was stored as a pick for the pattern only, that
};

// The tilings the tuner tries for a spec: the heuristic default for the compute capability first (10 *
// major + minor; 0: the portable default), then every mix of warps {4, 8}, m_tiles {1, 2}, block_n
// {32, 64, 128}, stages {2, 3}, q_in_registers {0, 1} and path {mma, wgmma, wgmma_ws} that is not the
// default.
// Those resolve() refuses (shared memory, pattern blocks per tile, what the wgmma path takes) carry its
// reason in `rejected`. (wgmma candidates on a device other than sm_90a fail when compiled.)
std::vector<AttentionTuneCandidate> attention_candidates(const AttentionSpec& spec, int compute_capability = 0);

// Tunes the forward of one spec on the current device at one shape: compiles every accepted candidate
// in parallel, runs each on the same random inputs (outputs poisoned first) and rejects one whose output
// differs from the default's, times the rest with events (warm-up, median of options.iterations) until
// options.budget_s is spent, and stores the fastest under op "attention", the spec's key and the bucket.
// An Attention built later with an all-unset config uses it when the autotune policy is on or force.
// With pattern blocks of 16 or 32 on Hopper, where an untuned Attention picks its tiling per pattern
// (forward_config: the spec's, wide tiles or the gathered-key kernel), the default timed is its pick
// for the pattern and its other picks are timed next; where one of them wins, it is stored for that
// pattern only (op "attention_pattern", bucket "pattern=<digest>,heads=<H>", `note` says so), since a
// stored tiling would run every pattern of the spec. Needs a GPU.
AttentionTuneReport tune_attention(const AttentionSpec& spec, const AttentionTuneShape& shape,
                                   const TuneOptions& options = {});

// The stored winner for a spec on the current device whose bucket serves seq_k best (its own bucket, else
// the nearest by powers of two; seq_k 0: the longest stored), whatever the policy; nullopt if none. For a
// program that knows its shape: pass the result to Attention as an explicit config.
std::optional<AttentionConfig> tuned_attention_config(const AttentionSpec& spec, std::int64_t seq_k = 0);

// ---- attention backward: how dQ is summed ---------------------------------------------------------

struct DqTuneReport {
  AttentionSpec spec;            // canonical, pass=bwd; baked: with the pattern's digest
  AttentionTuneShape shape;      // pattern: null (the pattern timed is described by density)
  double density = 1;            // of the pattern timed (1 for dense)
  double key_tiles_per_row = 0;  // active key tiles a query row sees, of the 128-key dK/dV pass's tiles
                                 // (counted contiguous where that pass packs its queries)
  std::string bucket;            // what the result is stored under: GQA group and key tiles a row, and
                                 // ",walk=gathered" where the pattern runs the gathered backward,
                                 // ",walk=narrow" where it runs d = 64's 64-query dK/dV tiles,
                                 // ",banded" where its dK/dV walks make a band (a sliding window),
                                 // ",beyond_l2" where atomic dQ's working set outgrows the L2
  std::string device;
  DqSummation chosen_before = DqSummation::atomic;  // the backward's choice before this tuning
  double atomic_us = 0, pass_us = 0;                 // median backward, each way
  DqSummation winner = DqSummation::atomic;
  bool stored = false;           // written to the tuning database
};

// Tunes how the backward of one spec sums dQ on the current device at one shape (a spec that can
// only take the dQ pass, deterministic or at head_dim 256, is refused): runs the forward once, then the
// backward each way (AttentionBackwardArgs::dq_summation) on the same random inputs into poisoned
// gradients, refuses to go on if the two ways' gradients differ by more than rounding, and times each
// (warm-up, median of options.iterations). Stores the faster under op "attention_dq", the backward
// spec's key and the problem's bucket (query heads a K/V head, key tiles a query row rounded up to a
// power of two; patterns that run the gathered backward, of blocks of 16 and 32, apart from the rest).
// A backward whose args leave dq_summation unset then takes it, for a problem of the same bucket, when
// the autotune policy is on or force. Needs a GPU.
DqTuneReport tune_dq_summation(const AttentionSpec& spec, const AttentionTuneShape& shape,
                               const TuneOptions& options = {});

// ---- attention backward: how it walks one pattern ------------------------------------------------

struct WalkTuneCandidate {
  BackwardWalk walk = BackwardWalk::tiles;
  int query_tile_cols = 0;            // of the dK/dV pass's tiles; 0 for the gathered walk
  DqSummation dq = DqSummation::atomic;
  std::string tiling;                 // Attention::backward_tiling's text for it
  double median_us = 0;               // the backward's
};

struct WalkTuneReport {
  AttentionSpec spec;                 // canonical, pass=bwd
  AttentionTuneShape shape;           // pattern: null (the pattern timed is named by its digest)
  std::uint64_t pattern_digest = 0;
  double density = 0;                 // of the pattern timed
  std::string bucket;                 // "pattern=<digest>,group=<query heads a K/V head>"
  std::string device;
  std::vector<WalkTuneCandidate> candidates;  // each different backward once, the one chosen before first
  int not_runnable = 0;               // asked combinations the pattern cannot take (refused, not timed)
  std::size_t winner = 0;             // index into candidates
  bool stored = false;                // written to the tuning database
};

// Tunes how the backward of one block-sparse spec runs one pattern (shape.pattern, required) on the
// current device, which must be Hopper (sm_90a), where the choices are: times every combination of the
// dK/dV pass's walk (BackwardWalk), its query tiles (64 or 128 where both exist) and how dQ is summed
// that the pattern can take (AttentionBackwardArgs::walk, query_tile_cols, dq_summation; each distinct
// backward once), on the same random inputs into poisoned gradients, refuses to go on where one's
// gradients differ from the first's by more than rounding, and stores the fastest under op
// "attention_walk", the backward spec's key and the bucket (the pattern's digest and the GQA group). A
// backward of that pattern and group whose args ask none of the three then takes it, where neither
// SJIT_BACKWARD_WALK nor SJIT_BACKWARD_QUERY_TILES is set and the autotune policy is on or force. For
// patterns learned once and trained on for long: the rules that choose otherwise were measured on the
// H100 and H200 at a few shapes. Needs a GPU.
WalkTuneReport tune_backward_walk(const AttentionSpec& spec, const AttentionTuneShape& shape,
                                  const TuneOptions& options = {});

// ---- the database ----------------------------------------------------------------------------------

struct TunedEntry {
  std::string device, op, spec_key, bucket, winner_config, default_config, measured_at;
  double winner_us = 0, default_us = 0;
  int candidates = 0;
  // Measured with this build's kernels (its templates, and the sources that generate and choose
  // kernels: docs/tuning.md). Launches pass over an entry of other kernels (an
  // earlier or later sparsejit, or an import from one): its winner may no longer be the fastest, so
  // it waits to be tuned again.
  bool current_kernels = true;
};
std::vector<TunedEntry> tuning_entries();
std::string tuning_dir();
std::string export_tuning();                     // one JSON document with every entry
int import_tuning(const std::string& document);  // entries stored

}  // namespace sjit

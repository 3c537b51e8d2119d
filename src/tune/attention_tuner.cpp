// Tuning the attention forward: every tiling of the grid, timed on this device at one shape.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <mutex>

#include "attention/attention_args.h"
#include "attention/attention_internals.h"
#include "jit/jit.h"
#include "runtime/driver.h"
#include "sparsejit/error.h"
#include "sparsejit/tune.h"
#include "tune/attention_tune_inputs.h"
#include "tune/attention_tuned_configs.h"
#include "tune/tuned_configs.h"
#include "tune/tuner_support.h"

namespace sjit {
namespace {

using Clock = std::chrono::steady_clock;

// One knob of the grid: the values tried and where they go in a config. A new knob is one more line
// here; attention_candidates tries every mix of all of them.
struct GridAxis {
  std::vector<int> values;
  void (*set)(AttentionConfig&, int);
};
const std::vector<GridAxis>& grid() {
  static const std::vector<GridAxis> axes = {
      {{4, 8}, [](AttentionConfig& c, int v) { c.warps = v; }},
      {{1, 2}, [](AttentionConfig& c, int v) { c.m_tiles = v; }},
      {{32, 64, 128}, [](AttentionConfig& c, int v) { c.block_n = v; }},
      {{2, 3}, [](AttentionConfig& c, int v) { c.stages = v; }},
      {{0, 1}, [](AttentionConfig& c, int v) { c.q_in_registers = v; }},
      {{int(AttentionPath::mma), int(AttentionPath::wgmma), int(AttentionPath::wgmma_ws)},
       [](AttentionConfig& c, int v) { c.path = AttentionPath(v); }},
  };
  return axes;
}

// Every mix of the grid's values, the first axis slowest.
std::vector<AttentionConfig> grid_configs() {
  std::vector<AttentionConfig> configs = {AttentionConfig{}};
  for (const GridAxis& axis : grid()) {
    std::vector<AttentionConfig> next;
    for (const AttentionConfig& c : configs)
      for (int value : axis.values) {
        AttentionConfig d = c;
        axis.set(d, value);
        next.push_back(d);
      }
    configs = std::move(next);
  }
  return configs;
}

// The spec an Attention would hold for this spec and pattern; only the forward is tuned here.
AttentionSpec tuned_spec(const AttentionSpec& in, const AttentionTuneShape& shape) {
  const AttentionSpec spec = tuning::tuned_attention_spec(in, shape, "tune_attention");
  if (spec.pass != Pass::forward)
    throw InvalidArgument(fmt::format("tune_attention: '{}': only the forward (pass=fwd) is tuned here; "
                                      "tune_dq_summation tunes the backward's way of summing dQ", key(spec)));
  return spec;
}

// The random inputs, poisoned outputs and arguments of one tuning, and the pattern it runs on.
struct Problem {
  AttentionSpec spec;
  tuning::AttentionTuneInputs in;  // in.pattern: null for dense
  DeviceBuffer o, lse;
  AttentionForwardArgs args;

  Problem(const AttentionSpec& s, const AttentionTuneShape& shape) : spec(s), in(s, shape, "tune_attention") {
    const std::int64_t d = spec.head_dim;
    o = DeviceBuffer(std::size_t(shape.batch * shape.heads_q * shape.seq_q * d) * size_of(spec.dtype));
    lse = DeviceBuffer(std::size_t(shape.batch * shape.heads_q * shape.seq_q) * 4);
    args = in.forward_args(shape, o.data(), lse.as<float>());
    // Every argument checked now, before minutes of compiling.
    attention::checked_forward_args(spec, args, spec.sparsity == Sparsity::baked ? in.pattern : nullptr);
  }

  Attention make(const AttentionConfig& config) const {
    return spec.sparsity == Sparsity::baked ? Attention(spec, *in.pattern, config) : Attention(spec, config);
  }

  // One forward into poisoned outputs; returns O (then the log-sum-exp) as floats.
  std::vector<float> run_once(Attention& attention) {
    o.fill_bytes(0xFF);  // NaN in f16, bf16 and f32: an element the kernel forgets to write cannot match
    lse.fill_bytes(0xFF);
    attention.forward(args);
    synchronize();
    const std::size_t o_count = o.bytes() / size_of(spec.dtype), lse_count = lse.bytes() / 4;
    std::vector<float> values = tuning::download_values(o, spec.dtype, o_count);
    values.resize(o_count + lse_count);
    lse.download(values.data() + o_count, lse_count * 4);
    return values;
  }

  // "" when `got` matches the default's output `want` (O rows of head_dim, then the log-sum-exp in fp32).
  std::string compare(const std::vector<float>& got, const std::vector<float>& want) const {
    const std::size_t o_count = o.bytes() / size_of(spec.dtype);
    const std::span<const float> g(got), w(want);
    std::string diff = tuning::compare_rows(spec.dtype, spec.head_dim, g.first(o_count), w.first(o_count));
    if (!diff.empty()) return "wrong output: O " + diff;
    diff = tuning::compare_rows(DType::f32, std::size_t(args.seq_q), g.subspan(o_count), w.subspan(o_count));
    return diff.empty() ? diff : "wrong output: log-sum-exp " + diff;
  }
};

}  // namespace

std::vector<AttentionTuneCandidate> attention_candidates(const AttentionSpec& spec_in, int compute_capability) {
  const AttentionSpec spec = canonical(spec_in);
  const AttentionConfig fallback = resolve(spec, {}, compute_capability);
  std::vector<AttentionTuneCandidate> out = {{fallback}};
  for (const AttentionConfig& c : grid_configs()) {
    AttentionTuneCandidate candidate{c};
    try {
      candidate.config = resolve(spec, c);
    } catch (const InvalidArgument& e) {
      candidate.rejected = e.what();
    }
    if (key(candidate.config) != key(fallback)) out.push_back(candidate);
  }
  return out;
}

AttentionTuneReport tune_attention(const AttentionSpec& spec_in, const AttentionTuneShape& shape,
                                   const TuneOptions& o) {
  tuning::check_attention_shape(shape, "tune_attention");
  const AttentionSpec spec = tuned_spec(spec_in, shape);
  const jit::Target target = jit::current_target();
  AttentionTuneReport report;
  report.spec = spec;
  report.shape = shape;
  report.shape.pattern = nullptr;
  report.bucket = tuning::attention_bucket(shape.seq_k);
  report.device = target.device->name;
  Problem problem(spec, shape);
  report.density = problem.in.pattern ? problem.in.pattern->stats().density : 1.0;
  // The default is the one an Attention takes on this device (on the H100 often the wgmma path).
  const int compute_capability = 10 * target.device->cc_major + target.device->cc_minor;
  report.default_config = resolve(spec, {}, compute_capability);
  report.candidates = attention_candidates(spec, compute_capability);
  std::vector<AttentionTuneCandidate>& candidates = report.candidates;
  // With small pattern blocks on Hopper an untuned Attention picks its tiling per pattern (the spec's,
  // wide tiles, the gathered-key kernel: Attention::forward_config), and a stored tiling takes the place
  // of that pick for every pattern of the spec. So the default timed is what it picks for this pattern,
  // the other picks come next (the gathered kernel is not in the grid), and where a pick wins, it is
  // stored for this pattern only (below).
  AttentionInternals::ForwardPicks picks;
  if (spec.sparsity == Sparsity::block_sparse)
    picks = AttentionInternals::forward_picks(spec, *problem.in.pattern, shape.heads_q, shape.heads_kv);
  if (!picks.picks.empty()) {
    report.default_config = picks.untuned;
    std::vector<AttentionConfig> first = {picks.untuned};
    for (const auto& [pick, config] : picks.picks)
      if (key(config) != key(picks.untuned)) first.push_back(config);
    std::erase_if(candidates, [&](const AttentionTuneCandidate& c) {
      return std::any_of(first.begin(), first.end(), [&](const AttentionConfig& f) { return key(f) == key(c.config); });
    });
    for (auto it = first.rbegin(); it != first.rend(); ++it) candidates.insert(candidates.begin(), AttentionTuneCandidate{*it});
  }
  const double flops = attention_forward_flops(spec, problem.args);

  // Compile every accepted candidate first, on all cores (kernels load into this thread's context); a
  // failure rejects only that candidate.
  const auto compile_start = Clock::now();
  std::vector<std::optional<Attention>> kernels(candidates.size());
  std::vector<std::size_t> to_compile;
  for (std::size_t i = 0; i < candidates.size(); ++i)
    if (candidates[i].rejected.empty()) {
      try {
        kernels[i].emplace(problem.make(candidates[i].config));  // an explicit config: no database lookup
        to_compile.push_back(i);
      } catch (const InvalidArgument& e) {
        candidates[i].rejected = e.what();  // a baked pattern with too many tiles for this tiling
      }
    }
  std::mutex progress_mutex;
  int compiled = 0;
  tuning::run_in_parallel(to_compile.size(), [&](std::size_t n) {
    const std::size_t i = to_compile[n];
    try {
      SJIT_CU(runtime::driver().cuCtxSetCurrent(target.context));
      kernels[i]->prepare();
    } catch (const Error& e) {
      candidates[i].rejected = fmt::format("compile: {}", e.what());
    }
    std::lock_guard lock(progress_mutex);
    ++compiled;
    if (o.progress) o.progress(compiled, int(to_compile.size()), "compiled " + key(candidates[i].config));
  });
  report.compile_s = std::chrono::duration<double>(Clock::now() - compile_start).count();

  std::vector<float> reference;
  const auto start = Clock::now();
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    AttentionTuneCandidate& c = candidates[i];
    const double elapsed_s = std::chrono::duration<double>(Clock::now() - start).count();
    if (c.rejected.empty() && i > 0 && elapsed_s > o.budget_s)
      c.rejected = fmt::format("not timed: the {:.0f} s budget was spent", o.budget_s);
    if (c.rejected.empty()) {
      try {
        const std::vector<float> got = problem.run_once(*kernels[i]);
        if (i == 0) {
          if (auto nan = std::find_if(got.begin(), got.end(), [](float x) { return std::isnan(x); }); nan != got.end())
            c.rejected = fmt::format("wrong output: element {} of O and the log-sum-exp is NaN", nan - got.begin());
          reference = got;
        } else {
          c.rejected = problem.compare(got, reference);
        }
        if (c.rejected.empty()) {
          c.median_us = tuning::median_launch_us(o.warmup, o.iterations, [&](int) { kernels[i]->forward(problem.args); });
          c.tflops = flops / c.median_us / 1e6;
        }
      } catch (const DriverError& e) {
        c.rejected = fmt::format("launch: {}", e.what());
      }
    }
    if (o.progress) o.progress(int(i + 1), int(candidates.size()), "timed " + key(c.config));
  }
  report.timing_s = std::chrono::duration<double>(Clock::now() - start).count();

  const AttentionTuneCandidate& def = candidates.front();
  if (!def.rejected.empty())
    throw Error(fmt::format("tuning {}: the default tiling {} failed: {}", key(spec), key(def.config), def.rejected));
  report.default_us = report.winner_us = def.median_us;
  report.winner = def.config;
  int timed = 0;
  for (const AttentionTuneCandidate& c : candidates) {
    timed += c.rejected.empty();
    if (c.rejected.empty() && c.median_us < report.winner_us) report.winner = c.config, report.winner_us = c.median_us;
  }
  auto pick_of = [&](const AttentionConfig& config) -> std::string {
    for (const auto& [pick, c] : picks.picks)
      if (key(c) == key(config)) return pick;
    return "";
  };
  if (const std::string pick = pick_of(report.winner); o.store && !pick.empty()) {
    // A stored tiling would run every pattern of the spec; a pick stored for this pattern leaves the
    // others to their own picks.
    report.bucket = tuning::forward_pick_bucket(problem.in.pattern->digest(), picks.heads);
    report.stored = tuning::store_forward_pick(spec, report.bucket, pick, report.winner_us,
                                               pick_of(report.default_config), report.default_us, timed);
    report.note = fmt::format("the tiling picked per pattern '{}' ({}) is the fastest: stored for this pattern "
                              "only, every other pattern keeps its own pick",
                              pick, key(report.winner));
  } else if (o.store) {
    report.stored = tuning::store_attention_result(spec, report.bucket, report.winner, report.winner_us,
                                                   report.default_config, report.default_us, timed);
  }
  return report;
}

std::optional<AttentionConfig> tuned_attention_config(const AttentionSpec& spec, std::int64_t seq_k) {
  if (seq_k < 0) throw InvalidArgument(fmt::format("tuned_attention_config: seq_k = {} must be 0 or more", seq_k));
  return tuning::stored_attention_config(tuning::database(), tuning::model_of(*jit::current_target().device),
                                         canonical(spec), seq_k);
}

}  // namespace sjit

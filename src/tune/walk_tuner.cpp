// Tuning how the attention backward runs one pattern: every walk, query tile width and way of summing
// dQ the pattern can take, timed on this device at one shape.
#include <fmt/format.h>

#include <algorithm>

#include "attention/attention_internals.h"
#include "jit/jit.h"
#include "sparsejit/error.h"
#include "sparsejit/tune.h"
#include "tune/attention_tuned_configs.h"
#include "tune/backward_tune_run.h"

namespace sjit {
namespace {

tuning::TunedWalk choice_of(const WalkTuneCandidate& c) { return {c.walk, c.query_tile_cols, c.dq}; }

}  // namespace

WalkTuneReport tune_backward_walk(const AttentionSpec& spec_in, const AttentionTuneShape& shape, const TuneOptions& o) {
  constexpr std::string_view who = "tune_backward_walk";
  tuning::check_attention_shape(shape, who);
  if (shape.pattern == nullptr)
    throw InvalidArgument(fmt::format("{}: it tunes the backward for one pattern, and shape.pattern is null: give the "
                                      "pattern (sjit tune attention SPEC --backward --walk --pattern FILE)", who));
  AttentionSpec spec = tuning::tuned_attention_spec(spec_in, shape, who);
  spec.pass = Pass::backward;
  if (spec.sparsity == Sparsity::dense)
    throw InvalidArgument(fmt::format("{}: '{}' is dense: only block-sparse specs walk a pattern", who, key(spec)));
  const jit::Target target = jit::current_target();
  if (target.device->arch != "sm_90a")
    throw InvalidArgument(fmt::format("{}: the backward chooses how it walks a pattern on Hopper (sm_90a) only; {} "
                                      "is {}: its backward always walks tiles", who, target.device->name,
                                      target.device->arch));
  WalkTuneReport report;
  report.spec = spec;
  report.shape = shape;
  report.shape.pattern = nullptr;
  report.pattern_digest = shape.pattern->digest();
  report.density = shape.pattern->stats().density;
  report.device = target.device->name;
  report.bucket = tuning::walk_bucket(report.pattern_digest, shape.heads_q / shape.heads_kv);

  tuning::BackwardTuneRun run(spec, shape, who);
  Attention& attention = run.attention();
  // Each distinct backward once, the one chosen with nothing asked first; each asked for exactly (what it
  // runs is asked, so that the stored choice is what was timed).
  std::vector<AttentionBackwardArgs> asks;
  auto add = [&](const AttentionBackwardArgs& a) {
    WalkTuneCandidate c;
    try {
      const AttentionInternals::BackwardChoices runs = AttentionInternals::backward_choices(attention, a);
      c.walk = runs.walk, c.dq = runs.dq, c.tiling = runs.tiling, c.query_tile_cols = runs.query_tile_cols;
    } catch (const InvalidArgument&) {
      ++report.not_runnable;  // (a walk, tile width or way this pattern or spec cannot take)
      return;
    }
    const bool seen = std::any_of(report.candidates.begin(), report.candidates.end(), [&](const WalkTuneCandidate& x) {
      return choice_of(x) == choice_of(c) && x.tiling == c.tiling;
    });
    if (seen) return;
    AttentionBackwardArgs exact = run.args();
    exact.walk = c.walk, exact.query_tile_cols = c.query_tile_cols, exact.dq_summation = c.dq;
    report.candidates.push_back(c);
    asks.push_back(exact);
  };
  add(run.args());
  for (const BackwardWalk walk : {BackwardWalk::tiles, BackwardWalk::packed, BackwardWalk::gathered})
    for (const int cols : {64, 128})
      for (const DqSummation dq : {DqSummation::atomic, DqSummation::pass}) {
        AttentionBackwardArgs a = run.args();
        a.walk = walk, a.query_tile_cols = walk == BackwardWalk::gathered ? 0 : cols, a.dq_summation = dq;
        add(a);
      }

  const int total = 2 * int(asks.size());
  auto describe = [](const WalkTuneCandidate& c) { return tuning::walk_choice_text(choice_of(c)); };
  // Every candidate's gradients against those of the one chosen before, within rounding.
  const auto chosen_before = run.gradients(asks[0]);
  if (o.progress) o.progress(1, total, "ran " + describe(report.candidates[0]));
  for (std::size_t i = 1; i < asks.size(); ++i) {
    if (const std::string diff = run.differs(run.gradients(asks[i]), chosen_before); !diff.empty())
      throw Error(fmt::format("{} {}: the backward with {} disagrees with {}: {}", who, key(spec),
                              describe(report.candidates[i]), describe(report.candidates[0]), diff));
    if (o.progress) o.progress(int(i) + 1, total, "ran " + describe(report.candidates[i]));
  }
  for (std::size_t i = 0; i < asks.size(); ++i) {
    report.candidates[i].median_us = run.median_us(asks[i], o);
    if (o.progress) o.progress(int(asks.size() + i) + 1, total, "timed " + describe(report.candidates[i]));
  }
  for (std::size_t i = 1; i < report.candidates.size(); ++i)
    if (report.candidates[i].median_us < report.candidates[report.winner].median_us) report.winner = i;
  if (o.store) {
    const WalkTuneCandidate &winner = report.candidates[report.winner], &before = report.candidates[0];
    report.stored = tuning::store_walk_result(spec, report.bucket, choice_of(winner), winner.median_us,
                                              choice_of(before), before.median_us, int(report.candidates.size()));
  }
  return report;
}

}  // namespace sjit

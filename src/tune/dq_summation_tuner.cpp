// Tuning how the attention backward sums dQ: both ways timed on this device at one shape.
#include <fmt/format.h>

#include "attention/attention_internals.h"
#include "codegen/attention_codegen.h"
#include "jit/jit.h"
#include "sparsejit/error.h"
#include "sparsejit/tune.h"
#include "tune/attention_tuned_configs.h"
#include "tune/backward_tune_run.h"

namespace sjit {

DqTuneReport tune_dq_summation(const AttentionSpec& spec_in, const AttentionTuneShape& shape, const TuneOptions& o) {
  constexpr std::string_view who = "tune_dq_summation";
  tuning::check_attention_shape(shape, who);
  AttentionSpec spec = tuning::tuned_attention_spec(spec_in, shape, who);
  spec.pass = Pass::backward;
  if (!codegen::atomic_dq(spec))
    throw InvalidArgument(fmt::format("{}: '{}' sums dQ only by its pass ({}): there is nothing to choose", who,
                                      key(spec), spec.deterministic ? "deterministic" : "no atomic dQ at this head_dim"));
  DqTuneReport report;
  report.spec = spec;
  report.shape = shape;
  report.shape.pattern = nullptr;
  report.device = jit::current_target().device->name;

  tuning::BackwardTuneRun run(spec, shape, who);
  report.density = run.pattern() ? run.pattern()->stats().density : 1.0;
  AttentionBackwardArgs args = run.args();
  const AttentionInternals::BackwardChoices chosen = AttentionInternals::backward_choices(run.attention(), args);
  report.key_tiles_per_row = chosen.key_tiles_per_row;
  report.bucket = tuning::dq_bucket(shape.heads_q / shape.heads_kv, report.key_tiles_per_row,
                                    {.gathered = chosen.walk == BackwardWalk::gathered,
                                     .beyond_l2 = chosen.accumulator_spills,
                                     .narrow_queries = chosen.narrow_queries,
                                     .banded = chosen.banded});
  report.chosen_before = chosen.dq;

  // Each way once; the two must agree within the rounding of the dtype.
  auto gradients = [&](DqSummation way) {
    args.dq_summation = way;
    return run.gradients(args);
  };
  const auto atomic = gradients(DqSummation::atomic);
  if (o.progress) o.progress(1, 4, "ran the backward with dQ atomic");
  const auto pass = gradients(DqSummation::pass);
  if (o.progress) o.progress(2, 4, "ran the backward with the dQ pass");
  if (const std::string diff = run.differs(pass, atomic); !diff.empty())
    throw Error(fmt::format("{} {}: the two ways of summing dQ disagree: {} (with dQ atomic)", who, key(spec), diff));

  auto time = [&](DqSummation way) {
    args.dq_summation = way;
    return run.median_us(args, o);
  };
  report.atomic_us = time(DqSummation::atomic);
  if (o.progress) o.progress(3, 4, "timed the backward with dQ atomic");
  report.pass_us = time(DqSummation::pass);
  if (o.progress) o.progress(4, 4, "timed the backward with the dQ pass");
  report.winner = report.atomic_us <= report.pass_us ? DqSummation::atomic : DqSummation::pass;
  if (o.store) {
    auto us = [&](DqSummation way) { return way == DqSummation::atomic ? report.atomic_us : report.pass_us; };
    report.stored = tuning::store_dq_result(spec, report.bucket, report.winner, us(report.winner),
                                            report.chosen_before, us(report.chosen_before));
  }
  return report;
}

}  // namespace sjit

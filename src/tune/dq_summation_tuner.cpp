// Tuning how the attention backward sums dQ: both ways timed on this device at one shape.
#include <fmt/format.h>

#include "attention/attention_internals.h"
#include "codegen/attention_codegen.h"
#include "jit/jit.h"
#include "sparsejit/error.h"
#include "sparsejit/tune.h"
#include "tune/attention_tune_inputs.h"
#include "tune/attention_tuned_configs.h"
#include "tune/tuner_support.h"

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

  tuning::AttentionTuneInputs in(spec, shape, who);
  report.density = in.pattern ? in.pattern->stats().density : 1.0;
  const std::int64_t d = spec.head_dim, rows = shape.batch * shape.heads_q * shape.seq_q;
  const std::size_t q_count = std::size_t(rows * d), kv_count = std::size_t(shape.batch * shape.heads_kv * shape.seq_k * d);
  const std::size_t element = size_of(spec.dtype);
  DeviceBuffer o_buffer(q_count * element), lse(std::size_t(rows) * 4);
  DeviceBuffer d_o = tuning::random_tensor(spec.dtype, std::int64_t(q_count), 4);
  DeviceBuffer dq(q_count * element), dk(kv_count * element), dv(kv_count * element);

  Attention attention = spec.sparsity == Sparsity::baked ? Attention(spec, *in.pattern) : Attention(spec);
  attention.forward(in.forward_args(shape, o_buffer.data(), lse.as<float>()));

  AttentionBackwardArgs args;
  args.q = in.q.data(), args.k = in.k.data(), args.v = in.v.data(), args.o = o_buffer.data(), args.lse = lse.as<float>();
  args.d_o = d_o.data(), args.dq = dq.data(), args.dk = dk.data(), args.dv = dv.data();
  args.batch = shape.batch, args.heads_q = shape.heads_q, args.heads_kv = shape.heads_kv;
  args.seq_q = shape.seq_q, args.seq_k = shape.seq_k;
  args.pattern = in.pattern;
  const AttentionInternals::DqChoiceInputs inputs = AttentionInternals::backward_dq_choice_inputs(attention, args);
  report.key_tiles_per_row = inputs.key_tiles_per_row;
  report.bucket = tuning::dq_bucket(shape.heads_q / shape.heads_kv, report.key_tiles_per_row,
                                    {.gathered = inputs.gathered,
                                     .beyond_l2 = inputs.accumulator_spills,
                                     .narrow_queries = inputs.narrow_queries,
                                     .banded = inputs.banded});
  report.chosen_before = attention.dq_summation(args);

  // Each way once into poisoned gradients (0xFF is NaN, which compare_rows never matches: an element
  // either way left unwritten fails); the two must agree within the rounding of the dtype (they add dQ
  // in different orders).
  auto gradients = [&](DqSummation way) {
    args.dq_summation = way;
    for (DeviceBuffer* g : {&dq, &dk, &dv}) g->fill_bytes(0xFF);
    attention.backward(args);
    synchronize();
    return std::vector<std::vector<float>>{tuning::download_values(dq, spec.dtype, q_count),
                                           tuning::download_values(dk, spec.dtype, kv_count),
                                           tuning::download_values(dv, spec.dtype, kv_count)};
  };
  const auto atomic = gradients(DqSummation::atomic);
  if (o.progress) o.progress(1, 4, "ran the backward with dQ atomic");
  const auto pass = gradients(DqSummation::pass);
  if (o.progress) o.progress(2, 4, "ran the backward with the dQ pass");
  constexpr const char* names[] = {"dQ", "dK", "dV"};
  for (int g = 0; g < 3; ++g) {
    const std::string diff = tuning::compare_rows(spec.dtype, std::size_t(d), pass[g], atomic[g]);
    if (!diff.empty())
      throw Error(fmt::format("{} {}: {} differs between the two ways of summing dQ: {} (with dQ atomic)", who,
                              key(spec), names[g], diff));
  }

  auto time = [&](DqSummation way) {
    args.dq_summation = way;
    return tuning::median_launch_us(o.warmup, o.iterations, [&](int) { attention.backward(args); });
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

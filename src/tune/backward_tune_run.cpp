#include "tune/backward_tune_run.h"

#include <fmt/format.h>

#include "sparsejit/dtype.h"
#include "tune/tuner_support.h"

namespace sjit::tuning {

BackwardTuneRun::BackwardTuneRun(const AttentionSpec& spec, const AttentionTuneShape& shape, std::string_view who)
    : spec_(spec),
      in_(spec, shape, who),
      q_count_(std::size_t(shape.batch * shape.heads_q * shape.seq_q * spec.head_dim)),
      kv_count_(std::size_t(shape.batch * shape.heads_kv * shape.seq_k * spec.head_dim)),
      o_(q_count_ * size_of(spec.dtype)),
      lse_(std::size_t(shape.batch * shape.heads_q * shape.seq_q) * 4),
      d_o_(random_tensor(spec.dtype, std::int64_t(q_count_), 4)),
      dq_(q_count_ * size_of(spec.dtype)),
      dk_(kv_count_ * size_of(spec.dtype)),
      dv_(kv_count_ * size_of(spec.dtype)),
      attention_(spec.sparsity == Sparsity::baked ? Attention(spec, *in_.pattern) : Attention(spec)) {
  attention_.forward(in_.forward_args(shape, o_.data(), lse_.as<float>()));
  AttentionBackwardArgs& a = args_;
  a.q = in_.q.data(), a.k = in_.k.data(), a.v = in_.v.data(), a.o = o_.data(), a.lse = lse_.as<float>();
  a.d_o = d_o_.data(), a.dq = dq_.data(), a.dk = dk_.data(), a.dv = dv_.data();
  a.batch = shape.batch, a.heads_q = shape.heads_q, a.heads_kv = shape.heads_kv;
  a.seq_q = shape.seq_q, a.seq_k = shape.seq_k;
  a.pattern = in_.pattern;
}

BackwardTuneRun::Gradients BackwardTuneRun::gradients(const AttentionBackwardArgs& asked) {
  for (DeviceBuffer* g : {&dq_, &dk_, &dv_}) g->fill_bytes(0xFF);
  attention_.backward(asked);
  synchronize();
  return {download_values(dq_, spec_.dtype, q_count_), download_values(dk_, spec_.dtype, kv_count_),
          download_values(dv_, spec_.dtype, kv_count_)};
}

std::string BackwardTuneRun::differs(const Gradients& got, const Gradients& want) const {
  constexpr const char* names[] = {"dQ", "dK", "dV"};
  for (int g = 0; g < 3; ++g)
    if (const std::string diff = compare_rows(spec_.dtype, std::size_t(spec_.head_dim), got[g], want[g]); !diff.empty())
      return fmt::format("{} differs: {}", names[g], diff);
  return "";
}

double BackwardTuneRun::median_us(const AttentionBackwardArgs& asked, const TuneOptions& o) {
  return median_launch_us(o.warmup, o.iterations, [&](int) { attention_.backward(asked); });
}

}  // namespace sjit::tuning

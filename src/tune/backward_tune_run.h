// What both backward tunings (how dQ is summed, how a pattern is walked) do the same way: the forward
// once on a tuning's inputs, then backward after backward over the same inputs, each into poisoned
// gradients to be compared, or timed.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "sparsejit/attention.h"
#include "sparsejit/device.h"
#include "sparsejit/tune.h"
#include "tune/attention_tune_inputs.h"

namespace sjit::tuning {

class BackwardTuneRun {
 public:
  // `spec`: canonical (tuned_attention_spec), pass=bwd. Runs the forward, so needs a GPU.
  BackwardTuneRun(const AttentionSpec& spec, const AttentionTuneShape& shape, std::string_view who);

  Attention& attention() { return attention_; }
  const BlockPattern* pattern() const { return in_.pattern; }
  // The backward's arguments over the run's buffers, with nothing asked (dq_summation, walk and
  // query_tile_cols unset): set those on a copy.
  const AttentionBackwardArgs& args() const { return args_; }

  // dQ, dK and dV of backward(asked), run into gradients poisoned first (0xFF: NaN, which
  // compare_rows never matches, so an element left unwritten fails).
  using Gradients = std::vector<std::vector<float>>;
  Gradients gradients(const AttentionBackwardArgs& asked);
  // "" where `got` matches `want` within the rounding of the dtype (the ways add in different orders),
  // else which gradient differs and where.
  std::string differs(const Gradients& got, const Gradients& want) const;
  // The median backward(asked), in microseconds (options' warm-up and iterations).
  double median_us(const AttentionBackwardArgs& asked, const TuneOptions& options);

 private:
  AttentionSpec spec_;
  AttentionTuneInputs in_;
  std::size_t q_count_, kv_count_;
  DeviceBuffer o_, lse_, d_o_, dq_, dk_, dv_;
  Attention attention_;
  AttentionBackwardArgs args_;
};

}  // namespace sjit::tuning

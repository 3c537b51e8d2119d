// What both attention tunings (the forward's tiling, the backward's way of summing dQ) build the same
// way: the checked shape, the spec as an Attention would hold it, the pattern timed, and random inputs.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "sparsejit/device.h"
#include "sparsejit/tune.h"

namespace sjit::tuning {

// Refuses (InvalidArgument, prefixed with `who`) a shape with a size below 1 or Hq not a multiple of Hkv.
void check_attention_shape(const AttentionTuneShape& shape, std::string_view who);

// The canonical spec an Attention would hold for `spec` and the shape's pattern (baked: with the
// pattern's digest, which must then be given).
AttentionSpec tuned_attention_spec(const AttentionSpec& spec, const AttentionTuneShape& shape, std::string_view who);

// `elements` values of unit variance in `dtype` on the device, the same for the same seed.
DeviceBuffer random_tensor(DType dtype, std::int64_t elements, std::uint64_t seed);

// The first `count` elements of `buffer` (of `dtype`) as floats, decoded on every core.
std::vector<float> download_values(const DeviceBuffer& buffer, DType dtype, std::size_t count);

// The pattern a tuning times and random Q, K and V for it.
struct AttentionTuneInputs {
  std::optional<BlockPattern> own_pattern;
  const BlockPattern* pattern = nullptr;  // null for dense
  DeviceBuffer q, k, v;

  // bsr: shape.pattern, else patterns::random at shape.density (seed 7); a pattern with every block
  // active is refused, since the dense kernels would run. baked: shape.pattern.
  AttentionTuneInputs(const AttentionSpec& canonical_spec, const AttentionTuneShape& shape, std::string_view who);

  // The forward's arguments at `shape` over these inputs, its outputs into o and lse.
  AttentionForwardArgs forward_args(const AttentionTuneShape& shape, void* o, float* lse) const;
};

}  // namespace sjit::tuning

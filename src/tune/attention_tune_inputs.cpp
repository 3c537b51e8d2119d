#include "tune/attention_tune_inputs.h"

#include <fmt/format.h>

#include <algorithm>
#include <span>

#include "sparsejit/error.h"
#include "tune/tuner_support.h"

namespace sjit::tuning {
namespace {

// Unit-variance values from a counter hash (splitmix64): a tuning fills hundreds of MB, and a
// distribution object would take seconds; scores q.k*scale are then of unit variance too.
std::vector<float> random_values(std::size_t count, std::uint64_t seed) {
  std::vector<float> values(count);
  for (std::size_t i = 0; i < count; ++i) {
    std::uint64_t z = seed + (i + 1) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    const double uniform = double(z >> 11) * 0x1.0p-53;  // [0, 1)
    values[i] = float((2 * uniform - 1) * 1.7320508075688772);  // uniform on [-sqrt 3, sqrt 3]
  }
  return values;
}

}  // namespace

void check_attention_shape(const AttentionTuneShape& s, std::string_view who) {
  auto refuse = [&](std::string_view what) { throw InvalidArgument(fmt::format("{}: {}", who, what)); };
  if (s.batch < 1 || s.heads_q < 1 || s.heads_kv < 1 || s.seq_q < 1 || s.seq_k < 1)
    refuse(fmt::format("shape B={} Hq={} Hkv={} Sq={} Sk={}: every size must be at least 1", s.batch, s.heads_q,
                       s.heads_kv, s.seq_q, s.seq_k));
  if (s.heads_q % s.heads_kv != 0) refuse(fmt::format("Hq = {} is not a multiple of Hkv = {}", s.heads_q, s.heads_kv));
}

AttentionSpec tuned_attention_spec(const AttentionSpec& in, const AttentionTuneShape& shape, std::string_view who) {
  AttentionSpec spec = in;
  if (spec.sparsity == Sparsity::baked) {
    if (shape.pattern == nullptr)
      throw InvalidArgument(
          fmt::format("{}: '{}' is baked: give the pattern to bake in shape.pattern", who, key(canonical(in))));
    if (spec.block_size == 0) spec.block_size = shape.pattern->block_size();
    spec.pattern_digest = shape.pattern->digest();
  }
  return canonical(spec);
}

DeviceBuffer random_tensor(DType dtype, std::int64_t elements, std::uint64_t seed) {
  const std::vector<float> values = random_values(std::size_t(elements), seed);
  std::vector<unsigned char> bytes(values.size() * size_of(dtype));
  encode(dtype, values, bytes.data());
  DeviceBuffer buffer(std::max<std::size_t>(bytes.size(), 16));
  buffer.upload(bytes.data(), bytes.size());
  return buffer;
}

std::vector<float> download_values(const DeviceBuffer& buffer, DType dtype, std::size_t count) {
  std::vector<unsigned char> raw(count * size_of(dtype));
  buffer.download(raw.data(), raw.size());
  std::vector<float> values(count);
  constexpr std::size_t kChunk = 1 << 20;  // elements decoded by one job
  run_in_parallel((count + kChunk - 1) / kChunk, [&](std::size_t c) {
    const std::size_t begin = c * kChunk, n = std::min(kChunk, count - begin);
    decode(dtype, raw.data() + begin * size_of(dtype), std::span<float>(values.data() + begin, n));
  });
  return values;
}

AttentionTuneInputs::AttentionTuneInputs(const AttentionSpec& spec, const AttentionTuneShape& shape,
                                         std::string_view who) {
  if (spec.sparsity == Sparsity::block_sparse) {
    if (shape.pattern == nullptr) {
      if (!(shape.density > 0 && shape.density < 1))
        throw InvalidArgument(fmt::format("{}: density = {} must be in (0, 1): at 1 every block is active and the "
                                          "dense kernels run (tune the dense spec)", who, shape.density));
      own_pattern = patterns::random(spec.block_size, shape.seq_q, shape.seq_k, shape.density, 7);
    }
    pattern = own_pattern ? &*own_pattern : shape.pattern;
    const BlockPattern& p = *pattern;
    if (p.nnz() == std::int64_t(p.heads()) * p.block_rows() * p.block_cols())
      throw InvalidArgument(fmt::format(
          "{}: every block of the pattern is active, so the dense kernels run: tune the dense spec", who));
  } else if (spec.sparsity == Sparsity::baked) {
    pattern = shape.pattern;
  }
  const std::int64_t d = spec.head_dim;
  q = random_tensor(spec.dtype, shape.batch * shape.heads_q * shape.seq_q * d, 1);
  k = random_tensor(spec.dtype, shape.batch * shape.heads_kv * shape.seq_k * d, 2);
  v = random_tensor(spec.dtype, shape.batch * shape.heads_kv * shape.seq_k * d, 3);
}

AttentionForwardArgs AttentionTuneInputs::forward_args(const AttentionTuneShape& shape, void* o, float* lse) const {
  AttentionForwardArgs args;
  args.q = q.data(), args.k = k.data(), args.v = v.data(), args.o = o, args.lse = lse;
  args.batch = shape.batch, args.heads_q = shape.heads_q, args.heads_kv = shape.heads_kv;
  args.seq_q = shape.seq_q, args.seq_k = shape.seq_k;
  args.pattern = pattern;
  return args;
}

}  // namespace sjit::tuning

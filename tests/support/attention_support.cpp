#include "support/attention_support.h"

#include <catch2/catch.hpp>

#include <algorithm>

#include "support/test_support.h"

namespace sjit::test {

reference::AttentionProblem reference_problem(const AttentionSpec& spec, std::int64_t batch, std::int64_t heads_q,
                                              std::int64_t heads_kv, std::int64_t seq_q, std::int64_t seq_k,
                                              const BlockPattern* pattern) {
  reference::AttentionProblem p;
  p.batch = batch, p.heads_q = heads_q, p.heads_kv = heads_kv, p.seq_q = seq_q, p.seq_k = seq_k;
  p.head_dim = spec.head_dim;
  p.causal = spec.causal != Causal::none;
  p.causal_bottom_right = spec.causal == Causal::bottom_right;
  if (pattern != nullptr) {
    const int bs = pattern->block_size();
    p.filter = [pattern, bs](std::int64_t head, std::int64_t i, std::int64_t j) {
      return pattern->active(pattern->heads() == 1 ? 0 : int(head), i / bs, j / bs);
    };
  }
  return p;
}

DeviceBuffer upload(DType dtype, const std::vector<float>& values) {
  const auto bytes = to_bytes(dtype, values);
  DeviceBuffer buffer(std::max<std::size_t>(bytes.size(), 16));
  buffer.upload(bytes.data(), bytes.size());
  return buffer;
}

AttentionSpec spec_of(int d, DType dtype, Causal causal, Sparsity sparsity, int block) {
  AttentionSpec s;
  s.head_dim = d, s.dtype = dtype, s.causal = causal, s.sparsity = sparsity, s.block_size = block;
  return s;
}

bool on_hopper(const char* what) {
  const DeviceInfo device = current_device();
  const bool hopper = device.cc_major == 9 && device.cc_minor == 0;
  if (!hopper) WARN(what << " not tested: " << device.name << " is not compute capability 9.0");
  return hopper;
}

}  // namespace sjit::test

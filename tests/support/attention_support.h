// Shared by the attention GPU tests: the reference problem of a GPU call, and device uploads.
#pragma once

#include <vector>

#include "sparsejit/attention.h"
#include "sparsejit/attention_reference.h"

namespace sjit::test {

// The float64 reference's description of the attention a spec computes on these shapes, with the
// pattern (if any) expanded into its element-wise key filter.
reference::AttentionProblem reference_problem(const AttentionSpec& spec, std::int64_t batch, std::int64_t heads_q,
                                              std::int64_t heads_kv, std::int64_t seq_q, std::int64_t seq_k,
                                              const BlockPattern* pattern);

// A spec from the fields the GPU tests vary (the others keep their defaults: forward, not deterministic).
AttentionSpec spec_of(int d, DType dtype, Causal causal, Sparsity sparsity = Sparsity::dense, int block = 0);

// Whether the current device is compute capability 9.0, where the Hopper (wgmma) kernels run; elsewhere
// a warning in the report naming `what` was not tested, so that a test checking nothing says so.
bool on_hopper(const char* what);

// A device buffer holding `values` as `dtype` (at least 16 bytes, so that empty tensors have an address).
DeviceBuffer upload(DType dtype, const std::vector<float>& values);

}  // namespace sjit::test

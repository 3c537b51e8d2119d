// The copy descriptors (CUtensorMap) of the Hopper kernels, whose tiles arrive by bulk tensor copies
// (templates/sparsejit/tma.cuh).
#pragma once

#include "sparsejit/attention.h"
#include "templates/sparsejit/attention_params.cuh"

namespace sjit::attention {

// Q, K, V and, with `output` (the kernels that store O by bulk copies), O of checked arguments as 4-d
// tensors [B, H, S, D] (any strides), in boxes of 64 columns x block_m rows (Q, O) or block_n rows
// (K, V) with the 128-byte swizzle; rows past S read as 0 (and are not written).
// Throws DriverError if the driver refuses a map.
sjit_kernels::AttentionForwardTensorMaps forward_tensor_maps(const AttentionForwardArgs& args, DType dtype,
                                                             int head_dim, int block_m, int block_n, bool output);

// Q and dO in boxes of `cols` rows (the query tiles), K and V of `rows` rows (the key tile), for the
// dK/dV pass (the deterministic dQ pass passes its key tile's rows as `rows` and its query tile's as
// `cols`); with atomic dQ also the fp32 accumulator [B, Hq, Sq, head_dim] (contiguous), which the
// pass adds its dQ tiles to in boxes of 32 columns x `cols` rows. Where the dK/dV pass packs its
// tiles from query runs of `run_cols` < `cols` rows, the same three again in boxes of a run's rows.
sjit_kernels::AttentionBackwardTensorMaps backward_tensor_maps(const AttentionBackwardArgs& args, DType dtype,
                                                               int head_dim, int rows, int cols,
                                                               const float* dq_accum, int run_cols);

}  // namespace sjit::attention

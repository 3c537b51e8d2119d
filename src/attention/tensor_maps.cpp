#include "attention/tensor_maps.h"

#include <algorithm>

#include "runtime/driver.h"

namespace sjit::attention {
namespace {

// The driver declares 128-byte alignment, but encodes into (and the copy engine reads) any 64-byte
// aligned map, the alignment the kernel parameter has.
static_assert(sizeof(CUtensorMap) == sizeof(sjit_kernels::TensorMap) && alignof(sjit_kernels::TensorMap) == 64,
              "the kernels' TensorMap must have the driver's CUtensorMap layout");

// A [B, H, S, head_dim] tensor read (or added to) in 128-byte-swizzled boxes one swizzle atom wide:
// 128 bytes of a row (64 bf16 or f16, 32 fp32) x box_rows rows.
sjit_kernels::TensorMap tensor_map(const void* base, CUtensorMapDataType type, int element_bytes, int head_dim,
                                   std::int64_t batch, std::int64_t heads, std::int64_t seq, const Strides& strides,
                                   int box_rows) {
  // Extents must be positive: an empty key sequence still gets a valid map (no CTA reads it).
  const cuuint64_t extent[4] = {cuuint64_t(head_dim), cuuint64_t(std::max<std::int64_t>(seq, 1)),
                                cuuint64_t(heads), cuuint64_t(batch)};
  const cuuint64_t stride_bytes[3] = {cuuint64_t(strides.row * element_bytes), cuuint64_t(strides.head * element_bytes),
                                      cuuint64_t(strides.batch * element_bytes)};
  const cuuint32_t box[4] = {cuuint32_t(128 / element_bytes), cuuint32_t(box_rows), 1, 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  sjit_kernels::TensorMap map{};
  SJIT_CU(runtime::driver().cuTensorMapEncodeTiled(
      reinterpret_cast<CUtensorMap*>(&map), type, 4, const_cast<void*>(base), extent, stride_bytes, box, element_strides,
      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
  return map;
}

// Q, K, V, dO: the wgmma path takes bf16 and f16.
sjit_kernels::TensorMap tensor_map(const void* base, DType dtype, int head_dim, std::int64_t batch,
                                   std::int64_t heads, std::int64_t seq, const Strides& strides, int box_rows) {
  return tensor_map(base, dtype == DType::bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2,
                    head_dim, batch, heads, seq, strides, box_rows);
}

}  // namespace

sjit_kernels::AttentionForwardTensorMaps forward_tensor_maps(const AttentionForwardArgs& a, DType dtype,
                                                             int head_dim, int block_m, int block_n, bool output) {
  sjit_kernels::AttentionForwardTensorMaps maps{
      tensor_map(a.q, dtype, head_dim, a.batch, a.heads_q, a.seq_q, a.q_strides, block_m),
      tensor_map(a.k, dtype, head_dim, a.batch, a.heads_kv, a.seq_k, a.k_strides, block_n),
      tensor_map(a.v, dtype, head_dim, a.batch, a.heads_kv, a.seq_k, a.v_strides, block_n),
      {}};
  if (output) maps.o = tensor_map(a.o, dtype, head_dim, a.batch, a.heads_q, a.seq_q, a.o_strides, block_m);
  return maps;
}

sjit_kernels::AttentionBackwardTensorMaps backward_tensor_maps(const AttentionBackwardArgs& a, DType dtype,
                                                               int head_dim, int rows, int cols, const float* dq_accum,
                                                               int run_cols) {
  sjit_kernels::AttentionBackwardTensorMaps maps{};
  maps.k = tensor_map(a.k, dtype, head_dim, a.batch, a.heads_kv, a.seq_k, a.k_strides, rows);
  maps.v = tensor_map(a.v, dtype, head_dim, a.batch, a.heads_kv, a.seq_k, a.v_strides, rows);
  auto query_side = [&](int box_rows, sjit_kernels::TensorMap& q, sjit_kernels::TensorMap& d_o,
                        sjit_kernels::TensorMap& accum) {
    q = tensor_map(a.q, dtype, head_dim, a.batch, a.heads_q, a.seq_q, a.q_strides, box_rows);
    d_o = tensor_map(a.d_o, dtype, head_dim, a.batch, a.heads_q, a.seq_q, a.do_strides, box_rows);
    // A warpgroup's dQ tile is 64 queries at most (128-query tiles at d = 64: one half each).
    if (dq_accum != nullptr)
      accum = tensor_map(dq_accum, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, head_dim, a.batch, a.heads_q, a.seq_q,
                         Strides::bhsd(a.heads_q, a.seq_q, head_dim), std::min(box_rows, 64));
  };
  query_side(cols, maps.q, maps.d_o, maps.dq_accum);
  if (run_cols < cols) query_side(run_cols, maps.q_runs, maps.d_o_runs, maps.dq_accum_runs);
  return maps;
}

}  // namespace sjit::attention

// How the generated units spell host values in CUDA C++: element types and normalizer kinds.
#pragma once

#include <string_view>

#include "sparsejit/dtype.h"
#include "sparsejit/rownorm_spec.h"

namespace sjit::codegen {

inline std::string_view cuda_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return "float";
    case DType::f16: return "__half";
    case DType::bf16: return "__nv_bfloat16";
  }
  return "?";
}

inline int kind_id(NormKind kind) {  // sjit_kernels::NormKindId
  switch (kind) {
    case NormKind::softmax: return 0;
    case NormKind::sparsemax: return 1;
    case NormKind::entmax: return 2;
  }
  return -1;
}

}  // namespace sjit::codegen

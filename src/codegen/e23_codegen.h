// The generated unit of an E23 kernel: an include and the Cfg struct.
#pragma once

#include <string>

#include "codegen/kernel_source.h"
#include "sparsejit/e23_spec.h"

namespace sjit::codegen {

// Threads per CTA of every E23 kernel: 8 warps split a product tile's K and a tape item's slots.
inline constexpr int kE23Threads = 256;

std::string e23_kernel_key(const E23Spec& spec);  // "e23:...|pass=fwd"
KernelSource e23_source(const E23Spec& spec);
std::string e23_backward_kernel_key(const E23Spec& spec);  // "e23:...|pass=bwd"
KernelSource e23_backward_source(const E23Spec& spec);
// Dynamic shared memory of the forward kernel (mirrors E23Traits::shared_floats in e23_forward.cuh).
int e23_forward_shared_bytes(const E23Spec& spec);
// Dynamic shared memory of the backward kernel (mirrors E23BackwardTraits::shared_floats).
int e23_backward_shared_bytes(const E23Spec& spec);
// Whether the products run on tensor cores (bf16 and f16) or on FMAs (f32).
bool e23_uses_tensor_cores(const E23Spec& spec);

}  // namespace sjit::codegen

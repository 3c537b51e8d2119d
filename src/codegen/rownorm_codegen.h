#pragma once

#include "codegen/kernel_source.h"
#include "sparsejit/rownorm.h"

namespace sjit::codegen {

// The unit for a canonical spec and a resolved config: includes the template, defines Cfg, names
// the kernel. Nothing of the kernel's logic is generated.
KernelSource rownorm_source(const RowNormSpec& spec, const RowNormConfig& config);

// spec key text | config key text: the kernel's name in every cache.
std::string rownorm_kernel_key(const RowNormSpec& spec, const RowNormConfig& config);

}  // namespace sjit::codegen

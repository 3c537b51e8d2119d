// From a kernel key text ("spec" or "spec|config") to the unit that builds it, for any op.
#pragma once

#include <string_view>

#include "codegen/kernel_source.h"

namespace sjit::ops {

// Throws InvalidSpec (or InvalidArgument for a bad config) naming what is wrong.
codegen::KernelSource source_for_key(std::string_view kernel_key);

}  // namespace sjit::ops

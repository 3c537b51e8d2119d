// Checks of E23 launch arguments: every error names the argument, its value and what is allowed.
#pragma once

#include <cstddef>

#include "sparsejit/e23.h"

namespace sjit::e23 {

// Byte offsets of the workspace's parts for `batch` rows (each part 256-byte aligned).
struct WorkspaceLayout {
  std::size_t barrier = 0, h = 0, z = 0, v = 0, w = 0, m = 0, b = 0, total = 0;
};
WorkspaceLayout workspace_layout(const E23Spec& spec, std::int64_t batch);

// Throws InvalidArgument for a bad size, a missing or misaligned pointer, an output overlapping an
// input, or sizes that disagree with the spec.
void check_forward_args(const E23Spec& spec, const E23ForwardArgs& args);

}  // namespace sjit::e23

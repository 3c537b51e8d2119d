// Turns the marks of a profiled E23 launch (E23ForwardParams::profile, E23BackwardParams::profile) into
// per-step spans.
#pragma once

#include <cstdint>
#include <vector>

#include "sparsejit/e23.h"

namespace sjit::e23 {

// Forward. marks: [grid, steps, kE23Marks, 2] words (clock64, global ns) as the kernel wrote them, zero
// where a CTA did not reach a point. CTA c counts as a tape CTA when c < batch (it owns tape item c).
std::vector<E23ProfileSpan> summarize_profile(const std::vector<unsigned long long>& marks, int grid,
                                              std::int64_t batch, std::int64_t steps);

// Backward. marks: [grid, steps + 1, kE23BackwardMarks, 2] words; step slot `steps` holds the launch's
// own points (E23BackwardLaunchMark), reported with role "launch".
std::vector<E23ProfileSpan> summarize_backward_profile(const std::vector<unsigned long long>& marks, int grid,
                                                       std::int64_t batch, std::int64_t steps);

}  // namespace sjit::e23

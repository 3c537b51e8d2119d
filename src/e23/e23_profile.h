// Turns the marks of a profiled E23 forward launch (E23ForwardParams::profile) into per-step spans.
#pragma once

#include <cstdint>
#include <vector>

#include "sparsejit/e23.h"

namespace sjit::e23 {

// marks: [grid, steps, kE23Marks, 2] words (clock64, global ns) as the kernel wrote them, zero where a
// CTA did not reach a point. CTA c counts as a tape CTA when c < batch (it owns tape item c).
std::vector<E23ProfileSpan> summarize_profile(const std::vector<unsigned long long>& marks, int grid,
                                              std::int64_t batch, std::int64_t steps);

}  // namespace sjit::e23

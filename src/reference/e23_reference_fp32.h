// The E23 reference's arithmetic in fp32: the same code as e23_reference.h's float64 oracle, every state,
// product and sum held in float (the normalizers of the fp32 scores computed in float64 and rounded once).
// Not an oracle: the GPU tests run it on a draw to see how far an honest fp32 computation of that draw
// lands from the float64 one, and replace draws where that is near the tolerance (the cell's gain can
// carry a few roundings to percents of a 64-step gradient, docs/e23.md "Tests").
#pragma once

#include "sparsejit/e23_reference.h"

namespace sjit::reference {

E23Sequence e23_forward_fp32(const E23Spec& spec, std::int64_t batch, std::int64_t steps, std::span<const double> u,
                             std::span<const double> h0, std::span<const double> m0, const E23Weights& w);

E23Gradients e23_backward_fp32(const E23Spec& spec, std::int64_t batch, std::int64_t steps, std::span<const double> u,
                               std::span<const double> h0, std::span<const double> m0, const E23Weights& w,
                               std::span<const double> dy, std::span<const double> dh_final,
                               std::span<const double> dm_final);

}  // namespace sjit::reference

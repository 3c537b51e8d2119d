// The attention reference's arithmetic in fp32: the same code as attention_reference.h's float64
// oracle, every score, weight and sum held in float. Not an oracle: the GPU tests check the kernels
// against it as well as against the float64 one (issue 6 asks for both), and a CPU test cross-checks
// the two within 1e-3.
#pragma once

#include "sparsejit/attention_reference.h"

namespace sjit::reference {

AttentionOutput attention_forward_fp32(const AttentionProblem& p, std::span<const double> q,
                                       std::span<const double> k, std::span<const double> v);

AttentionGradients attention_backward_fp32(const AttentionProblem& p, std::span<const double> q,
                                           std::span<const double> k, std::span<const double> v,
                                           std::span<const double> d_o);

}  // namespace sjit::reference

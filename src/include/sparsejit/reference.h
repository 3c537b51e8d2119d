// Float64 CPU references, written from the mathematical definitions. They are the oracle for every
// GPU test and for `sjit demo`; they are slow on purpose (sorting, bisection to double precision).
#pragma once

#include <span>
#include <vector>

#include "sparsejit/rownorm_spec.h"

namespace sjit::reference {

// y = normalize(z / temperature) for one row, by spec.kind and spec.alpha (spec.n and dtype are ignored).
// Edge semantics, shared with the GPU kernels:
//  - any NaN in the row gives a row of NaN;
//  - +inf entries share the mass uniformly (the limit of the definition), every finite entry gets 0;
//  - -inf entries get 0; a row of only -inf is undefined and gives NaN;
//  - an empty row gives an empty result.
std::vector<double> rownorm_forward(const RowNormSpec& spec, std::span<const double> z, double temperature = 1.0);

// dz = J^T dy for one row, J the Jacobian of rownorm_forward at the z that produced y (symmetric).
// With s_i = y_i^(2 - alpha) on the support (softmax: s = y; sparsemax: s = 1 on the support) and 0 off it:
//   dz = (s * dy - s * <s, dy> / sum(s)) / temperature          (Peters, Niculae & Martins 2019, Prop. 2)
std::vector<double> rownorm_backward(const RowNormSpec& spec, std::span<const double> y,
                                     std::span<const double> dy, double temperature = 1.0);

// The threshold tau of the forward pass, on the scaled scores x = (alpha - 1) z / temperature
// (softmax: x = z / temperature and y = exp(x - tau), i.e. tau = logsumexp(x)).
double threshold(const RowNormSpec& spec, std::span<const double> z, double temperature = 1.0);

// Independent algorithms, for cross-checks in the property tests.
std::vector<double> sparsemax_by_sort(std::span<const double> z);       // Martins & Astudillo 2016, Alg. 1
std::vector<double> entmax15_by_sort(std::span<const double> z);        // Peters et al. 2019, Alg. 2 (z/2 scaling)
std::vector<double> entmax_by_bisection(std::span<const double> z, double alpha);  // any alpha > 1
std::vector<double> softmax(std::span<const double> z);

}  // namespace sjit::reference

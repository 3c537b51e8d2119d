// Argument checks shared by the normalizer launches: every refusal names the argument and the value.
#pragma once

#include <cstdint>

#include "sparsejit/rownorm.h"

namespace sjit::ops {

// A [rows, n] matrix argument as the checks see it.
struct MatrixArg {
  const char* name;
  const void* ptr;
  std::int64_t ld;  // already defaulted: 0 became n
};

// Null pointers, negative rows, ld < n, element misalignment, partial overlap of an input and an
// output (exact aliasing is allowed: the kernels work in place). Throws InvalidArgument.
void check_matrices(const RowNormSpec& spec, std::int64_t rows, const MatrixArg* inputs, int n_inputs,
                    const MatrixArg& output);
void check_temperature(float temperature);

// The widest packet (in elements, power of two, <= 16 bytes) every matrix's base and row stride allow.
int widest_vec(const RowNormSpec& spec, const MatrixArg* matrices, int count);

// Throws if a config's vec needs more alignment than a matrix has, naming the matrix.
void check_vec_alignment(const RowNormSpec& spec, int vec, const MatrixArg* matrices, int count);

}  // namespace sjit::ops

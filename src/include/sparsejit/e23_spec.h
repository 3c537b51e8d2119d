// The E23 dual-memory Elman cell (docs/e23.md): what a kernel is specialized for.
#pragma once

#include <string>
#include <string_view>

#include "sparsejit/dtype.h"
#include "sparsejit/rownorm_spec.h"

namespace sjit {

// One step of the cell, per batch row, with working state h in R^dim and tape M in R^{n_slots x dim}:
//   read   a = normalize(scale * M h),  v = M^T a
//   update h' = tanh(W_h h + u_t + v)
//   write  b = normalize(scale * M h'), M'_i = (1 - b_i) M_i + b_i W_w h'
// normalize is the row normalizer named by kind and alpha (rownorm_spec.h), at temperature 1.
struct E23Spec {
  NormKind kind = NormKind::softmax;
  float alpha = 1.0f;        // meaningful for entmax only; canonical specs hold 1 for softmax, 2 for sparsemax
  int n_slots = 0;           // tape slots N, baked into the kernel (1 .. kMaxSlots)
  int dim = 0;               // state width D, a multiple of kDimMultiple up to kMaxDim
  DType dtype = DType::f32;  // element type of u, h, M, the weights and y
  float scale = 0.0f;        // score scale s; 0 means the default 1/sqrt(dim)

  static constexpr int kMaxSlots = 256;
  static constexpr int kMaxDim = 4096;
  static constexpr int kDimMultiple = 8;  // the kernels move 8 elements (16 bytes of bf16) at a time

  friend bool operator==(const E23Spec&, const E23Spec&) = default;
};

// A checked, canonical spec: e23_spec(NormKind::entmax, 1.5f, 8, 512, DType::bf16).
E23Spec e23_spec(NormKind kind, float alpha, int n_slots, int dim, DType dtype = DType::f32, float scale = 0.0f);

// The float nearest 1/sqrt(dim): what scale = 0 stands for.
float default_scale(int dim);

// The scale a spec means (its scale, or default_scale(dim) when that is 0).
float effective_scale(const E23Spec& spec);

// Returns the canonical form after checking every field; throws InvalidSpec naming the field, its
// value and what is allowed. Canonical: entmax with alpha 1 or 2 becomes softmax or sparsemax, and a
// scale equal to default_scale(dim) becomes 0, so each function has one spec.
E23Spec canonical(const E23Spec& spec);

// Canonical key text, e.g. "e23:kind=entmax,alpha=1.5,n_slots=8,dim=512,dtype=bf16".
// Same grammar as every spec (docs/specs.md); fields in any order when parsing, printed in the order
// above; alpha only for kind=entmax; dtype defaults to f32; scale is printed only when not the default.
std::string key(const E23Spec& spec);
E23Spec parse_e23(std::string_view text);  // inverse of key(); throws InvalidSpec naming the field

}  // namespace sjit

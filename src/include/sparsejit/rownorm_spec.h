// The row normalizers of the entmax family: what a kernel is specialized for.
#pragma once

#include <string>
#include <string_view>

#include "sparsejit/dtype.h"

namespace sjit {

// softmax:   y = exp(z - tau),                       alpha = 1
// sparsemax: y = [z - tau]_+,                        alpha = 2   (Martins & Astudillo 2016)
// entmax:    y = [(alpha - 1) z - tau]_+^(1/(alpha-1)), alpha > 1 (Peters, Niculae & Martins 2019)
// with tau the unique threshold that makes y sum to 1. alpha = 1.5 is solved in closed form on the
// support (the z/2 scaling of the reference `entmax` package's entmax15); other alphas by safeguarded Newton.
enum class NormKind { softmax, sparsemax, entmax };

enum class Pass { forward, backward };

struct RowNormSpec {
  NormKind kind = NormKind::softmax;
  float alpha = 1.0f;       // meaningful for entmax only; canonical specs hold 1 for softmax, 2 for sparsemax
  int n = 0;                // row length, baked into the kernel (1 .. kMaxN)
  DType dtype = DType::f32; // input and output element type
  Pass pass = Pass::forward;

  static constexpr int kMaxN = 16384;

  friend bool operator==(const RowNormSpec&, const RowNormSpec&) = default;
};

// Convenience constructors. entmax(1) gives softmax and entmax(2) gives sparsemax: one spec per function.
RowNormSpec softmax_spec(int n, DType dtype = DType::f32, Pass pass = Pass::forward);
RowNormSpec sparsemax_spec(int n, DType dtype = DType::f32, Pass pass = Pass::forward);
RowNormSpec entmax_spec(float alpha, int n, DType dtype = DType::f32, Pass pass = Pass::forward);

// Returns the canonical form (entmax with alpha 1 or 2 becomes softmax or sparsemax) after checking
// every field; throws InvalidSpec naming the field, its value and what is allowed.
RowNormSpec canonical(const RowNormSpec& spec);

// Canonical key text, e.g. "rownorm:kind=entmax,alpha=1.5,n=64,dtype=bf16,pass=fwd".
// Grammar (docs/specs.md): op ':' field '=' value (',' field '=' value)*; fields in any order when
// parsing, printed in the order above; alpha only for kind=entmax; pass defaults to fwd.
std::string key(const RowNormSpec& spec);
RowNormSpec parse_rownorm(std::string_view text);  // inverse of key(); throws InvalidSpec naming the field

std::string_view name(NormKind kind);
std::string_view name(Pass pass);

}  // namespace sjit

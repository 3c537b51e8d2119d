#include "sparsejit/e23_spec.h"

#include <cmath>
#include <fmt/format.h>

#include "sparsejit/error.h"
#include "spec/key_text.h"

namespace sjit {

float default_scale(int dim) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(dim))); }

float effective_scale(const E23Spec& spec) { return spec.scale == 0.0f ? default_scale(spec.dim) : spec.scale; }

E23Spec canonical(const E23Spec& in) {
  E23Spec s = in;
  if (s.n_slots < 1 || s.n_slots > E23Spec::kMaxSlots)
    throw InvalidSpec(fmt::format("e23: n_slots = {} is out of range: the tape holds 1 to {} slots", s.n_slots,
                                  E23Spec::kMaxSlots));
  if (s.dim < E23Spec::kDimMultiple || s.dim > E23Spec::kMaxDim || s.dim % E23Spec::kDimMultiple != 0)
    throw InvalidSpec(fmt::format("e23: dim = {} is not allowed: dim must be a multiple of {} from {} to {}", s.dim,
                                  E23Spec::kDimMultiple, E23Spec::kDimMultiple, E23Spec::kMaxDim));
  switch (s.kind) {
    case NormKind::softmax: s.alpha = 1.0f; break;
    case NormKind::sparsemax: s.alpha = 2.0f; break;
    case NormKind::entmax:
      if (!std::isfinite(s.alpha) || s.alpha < 1.0f || s.alpha > 16.0f)
        throw InvalidSpec(fmt::format("e23: alpha = {} is out of range: entmax takes 1 <= alpha <= 16 "
                                      "(1 is softmax, 2 is sparsemax)", s.alpha));
      if (s.alpha == 1.0f) s.kind = NormKind::softmax;
      if (s.alpha == 2.0f) s.kind = NormKind::sparsemax;
      break;
    default:
      throw InvalidSpec(fmt::format("e23: kind = {} is not a NormKind: use softmax, sparsemax or entmax",
                                    static_cast<int>(s.kind)));
  }
  if (!std::isfinite(s.scale) || s.scale < 0.0f)
    throw InvalidSpec(fmt::format("e23: scale = {} is not allowed: use a finite scale > 0, or 0 for the "
                                  "default 1/sqrt(dim)", s.scale));
  if (s.scale == default_scale(s.dim)) s.scale = 0.0f;
  return s;
}

E23Spec e23_spec(NormKind kind, float alpha, int n_slots, int dim, DType dtype, float scale) {
  return canonical(E23Spec{kind, alpha, n_slots, dim, dtype, scale});
}

std::string key(const E23Spec& in) {
  const E23Spec s = canonical(in);
  const std::string alpha = s.kind == NormKind::entmax ? fmt::format(",alpha={}", spec::format_float(s.alpha)) : "";
  const std::string scale = s.scale != 0.0f ? fmt::format(",scale={}", spec::format_float(s.scale)) : "";
  return fmt::format("e23:kind={}{},n_slots={},dim={},dtype={}{}", name(s.kind), alpha, s.n_slots, s.dim,
                     name(s.dtype), scale);
}

E23Spec parse_e23(std::string_view text) {
  spec::KeyText kt = spec::split_key(text);
  if (kt.op != "e23") throw InvalidSpec(fmt::format("spec '{}' is not an e23 spec (op '{}')", text, kt.op));
  E23Spec s;
  const std::string kind = spec::take(kt, "kind");
  if (kind == "softmax") s.kind = NormKind::softmax;
  else if (kind == "sparsemax") s.kind = NormKind::sparsemax;
  else if (kind == "entmax") s.kind = NormKind::entmax;
  else throw InvalidSpec(fmt::format("e23: kind '{}' is unknown: use softmax, sparsemax or entmax", kind));
  if (s.kind == NormKind::entmax) s.alpha = spec::parse_float("alpha", spec::take(kt, "alpha"));
  s.n_slots = spec::parse_int("n_slots", spec::take(kt, "n_slots"));
  s.dim = spec::parse_int("dim", spec::take(kt, "dim"));
  s.dtype = parse_dtype(spec::take_or(kt, "dtype", "f32"));
  s.scale = spec::parse_float("scale", spec::take_or(kt, "scale", "0"));
  spec::reject_leftovers(kt, "kind, alpha (entmax only), n_slots, dim, dtype, scale");
  return canonical(s);
}

}  // namespace sjit

#include "sparsejit/rownorm_spec.h"

#include <cmath>
#include <fmt/format.h>

#include "sparsejit/error.h"
#include "spec/key_text.h"

namespace sjit {

std::string_view name(NormKind kind) {
  switch (kind) {
    case NormKind::softmax: return "softmax";
    case NormKind::sparsemax: return "sparsemax";
    case NormKind::entmax: return "entmax";
  }
  return "?";
}

std::string_view name(Pass pass) { return pass == Pass::forward ? "fwd" : "bwd"; }

RowNormSpec canonical(const RowNormSpec& in) {
  RowNormSpec s = in;
  if (s.n < 1 || s.n > RowNormSpec::kMaxN)
    throw InvalidSpec(fmt::format("rownorm: n = {} is out of range: rows hold 1 to {} elements", s.n, RowNormSpec::kMaxN));
  switch (s.kind) {
    case NormKind::softmax: s.alpha = 1.0f; break;
    case NormKind::sparsemax: s.alpha = 2.0f; break;
    case NormKind::entmax:
      if (!std::isfinite(s.alpha) || s.alpha < 1.0f || s.alpha > 16.0f)
        throw InvalidSpec(fmt::format("rownorm: alpha = {} is out of range: entmax takes 1 <= alpha <= 16 "
                                      "(1 is softmax, 2 is sparsemax)", s.alpha));
      if (s.alpha == 1.0f) s.kind = NormKind::softmax;
      if (s.alpha == 2.0f) s.kind = NormKind::sparsemax;
      break;
  }
  return s;
}

RowNormSpec softmax_spec(int n, DType dtype, Pass pass) { return canonical({NormKind::softmax, 1.0f, n, dtype, pass}); }
RowNormSpec sparsemax_spec(int n, DType dtype, Pass pass) { return canonical({NormKind::sparsemax, 2.0f, n, dtype, pass}); }
RowNormSpec entmax_spec(float alpha, int n, DType dtype, Pass pass) { return canonical({NormKind::entmax, alpha, n, dtype, pass}); }

std::string key(const RowNormSpec& in) {
  const RowNormSpec s = canonical(in);
  std::string alpha = s.kind == NormKind::entmax ? fmt::format(",alpha={}", spec::format_float(s.alpha)) : "";
  return fmt::format("rownorm:kind={}{},n={},dtype={},pass={}", name(s.kind), alpha, s.n, name(s.dtype), name(s.pass));
}

RowNormSpec parse_rownorm(std::string_view text) {
  spec::KeyText kt = spec::split_key(text);
  if (kt.op != "rownorm") throw InvalidSpec(fmt::format("spec '{}' is not a rownorm spec (op '{}')", text, kt.op));
  RowNormSpec s;
  const std::string kind = spec::take(kt, "kind");
  if (kind == "softmax") s.kind = NormKind::softmax;
  else if (kind == "sparsemax") s.kind = NormKind::sparsemax;
  else if (kind == "entmax") s.kind = NormKind::entmax;
  else throw InvalidSpec(fmt::format("rownorm: kind '{}' is unknown: use softmax, sparsemax or entmax", kind));
  if (s.kind == NormKind::entmax) s.alpha = spec::parse_float("alpha", spec::take(kt, "alpha"));
  s.n = spec::parse_int("n", spec::take(kt, "n"));
  s.dtype = parse_dtype(spec::take_or(kt, "dtype", "f32"));
  const std::string pass = spec::take_or(kt, "pass", "fwd");
  if (pass == "fwd") s.pass = Pass::forward;
  else if (pass == "bwd") s.pass = Pass::backward;
  else throw InvalidSpec(fmt::format("rownorm: pass '{}' is unknown: use fwd or bwd", pass));
  spec::reject_leftovers(kt, "kind, alpha (entmax only), n, dtype, pass");
  return canonical(s);
}

}  // namespace sjit

#include "sparsejit/attention_spec.h"

#include <fmt/format.h>

#include <algorithm>

#include "sparsejit/error.h"
#include "spec/key_text.h"

namespace sjit {

std::string_view name(Causal causal) {
  switch (causal) {
    case Causal::none: return "none";
    case Causal::top_left: return "tl";
    case Causal::bottom_right: return "br";
  }
  return "?";
}

std::string_view name(Sparsity sparsity) {
  switch (sparsity) {
    case Sparsity::dense: return "dense";
    case Sparsity::block_sparse: return "bsr";
    case Sparsity::baked: return "baked";
  }
  return "?";
}

AttentionSpec canonical(const AttentionSpec& in) {
  AttentionSpec s = in;
  if (s.head_dim != 32 && s.head_dim != 64 && s.head_dim != 96 && s.head_dim != 128 && s.head_dim != 256)
    throw InvalidSpec(fmt::format("attention: head_dim = {} is not supported: use 32, 64, 96, 128 or 256", s.head_dim));
  if (s.dtype != DType::f16 && s.dtype != DType::bf16)
    throw InvalidSpec(fmt::format("attention: dtype = {} is not supported: attention runs on tensor cores in f16 or bf16",
                                  name(s.dtype)));
  if (s.sparsity == Sparsity::dense) {
    s.block_size = 0;
    s.pattern_digest = 0;
  } else {
    if (s.block_size != 16 && s.block_size != 32 && s.block_size != 64 && s.block_size != 128)
      throw InvalidSpec(fmt::format("attention: block_size = {} is not supported for sparsity={}: use 16, 32, 64 or 128",
                                    s.block_size, name(s.sparsity)));
    if (s.sparsity == Sparsity::block_sparse) s.pattern_digest = 0;
  }
  return s;
}

std::string key(const AttentionSpec& in) {
  const AttentionSpec s = canonical(in);
  std::string text = fmt::format("attention:d={},dtype={},causal={},sparsity={}", s.head_dim, name(s.dtype),
                                 name(s.causal), name(s.sparsity));
  if (s.sparsity != Sparsity::dense) text += fmt::format(",block={}", s.block_size);
  text += fmt::format(",pass={}", name(s.pass));
  if (s.deterministic) text += ",det=1";
  if (s.sparsity == Sparsity::baked) text += fmt::format(",pattern={:016x}", s.pattern_digest);
  return text;
}

AttentionSpec parse_attention(std::string_view text) {
  spec::KeyText kt = spec::split_key(text);
  if (kt.op != "attention") throw InvalidSpec(fmt::format("spec '{}' is not an attention spec (op '{}')", text, kt.op));
  AttentionSpec s;
  s.head_dim = spec::parse_int("d", spec::take(kt, "d"));
  s.dtype = parse_dtype(spec::take_or(kt, "dtype", "bf16"));
  const std::string causal = spec::take_or(kt, "causal", "none");
  if (causal == "none") s.causal = Causal::none;
  else if (causal == "tl") s.causal = Causal::top_left;
  else if (causal == "br") s.causal = Causal::bottom_right;
  else throw InvalidSpec(fmt::format("attention: causal '{}' is unknown: use none, tl (top-left) or br (bottom-right)", causal));
  const std::string sparsity = spec::take_or(kt, "sparsity", "dense");
  if (sparsity == "dense") s.sparsity = Sparsity::dense;
  else if (sparsity == "bsr") s.sparsity = Sparsity::block_sparse;
  else if (sparsity == "baked") s.sparsity = Sparsity::baked;
  else throw InvalidSpec(fmt::format("attention: sparsity '{}' is unknown: use dense, bsr or baked", sparsity));
  if (s.sparsity != Sparsity::dense) s.block_size = spec::parse_int("block", spec::take(kt, "block"));
  const std::string pass = spec::take_or(kt, "pass", "fwd");
  if (pass == "fwd") s.pass = Pass::forward;
  else if (pass == "bwd") s.pass = Pass::backward;
  else throw InvalidSpec(fmt::format("attention: pass '{}' is unknown: use fwd or bwd", pass));
  const std::string det = spec::take_or(kt, "det", "0");
  if (det != "0" && det != "1")
    throw InvalidSpec(fmt::format("attention: det '{}' is not allowed: use 1 (deterministic backward) or 0", det));
  s.deterministic = det == "1";
  if (s.sparsity == Sparsity::baked) {
    const std::string digest = spec::take(kt, "pattern");
    // Exactly 16 hex digits: no sign, prefix or blanks, so that one kernel has one key text.
    const bool hex = digest.size() == 16 && std::all_of(digest.begin(), digest.end(), [](char c) {
      return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
    });
    if (!hex)
      throw InvalidSpec(fmt::format("attention: pattern '{}' is not a digest: 16 hexadecimal digits expected", digest));
    s.pattern_digest = std::stoull(digest, nullptr, 16);
  }
  spec::reject_leftovers(kt, "d, dtype, causal, sparsity, block (bsr and baked), pass, det, pattern (baked)");
  return canonical(s);
}

}  // namespace sjit

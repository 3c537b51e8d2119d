// sjit demo, attention: a dense causal forward, a block-sparse forward on a BigBird-like pattern, and
// that block-sparse attention's backward, each on fresh random bf16 inputs against the float64
// reference (sparsejit/attention_reference.h), with the bounds of tests/gpu/test_attention*_gpu.cpp.
#include <fmt/format.h>

#include <cmath>
#include <memory>

#include "demo.h"
#include "sparsejit/attention_reference.h"

namespace sjit::tool::demo {
namespace {

using Shape = AttentionCheckShape;

// The reference's view of `spec` on `shape`, the pattern expanded to its element-wise key filter.
reference::AttentionProblem reference_problem(const AttentionSpec& spec, const Shape& s, const BlockPattern* pattern) {
  reference::AttentionProblem p;
  p.batch = s.batch, p.heads_q = s.heads_q, p.heads_kv = s.heads_kv, p.seq_q = s.seq_q, p.seq_k = s.seq_k;
  p.head_dim = spec.head_dim;
  p.causal = spec.causal != Causal::none;
  p.causal_bottom_right = spec.causal == Causal::bottom_right;
  if (pattern != nullptr)
    p.filter = [pattern](std::int64_t head, std::int64_t i, std::int64_t j) {
      const int bs = pattern->block_size();
      return pattern->active(pattern->heads() == 1 ? 0 : int(head), i / bs, j / bs);
    };
  return p;
}

// The forward's kernel key as an Attention loads it: with a GPU from its config (which a tuning
// database may have chosen); without one, the default for `arch`.
std::string forward_key(const AttentionSpec& spec, bool gpu, const std::string& arch) {
  const AttentionSpec canon = canonical(spec);
  return gpu ? key(canon) + "|" + key(Attention(canon).config()) : attention_kernel_keys(canon, arch).front();
}

// The backward's kernel keys (pre-pass, dK/dV, dQ conversion; on sm_90a also the deterministic
// twin's three, whose dQ pass the backward may choose): attention_kernel_keys after the forward's.
std::vector<std::string> backward_keys(const AttentionSpec& spec, const std::string& arch) {
  std::vector<std::string> keys = attention_kernel_keys(spec, arch);
  keys.erase(keys.begin());
  return keys;
}

struct Inputs {
  Tensor q, k, v;
  AttentionForwardArgs args;
};

Inputs random_inputs(const AttentionSpec& spec, const Shape& s, std::mt19937_64& rng) {
  const std::int64_t q_elements = s.batch * s.heads_q * s.seq_q * spec.head_dim;
  const std::int64_t kv_elements = s.batch * s.heads_kv * s.seq_k * spec.head_dim;
  Inputs in{random_tensor(q_elements, spec.dtype, rng), random_tensor(kv_elements, spec.dtype, rng),
            random_tensor(kv_elements, spec.dtype, rng), {}};
  in.args.q = in.q.device.data(), in.args.k = in.k.device.data(), in.args.v = in.v.device.data();
  in.args.batch = s.batch, in.args.heads_q = s.heads_q, in.args.heads_kv = s.heads_kv;
  in.args.seq_q = s.seq_q, in.args.seq_k = s.seq_k;
  return in;
}

// The Attention a check runs: `spec` with `config`; a baked spec is built around `pattern`.
Attention attention_for(const AttentionSpec& spec, const BlockPattern* pattern, const AttentionConfig& config) {
  if (spec.sparsity == Sparsity::baked) return Attention(spec, *pattern, config);
  return Attention(spec, config);
}

// The GPU tests' bounds: o within atol + rtol |o| (bf16 2e-2 + 1e-2 |o|, f16 four times tighter); each of
// dq, dk, dv within tol (|largest entry| + |entry|) + 1e-5 (bf16 2.5e-2, f16 6e-3).
struct ForwardTolerance {
  double atol, rtol;
};
ForwardTolerance forward_tolerance(DType dtype) {
  return dtype == DType::bf16 ? ForwardTolerance{2e-2, 1e-2} : ForwardTolerance{5e-3, 2.5e-3};
}
double backward_tolerance(DType dtype) { return dtype == DType::bf16 ? 2.5e-2 : 6e-3; }

}  // namespace

std::string attention_bound(DType dtype, bool backward) {
  if (backward) return fmt::format("{} (max|d*| + |d*|)", compact(backward_tolerance(dtype)));
  const ForwardTolerance t = forward_tolerance(dtype);
  return fmt::format("{} + {} |o|", compact(t.atol), compact(t.rtol));
}

// o within forward_tolerance, lse within 2e-3 max(1, |lse|).
Outcome check_attention_forward(const AttentionSpec& spec, const Shape& s, const BlockPattern* pattern,
                                const AttentionConfig& config, std::mt19937_64& rng) {
  Inputs in = random_inputs(spec, s, rng);
  const std::size_t rows = std::size_t(s.batch * s.heads_q * s.seq_q), elements = rows * spec.head_dim;
  DeviceBuffer o = poisoned(elements * size_of(spec.dtype)), lse = poisoned(rows * 4);
  in.args.o = o.data(), in.args.lse = lse.as<float>(), in.args.pattern = pattern;
  attention_for(spec, pattern, config).forward(in.args);
  synchronize();
  const std::vector<float> got_o = download(o, spec.dtype, elements), got_lse = download(lse, DType::f32, rows);
  const auto want = reference::attention_forward(reference_problem(spec, s, pattern), in.q.values, in.k.values, in.v.values);

  const auto [atol, rtol] = forward_tolerance(spec.dtype);
  Outcome out;
  for (std::size_t i = 0; i < elements; ++i) out.add(std::abs(got_o[i] - want.o[i]), atol + rtol * std::abs(want.o[i]));
  for (std::size_t i = 0; i < rows; ++i) {
    if (std::isinf(want.lse[i])) out.add(std::isinf(got_lse[i]) && got_lse[i] < 0 ? 0 : INFINITY, 1);
    else out.add(std::abs(got_lse[i] - want.lse[i]), 2e-3 * std::max(1.0, std::abs(want.lse[i])));
  }
  return out;
}

// Each of dq, dk, dv within backward_tolerance (|largest entry| + |entry|) + 1e-5.
Outcome check_attention_backward(const AttentionSpec& spec, const Shape& s, const BlockPattern* pattern,
                                 const AttentionConfig& config, std::mt19937_64& rng) {
  Inputs in = random_inputs(spec, s, rng);
  const Tensor d_o = random_tensor(std::int64_t(in.q.values.size()), spec.dtype, rng);
  const std::size_t rows = std::size_t(s.batch * s.heads_q * s.seq_q), elements = rows * spec.head_dim;
  const std::size_t bytes = elements * size_of(spec.dtype), kv_bytes = in.k.values.size() * size_of(spec.dtype);
  DeviceBuffer o(bytes), lse(rows * 4), dq = poisoned(bytes), dk = poisoned(kv_bytes), dv = poisoned(kv_bytes);
  in.args.o = o.data(), in.args.lse = lse.as<float>(), in.args.pattern = pattern;
  Attention attention = attention_for(spec, pattern, config);
  attention.forward(in.args);
  AttentionBackwardArgs b;
  b.q = in.args.q, b.k = in.args.k, b.v = in.args.v, b.o = o.data(), b.lse = lse.as<float>(), b.d_o = d_o.device.data();
  b.dq = dq.data(), b.dk = dk.data(), b.dv = dv.data(), b.pattern = pattern;
  b.batch = s.batch, b.heads_q = s.heads_q, b.heads_kv = s.heads_kv, b.seq_q = s.seq_q, b.seq_k = s.seq_k;
  attention.backward(b);
  synchronize();
  const auto want = reference::attention_backward(reference_problem(spec, s, pattern), in.q.values, in.k.values,
                                                  in.v.values, d_o.values);

  const double tol = backward_tolerance(spec.dtype);
  Outcome out;
  for (const auto& [buffer, exact] : {std::pair{&dq, &want.dq}, std::pair{&dk, &want.dk}, std::pair{&dv, &want.dv}}) {
    const std::vector<float> got = download(*buffer, spec.dtype, exact->size());
    double largest = 0;
    for (double w : *exact) largest = std::max(largest, std::abs(w));
    for (std::size_t i = 0; i < exact->size(); ++i)
      out.add(std::abs(got[i] - (*exact)[i]), tol * largest + tol * std::abs((*exact)[i]) + 1e-5);
  }
  return out;
}

namespace {

std::string describe(const Shape& s, const BlockPattern* pattern) {
  std::string text = fmt::format("B{} H{} S{}", s.batch, s.heads_q, s.seq_q);
  if (pattern != nullptr) text += fmt::format(", bigbird {:.0f}% of blocks", 100 * pattern->stats().density);
  return text;
}

}  // namespace

std::vector<Case> attention_cases(bool gpu, const std::string& arch, std::mt19937_64& rng) {
  const Shape shape;
  AttentionSpec dense{.head_dim = 64, .dtype = DType::bf16, .causal = Causal::top_left};
  AttentionSpec sparse{.head_dim = 128, .dtype = DType::bf16, .sparsity = Sparsity::block_sparse, .block_size = 64};
  AttentionSpec sparse_backward = sparse;  // for its key text: an Attention runs both passes
  sparse_backward.pass = Pass::backward;
  // Local window 1, one global block, one random block a row: 5 of the 8 key blocks of most rows (a
  // pattern with every block active would run on the dense kernel instead).
  auto pattern = std::make_shared<const BlockPattern>(patterns::bigbird(64, shape.seq_q, shape.seq_k, 1, 1, 1, rng()));
  const std::string fwd_tolerance = attention_bound(DType::bf16, false);
  return {
      {key(canonical(dense)), "fwd " + describe(shape, nullptr), {forward_key(dense, gpu, arch)}, fwd_tolerance,
       [=, &rng] { return check_attention_forward(dense, shape, nullptr, {}, rng); }},
      {key(canonical(sparse)), "fwd " + describe(shape, pattern.get()), {forward_key(sparse, gpu, arch)},
       fwd_tolerance, [=, &rng] { return check_attention_forward(sparse, shape, pattern.get(), {}, rng); }},
      {key(canonical(sparse_backward)), "fwd+bwd " + describe(shape, pattern.get()), backward_keys(sparse, arch),
       attention_bound(DType::bf16, true), [=, &rng] { return check_attention_backward(sparse, shape, pattern.get(), {}, rng); }},
  };
}

}  // namespace sjit::tool::demo

#include "support/attention_run.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "support/attention_support.h"
#include "support/test_support.h"

namespace sjit::test {

std::string Problem::name() const {
  return fmt::format("{} B{} Hq{} Hkv{} Sq{} Sk{} density {}{}", key(spec), batch, heads_q, heads_kv, seq_q, seq_k,
                     density, per_head_pattern ? " per-head" : "");
}

Inputs random_inputs(const Problem& c, std::mt19937_64& rng) {
  const DType dt = c.spec.dtype;
  const int d = c.spec.head_dim;
  return {quantized(dt, random_rows(rng, c.batch * c.heads_q * c.seq_q, d, 1.0f)),
          quantized(dt, random_rows(rng, c.batch * c.heads_kv * c.seq_k, d, 1.0f)),
          quantized(dt, random_rows(rng, c.batch * c.heads_kv * c.seq_k, d, 1.0f)),
          quantized(dt, random_rows(rng, c.batch * c.heads_q * c.seq_q, d, 1.0f))};
}

std::vector<float> download(DType dtype, const DeviceBuffer& buffer, std::size_t elements) {
  std::vector<unsigned char> bytes(elements * size_of(dtype));
  buffer.download(bytes.data(), bytes.size());
  return from_bytes(dtype, bytes);
}

GpuRun::GpuRun(const Problem& problem, const Inputs& in, const BlockPattern* p)
    : c(problem),
      q_elems(std::size_t(c.batch * c.heads_q * c.seq_q) * std::size_t(c.spec.head_dim)),
      k_elems(std::size_t(c.batch * c.heads_kv * c.seq_k) * std::size_t(c.spec.head_dim)),
      q(upload(c.spec.dtype, in.q)), k(upload(c.spec.dtype, in.k)), v(upload(c.spec.dtype, in.v)),
      d_o(upload(c.spec.dtype, in.d_o)), o(std::max<std::size_t>(q_elems * 2, 16)),
      lse(std::max<std::size_t>(q_elems / std::size_t(c.spec.head_dim) * 4, 16)),
      dq(std::max<std::size_t>(q_elems * 2, 16)), dk(std::max<std::size_t>(k_elems * 2, 16)),
      dv(std::max<std::size_t>(k_elems * 2, 16)),
      pattern(c.spec.sparsity == Sparsity::block_sparse ? p : nullptr) {
  for (DeviceBuffer* b : {&dq, &dk, &dv}) b->fill_bytes(0xFF);
}

AttentionForwardArgs GpuRun::forward_args() const {
  AttentionForwardArgs f;
  f.q = q.data(), f.k = k.data(), f.v = v.data(), f.o = o.data(), f.lse = lse.as<float>();
  f.batch = c.batch, f.heads_q = c.heads_q, f.heads_kv = c.heads_kv, f.seq_q = c.seq_q, f.seq_k = c.seq_k;
  f.pattern = pattern;
  return f;
}

void GpuRun::reload(const Inputs& in) {
  for (auto [buffer, values] : {std::pair{&q, &in.q}, {&k, &in.k}, {&v, &in.v}, {&d_o, &in.d_o}}) {
    const std::vector<unsigned char> bytes = to_bytes(c.spec.dtype, *values);
    buffer->upload(bytes.data(), bytes.size());
  }
  for (DeviceBuffer* b : {&dq, &dk, &dv}) b->fill_bytes(0xFF);
  synchronize();
}

AttentionBackwardArgs GpuRun::backward_args() const {
  AttentionBackwardArgs b;
  b.q = q.data(), b.k = k.data(), b.v = v.data(), b.o = o.data(), b.lse = lse.as<float>(), b.d_o = d_o.data();
  b.dq = dq.data(), b.dk = dk.data(), b.dv = dv.data();
  b.batch = c.batch, b.heads_q = c.heads_q, b.heads_kv = c.heads_kv, b.seq_q = c.seq_q, b.seq_k = c.seq_k;
  b.pattern = pattern;
  return b;
}

Gradients GpuRun::gradients() const {
  const DType dt = c.spec.dtype;
  return {download(dt, dq, q_elems), download(dt, dk, k_elems), download(dt, dv, k_elems)};
}

bool output_close(DType dtype, double got, double want) {
  const double atol = dtype == DType::bf16 ? 2e-2 : 5e-3, rtol = dtype == DType::bf16 ? 1e-2 : 2.5e-3;
  return std::abs(got - want) <= atol + rtol * std::abs(want);
}

bool lse_close(double got, double want) {
  if (std::isinf(want)) return std::isinf(got) && got < 0;
  return std::abs(got - want) <= 2e-3 * std::max(1.0, std::abs(want));
}

bool gradient_close(DType dtype, double got, double want, double largest) {
  const double tol = dtype == DType::bf16 ? 2.5e-2 : 6e-3;
  // 1e-5: on an all-zero tensor (one key per row: dP = delta exactly) what is left is the fp32 rounding
  // of dP - delta, two sums of head_dim products of order 1 taken in different orders.
  return std::abs(got - want) <= tol * largest + tol * std::abs(want) + 1e-5;
}

}  // namespace sjit::test

// A training step of causal, block-sparse attention with sparsejit, as a program that embeds it would
// write one: a pattern (a sliding window of key blocks plus random ones), the forward and the backward
// on the GPU, the result checked against the float64 reference and the step timed. Without a GPU it
// compiles the kernels the step would load for Hopper (sm_90a) instead, and says so.
//
// Built against an installed sparsejit by examples/CMakeLists.txt (README, "Using it from C++").
// Exits 0 when every output is within its bound of the reference (or, without a GPU, when every
// kernel compiled), 1 otherwise.
#include <sparsejit/sparsejit.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

namespace {

// Two query heads a K/V head (GQA), and a length that is not a multiple of the pattern's blocks.
constexpr std::int64_t kBatch = 1, kHeadsQ = 4, kHeadsKv = 2, kSeq = 600, kDim = 128;
constexpr int kBlock = 64;
constexpr sjit::DType kDtype = sjit::DType::bf16;

// A tensor on the host as the GPU holds it: values already rounded to bf16, so that the reference
// sees exactly the GPU's inputs.
struct HostTensor {
  std::vector<float> values;
  std::vector<double> as_double() const { return {values.begin(), values.end()}; }
};

HostTensor random_tensor(std::size_t count, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.f, 1.f);
  HostTensor t{std::vector<float>(count)};
  for (float& x : t.values) x = normal(rng);
  std::vector<unsigned char> bytes(count * sjit::size_of(kDtype));
  sjit::encode(kDtype, t.values, bytes.data());
  sjit::decode(kDtype, bytes.data(), t.values);
  return t;
}

sjit::DeviceBuffer to_device(const HostTensor& t) {
  std::vector<unsigned char> bytes(t.values.size() * sjit::size_of(kDtype));
  sjit::encode(kDtype, t.values, bytes.data());
  sjit::DeviceBuffer buffer(bytes.size());
  buffer.upload(bytes.data(), bytes.size());
  return buffer;
}

// An output buffer, filled with NaN first: an element the kernels never write cannot pass the check.
sjit::DeviceBuffer poisoned(std::size_t bytes) {
  sjit::DeviceBuffer buffer(bytes);
  buffer.fill_bytes(0xFF);
  return buffer;
}

std::vector<double> from_device(const sjit::DeviceBuffer& buffer, std::size_t count) {
  std::vector<unsigned char> bytes(count * sjit::size_of(kDtype));
  buffer.download(bytes.data(), bytes.size());
  std::vector<float> values(count);
  sjit::decode(kDtype, bytes.data(), values);
  return {values.begin(), values.end()};
}

// The worst element's error as a share of its bound, atol * max|want| + rtol * |want| (the tensor's
// scale and the element's own), and where it is. Above 1 is a mismatch; a NaN counts as infinitely far.
struct Comparison {
  double worst_share = 0;
  std::size_t worst_index = 0;
};
Comparison compare(const std::vector<double>& got, const std::vector<double>& want, double atol, double rtol) {
  double scale = 0;
  for (double w : want) scale = std::max(scale, std::abs(w));
  Comparison c;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double bound = atol * scale + rtol * std::abs(want[i]) + 1e-30;
    const double share = std::isfinite(got[i]) ? std::abs(got[i] - want[i]) / bound : INFINITY;
    if (share > c.worst_share) c = {share, i};
  }
  return c;
}

bool report(const char* name, const std::vector<double>& got, const std::vector<double>& want, double atol,
            double rtol) {
  const Comparison c = compare(got, want, atol, rtol);
  const bool ok = c.worst_share <= 1.0;
  std::printf("  %-3s worst element %zu: %.5f, reference %.5f (%.0f%% of its bound) %s\n", name, c.worst_index,
              got[c.worst_index], want[c.worst_index], 100 * c.worst_share, ok ? "ok" : "MISMATCH");
  return ok;
}

int compile_only(const sjit::AttentionSpec& spec, const std::string& why) {
  std::printf("no GPU (%s): compiling the step's kernels for sm_90a instead\n", why.c_str());
  for (const std::string& key : sjit::attention_kernel_keys(spec, "sm_90a")) {
    const sjit::CompiledKernel k = sjit::compile_key(key, "sm_90a");
    std::printf("  %-90s %3d registers, %s\n", key.c_str(), k.usage.registers,
                k.from_cache ? "from the disk cache" : (std::to_string(int(k.compile_ms)) + " ms").c_str());
  }
  return 0;
}

}  // namespace

int main() try {
  const sjit::AttentionSpec spec{.head_dim = kDim, .dtype = kDtype, .causal = sjit::Causal::top_left,
                                 .sparsity = sjit::Sparsity::block_sparse, .block_size = kBlock};
  // Each query block sees the two key blocks before it and itself, and about a fifth of the others at
  // random (the diagonal among them); causality then drops the keys after each query.
  const sjit::BlockPattern pattern =
      sjit::patterns::united(sjit::patterns::sliding_window(kBlock, kSeq, kSeq, 2, 0),
                             sjit::patterns::random(kBlock, kSeq, kSeq, 0.2, /*seed=*/7));
  const sjit::PatternStats stats = pattern.stats();
  std::printf("pattern: %lld x %lld blocks of %d, density %.2f before causality\n",
              static_cast<long long>(pattern.block_rows()), static_cast<long long>(pattern.block_cols()), kBlock,
              stats.density);

  const sjit::SystemInfo info = sjit::system_info();
  if (!info.gpu_available) return compile_only(spec, info.no_gpu_reason);
  std::printf("device: %s\n", sjit::current_device().name.c_str());

  std::mt19937_64 rng(2026);
  const std::size_t q_count = kBatch * kHeadsQ * kSeq * kDim, kv_count = kBatch * kHeadsKv * kSeq * kDim;
  const HostTensor q = random_tensor(q_count, rng), k = random_tensor(kv_count, rng),
                   v = random_tensor(kv_count, rng), d_o = random_tensor(q_count, rng);
  const sjit::DeviceBuffer q_gpu = to_device(q), k_gpu = to_device(k), v_gpu = to_device(v), do_gpu = to_device(d_o);
  const std::size_t q_bytes = q_count * sjit::size_of(kDtype), kv_bytes = kv_count * sjit::size_of(kDtype);
  const sjit::DeviceBuffer o_gpu = poisoned(q_bytes), lse_gpu = poisoned(kBatch * kHeadsQ * kSeq * sizeof(float)),
                           dq_gpu = poisoned(q_bytes), dk_gpu = poisoned(kv_bytes), dv_gpu = poisoned(kv_bytes);

  // The step: compiled (or read from the disk cache) on the first call, launched on our stream.
  sjit::Attention attention(spec);
  sjit::OwnedStream stream;
  const sjit::AttentionForwardArgs forward{.q = q_gpu.data(), .k = k_gpu.data(), .v = v_gpu.data(),
                                           .o = o_gpu.data(), .lse = lse_gpu.as<float>(), .batch = kBatch,
                                           .heads_q = kHeadsQ, .heads_kv = kHeadsKv, .seq_q = kSeq,
                                           .seq_k = kSeq, .pattern = &pattern};
  const sjit::AttentionBackwardArgs backward{.q = q_gpu.data(), .k = k_gpu.data(), .v = v_gpu.data(),
                                             .o = o_gpu.data(), .lse = lse_gpu.as<float>(), .d_o = do_gpu.data(),
                                             .dq = dq_gpu.data(), .dk = dk_gpu.data(), .dv = dv_gpu.data(),
                                             .batch = kBatch, .heads_q = kHeadsQ, .heads_kv = kHeadsKv,
                                             .seq_q = kSeq, .seq_k = kSeq, .pattern = &pattern};
  attention.forward(forward, stream.get());
  attention.backward(backward, stream.get());
  sjit::synchronize(stream.get());
  std::printf("backward: dQ summed by %s, dK/dV tiling %s\n", std::string(sjit::name(attention.dq_summation(backward))).c_str(),
              attention.backward_tiling(backward).c_str());

  // The reference: the same mask, expanded from the pattern's blocks to (query, key) pairs.
  sjit::reference::AttentionProblem problem{.batch = kBatch, .heads_q = kHeadsQ, .heads_kv = kHeadsKv,
                                            .seq_q = kSeq, .seq_k = kSeq, .head_dim = kDim, .causal = true};
  problem.filter = [&](std::int64_t, std::int64_t i, std::int64_t j) { return pattern.active(0, i / kBlock, j / kBlock); };
  const std::vector<double> q_ref = q.as_double(), k_ref = k.as_double(), v_ref = v.as_double();
  const sjit::reference::AttentionOutput want = sjit::reference::attention_forward(problem, q_ref, k_ref, v_ref);
  const sjit::reference::AttentionGradients grads =
      sjit::reference::attention_backward(problem, q_ref, k_ref, v_ref, d_o.as_double());

  // bf16 outputs carry 8 bits of mantissa: bounds of a few of their steps (the GPU tests' bounds).
  std::printf("against the float64 reference:\n");
  bool ok = report("O", from_device(o_gpu, q_count), want.o, 2e-2, 1e-2);
  ok &= report("dQ", from_device(dq_gpu, q_count), grads.dq, 2.5e-2, 2.5e-2);
  ok &= report("dK", from_device(dk_gpu, kv_count), grads.dk, 2.5e-2, 2.5e-2);
  ok &= report("dV", from_device(dv_gpu, kv_count), grads.dv, 2.5e-2, 2.5e-2);

  // The step's time, once everything is compiled and uploaded: the median of 20 after 3 warm-up steps.
  sjit::EventTimer timer;
  std::vector<float> times;
  for (int run = 0; run < 23; ++run) {
    timer.start(stream.get());
    attention.forward(forward, stream.get());
    attention.backward(backward, stream.get());
    const float ms = timer.stop_ms(stream.get());
    if (run >= 3) times.push_back(ms);
  }
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  std::printf("forward + backward: %.3f ms (median of %zu)\n", times[times.size() / 2], times.size());
  std::printf("%s\n", ok ? "every output within its bound" : "MISMATCH against the reference");
  return ok ? 0 : 1;
} catch (const sjit::Error& e) {
  std::fprintf(stderr, "attention_training_step: %s\n", e.what());
  return 1;
}

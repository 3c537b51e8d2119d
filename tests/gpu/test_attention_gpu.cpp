// Attention forward on the GPU against the float64 reference, on fresh random inputs: dense and
// block-sparse, every dtype, head dim, causal mode, GQA, block size, several densities, odd lengths.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <future>
#include <optional>

#include "sparsejit/attention_reference.h"
#include "sparsejit/sparsejit.h"
#include "reference/attention_reference_fp32.h"
#include "support/attention_run.h"
#include "support/attention_support.h"
#include "support/test_support.h"

using namespace sjit;

namespace {

struct Case {
  AttentionSpec spec;
  std::int64_t batch = 1, heads_q = 1, heads_kv = 1, seq_q = 0, seq_k = 0;
  double density = 1;      // block-sparse: random pattern with this density
  bool per_head_pattern = false;
  bool bshd = false;       // [B, S, H, D] layout instead of [B, H, S, D]
  AttentionConfig config{};  // the kernel's tiling and path (default: chosen for the device)
  LastRound last_round = LastRound::automatic;  // the persistent kernel's (AttentionForwardArgs)
  std::string name() const {
    return fmt::format("{} | {} B{} Hq{} Hkv{} Sq{} Sk{} density {} {}{}", key(spec), key(config), batch, heads_q,
                       heads_kv, seq_q, seq_k, density, per_head_pattern ? "per-head " : "", bshd ? "bshd" : "bhsd");
  }
};

struct Result {
  std::vector<float> o;    // [B, Hq, Sq, D] whatever the device layout
  std::vector<float> lse;  // [B, Hq, Sq]
};

// [B, H, S, D] host values to the device layout and back.
std::vector<float> to_layout(const std::vector<float>& bhsd, std::int64_t b, std::int64_t h, std::int64_t s,
                             std::int64_t d, bool bshd) {
  if (!bshd) return bhsd;
  std::vector<float> out(bhsd.size());
  for (std::int64_t ib = 0; ib < b; ++ib)
    for (std::int64_t ih = 0; ih < h; ++ih)
      for (std::int64_t is = 0; is < s; ++is)
        std::memcpy(&out[((ib * s + is) * h + ih) * d], &bhsd[((ib * h + ih) * s + is) * d], d * sizeof(float));
  return out;
}
std::vector<float> from_layout(const std::vector<float>& dev, std::int64_t b, std::int64_t h, std::int64_t s,
                               std::int64_t d, bool bshd) {
  if (!bshd) return dev;
  std::vector<float> out(dev.size());
  for (std::int64_t ib = 0; ib < b; ++ib)
    for (std::int64_t ih = 0; ih < h; ++ih)
      for (std::int64_t is = 0; is < s; ++is)
        std::memcpy(&out[((ib * h + ih) * s + is) * d], &dev[((ib * s + is) * h + ih) * d], d * sizeof(float));
  return out;
}

using test::upload;

// Runs the GPU forward on q, k, v (quantized values, [B, H, S, D]) with a fresh NaN-poisoned output, on
// `stream`; in_graph: prepared, captured into a CUDA graph on a stream of its own, and the graph launched.
// How run_gpu launches the forward: a call, or captured into a CUDA graph on a stream of its own after
// prepare(pattern) (prepare() for a dense spec) or after prepare_forward(args, that stream).
enum class Launch { call, graph, graph_after_prepare_forward };

Result run_gpu(const Case& c, Attention& attention, const std::vector<float>& q, const std::vector<float>& k,
               const std::vector<float>& v, const BlockPattern* pattern, Launch launch = Launch::call,
               Stream stream = nullptr) {
  const DType dt = c.spec.dtype;
  const std::int64_t d = c.spec.head_dim;
  DeviceBuffer dq = upload(dt, to_layout(q, c.batch, c.heads_q, c.seq_q, d, c.bshd));
  DeviceBuffer dk = upload(dt, to_layout(k, c.batch, c.heads_kv, c.seq_k, d, c.bshd));
  DeviceBuffer dv = upload(dt, to_layout(v, c.batch, c.heads_kv, c.seq_k, d, c.bshd));
  const std::size_t o_elems = std::size_t(c.batch * c.heads_q * c.seq_q * d);
  DeviceBuffer dout(std::max<std::size_t>(o_elems * 2, 16));
  DeviceBuffer dlse(std::max<std::size_t>(std::size_t(c.batch * c.heads_q * c.seq_q) * 4, 16));
  dout.fill_bytes(0xFF);  // NaN in f16 and bf16: an element the kernel forgets to write fails the check
  dlse.fill_bytes(0xFF);
  // The fills run on the legacy default stream, which the non-blocking streams of the graph and
  // thread cases do not wait for: done before the kernel, not after it (which, on a busy GPU, they
  // were: poison over a written output).
  synchronize();

  AttentionForwardArgs a;
  a.q = dq.data(), a.k = dk.data(), a.v = dv.data(), a.o = dout.data(), a.lse = dlse.as<float>();
  a.batch = c.batch, a.heads_q = c.heads_q, a.heads_kv = c.heads_kv, a.seq_q = c.seq_q, a.seq_k = c.seq_k;
  if (c.bshd) {
    a.q_strides = a.o_strides = Strides::bshd(c.heads_q, c.seq_q, d);
    a.k_strides = a.v_strides = Strides::bshd(c.heads_kv, c.seq_k, d);
  }
  a.pattern = c.spec.sparsity == Sparsity::block_sparse ? pattern : nullptr;
  a.last_round = c.last_round;
  if (launch != Launch::call) {
    const OwnedStream stream;
    if (launch == Launch::graph_after_prepare_forward) attention.prepare_forward(a, stream.get());
    else if (a.pattern) attention.prepare(*a.pattern);
    else attention.prepare();
    begin_capture(stream.get());
    attention.forward(a, stream.get());
    const CudaGraph graph = end_capture(stream.get());
    graph.launch(stream.get());
    synchronize(stream.get());
  } else {
    attention.forward(a, stream);
    synchronize(stream);
  }

  Result r;
  std::vector<unsigned char> o_bytes(o_elems * 2);
  dout.download(o_bytes.data(), o_bytes.size());
  r.o = from_layout(test::from_bytes(dt, o_bytes), c.batch, c.heads_q, c.seq_q, d, c.bshd);
  r.lse.resize(std::size_t(c.batch * c.heads_q * c.seq_q));
  dlse.download(r.lse.data(), r.lse.size() * 4);
  return r;
}

// Two runs' outputs and log-sum-exps, bit for bit.
void require_same_bits(const Result& got, const Result& want) {
  REQUIRE(got.o.size() == want.o.size());
  REQUIRE(std::memcmp(got.o.data(), want.o.data(), got.o.size() * 4) == 0);
  REQUIRE(std::memcmp(got.lse.data(), want.lse.data(), got.lse.size() * 4) == 0);
}

// The float64 reference's output, or (Arithmetic::fp32) the same reference run in fp32.
enum class Arithmetic { float64, fp32 };
reference::AttentionOutput run_reference(const Case& c, const std::vector<float>& q, const std::vector<float>& k,
                                         const std::vector<float>& v, const BlockPattern* pattern,
                                         Arithmetic arithmetic = Arithmetic::float64) {
  const reference::AttentionProblem p =
      test::reference_problem(c.spec, c.batch, c.heads_q, c.heads_kv, c.seq_q, c.seq_k, pattern);
  const auto forward = arithmetic == Arithmetic::fp32 ? reference::attention_forward_fp32 : reference::attention_forward;
  return forward(p, test::wide(q), test::wide(k), test::wide(v));
}

// The tests' tolerances (test::output_close, test::lse_close).
void expect_matches(const Case& c, const Result& got, const reference::AttentionOutput& want) {
  const std::int64_t d = c.spec.head_dim;
  for (std::size_t i = 0; i < want.o.size(); ++i) {
    const double g = got.o[i], w = want.o[i];
    if (!test::output_close(c.spec.dtype, g, w)) {
      const std::int64_t row = std::int64_t(i) / d;
      FAIL(fmt::format("{}: o[b{} h{} row {} col {}] = {:.6g}, want {:.6g}", c.name(), row / c.seq_q / c.heads_q,
                       row / c.seq_q % c.heads_q, row % c.seq_q, std::int64_t(i) % d, g, w));
    }
  }
  for (std::size_t i = 0; i < want.lse.size(); ++i) {
    const double g = got.lse[i], w = want.lse[i];
    if (!test::lse_close(g, w)) FAIL(fmt::format("{}: lse[{}] = {:.7g}, want {:.7g}", c.name(), i, g, w));
  }
  SUCCEED();
}

BlockPattern pattern_for(const Case& c, std::uint64_t seed) {
  return patterns::random(c.spec.block_size, c.seq_q, c.seq_k, c.density, seed,
                          c.per_head_pattern ? int(c.heads_q) : 1);
}

// Fresh q, k and v of the case's shape: unit-variance rows, quantized to its dtype.
struct Inputs {
  std::vector<float> q, k, v;
};
Inputs random_inputs(const Case& c, std::mt19937_64& rng) {
  auto rows = [&](std::int64_t n) {
    return test::quantized(c.spec.dtype, test::random_rows(rng, c.batch * n, c.spec.head_dim, 1.0f));
  };
  Inputs in;
  in.q = rows(c.heads_q * c.seq_q);
  in.k = rows(c.heads_kv * c.seq_k);
  in.v = rows(c.heads_kv * c.seq_k);
  return in;
}

// A pattern of the case's shape from the next seed of `rng`, or none for a dense spec (which draws no seed).
std::optional<BlockPattern> pattern_if_sparse(const Case& c, std::mt19937_64& rng) {
  if (c.spec.sparsity == Sparsity::dense) return std::nullopt;
  return pattern_for(c, rng());
}

// Against the float64 reference; with Arithmetic::fp32 also against the reference run in fp32 (issue 6
// asks for both; the two agree within 1e-3, a CPU test checks).
void check_case(const Case& c, std::mt19937_64& rng, Arithmetic also = Arithmetic::float64) {
  const auto [q, k, v] = random_inputs(c, rng);
  const std::optional<BlockPattern> pattern = pattern_if_sparse(c, rng);
  Attention attention =
      c.spec.sparsity == Sparsity::baked ? Attention(c.spec, *pattern, c.config) : Attention(c.spec, c.config);
  const Result got = run_gpu(c, attention, q, k, v, pattern ? &*pattern : nullptr);
  const auto want = run_reference(c, q, k, v, pattern ? &*pattern : nullptr);
  INFO(c.name());
  expect_matches(c, got, want);
  if (also == Arithmetic::fp32) {
    INFO("against the reference run in fp32");
    expect_matches(c, got, run_reference(c, q, k, v, pattern ? &*pattern : nullptr, Arithmetic::fp32));
  }
}

using test::spec_of;

// The wgmma tests need compute capability 9.0; elsewhere they say so (a warning in the report) and
// check nothing.
bool on_hopper() { return test::on_hopper("wgmma path"); }

// The two Hopper kernels: one CTA a query tile (wgmma) and persistent, warp-specialized (wgmma_ws).
// They share the per-warpgroup math, so every wgmma test runs both.
constexpr std::array kHopperPaths{AttentionPath::wgmma, AttentionPath::wgmma_ws};

AttentionConfig hopper(AttentionPath path, int warps = 0, int block_n = 0, int stages = 0) {
  AttentionConfig c;
  c.path = path;
  c.warps = warps, c.block_n = block_n, c.stages = stages;
  if (warps || block_n || stages) c.m_tiles = 1, c.q_in_registers = 0;
  return c;
}
AttentionConfig wgmma(int warps = 0, int block_n = 0, int stages = 0) {
  return hopper(AttentionPath::wgmma, warps, block_n, stages);
}

}  // namespace

TEST_CASE("dense attention matches the float64 reference and its fp32 run for every head dim, dtype and causal mode",
          "[gpu][attention]") {
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  const bool hopper = on_hopper();
  for (const int d : {32, 64, 96, 128, 256})
    for (const DType dt : {DType::bf16, DType::f16})
      for (const Causal causal : {Causal::none, Causal::top_left, Causal::bottom_right}) {
        // Lengths that are not multiples of any tile; bottom-right with seq_q > seq_k leaves rows empty.
        Case c{spec_of(d, dt, causal), 2, 4, 2, 197, 333};
        if (causal == Causal::bottom_right) std::swap(c.seq_q, c.seq_k);
        check_case(c, rng, Arithmetic::fp32);
        // d = 96 and 256 take wgmma by default on an H100: the mma.sync kernel, which other GPUs run,
        // is checked too.
        if ((d == 96 || d == 256) && hopper) {
          c.config.path = AttentionPath::mma;
          check_case(c, rng);
        }
      }
}

TEST_CASE("dense attention: GQA, MQA, [B, S, H, D] strides, a single row, long sequences", "[gpu][attention]") {
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  SECTION("MQA: eight query heads share one K/V head") {
    check_case({spec_of(64, DType::bf16, Causal::top_left), 1, 8, 1, 130, 130}, rng);
  }
  SECTION("[B, S, H, D] layout, grouped") {
    Case c{spec_of(128, DType::f16, Causal::none), 2, 4, 2, 100, 257};
    c.bshd = true;
    check_case(c, rng);
  }
  SECTION("one query row, one key") { check_case({spec_of(128, DType::bf16, Causal::none), 1, 1, 1, 1, 1}, rng); }
  SECTION("decode-like: 3 queries, 1000 keys, bottom-right") {
    check_case({spec_of(128, DType::bf16, Causal::bottom_right), 1, 2, 2, 3, 1000}, rng);
  }
  SECTION("1024 x 1024, several key tiles per CTA, causal") {
    check_case({spec_of(128, DType::bf16, Causal::top_left), 1, 2, 1, 1024, 1024}, rng);
  }
}

// Scores that climb along the keys, by less than 2^8 a key tile in the first tiles and by more in the
// last, or fall: the mma.sync kernel at d >= 128 lets its exponent bases lag a row's maximum by up to
// 2^8 (softmax_scores, kBaseLag) and moves them only on a larger rise. A base that failed to move
// would overflow P; one that moved without the output rescaled would weigh the early keys wrongly.
TEST_CASE("scores that rise or fall steeply along the keys match the reference (lagging softmax bases)",
          "[gpu][attention]") {
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  AttentionConfig mma;
  mma.path = AttentionPath::mma;
  for (const int d : {128, 256})
    for (const bool rising : {true, false})
      for (const AttentionConfig config : {AttentionConfig{}, mma}) {
        Case c{spec_of(d, rising ? DType::bf16 : DType::f16, rising ? Causal::bottom_right : Causal::none), 1, 2, 1,
               300, 700};
        c.config = config;
        // Along one direction e: q = noise + 4 sqrt(d) e and k_j = noise + 35 b_j e, so the scores climb by
        // 202 b_j in the exp2 domain, with b_j = t^2 (t = j / (seq_k - 1)) rising: by 18.5 t over a tile
        // of 32 keys, under 8 up to t = 0.43 and over 8 after; or b_j = 1 - t falling.
        const int dim = d;
        auto q = test::random_rows(rng, c.batch * c.heads_q * c.seq_q, dim, 1.0f);
        auto k = test::random_rows(rng, c.batch * c.heads_kv * c.seq_k, dim, 1.0f);
        const auto v = test::quantized(c.spec.dtype, test::random_rows(rng, c.batch * c.heads_kv * c.seq_k, dim, 1.0f));
        for (std::size_t row = 0; row < q.size() / dim; ++row) q[row * dim] += 4.f * std::sqrt(float(dim));
        for (std::size_t row = 0; row < k.size() / dim; ++row) {
          const double t = double(std::int64_t(row) % c.seq_k) / double(c.seq_k - 1);
          k[row * dim] += float(35.0 * (rising ? t * t : 1.0 - t));
        }
        q = test::quantized(c.spec.dtype, q);
        k = test::quantized(c.spec.dtype, k);
        Attention attention(c.spec, c.config);
        const Result got = run_gpu(c, attention, q, k, v, nullptr);
        INFO(c.name());
        expect_matches(c, got, run_reference(c, q, k, v, nullptr));
      }
}

TEST_CASE("block-sparse attention matches the reference for every block size and density", "[gpu][attention]") {
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  int variant = 0;
  for (const int bs : {16, 32, 64, 128})
    for (const double density : {1.0, 0.5, 0.1, 0.02, 0.0})
      for (const Causal causal : {Causal::none, Causal::top_left}) {
        ++variant;
        const int d = variant % 2 ? 128 : 64;
        const DType dt = variant % 3 ? DType::bf16 : DType::f16;
        // Long enough for 0.02 to leave more than the diagonal with small blocks; odd lengths.
        const std::int64_t seq = bs <= 32 ? 1000 : 1500;
        Case c{spec_of(d, dt, causal, Sparsity::block_sparse, bs), 1, 4, 2, seq + 3, seq - 5, density};
        c.per_head_pattern = variant % 4 == 1;
        check_case(c, rng);
      }
}

TEST_CASE("an empty pattern row gives output 0 and log-sum-exp -inf, never NaN", "[gpu][attention]") {
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  const std::int64_t seq = 300;
  // Rows 0 and 2 empty, row 1 the diagonal only, the rest dense.
  const int bs = 64;
  const std::int64_t blocks = (seq + bs - 1) / bs;
  std::vector<std::uint8_t> mask(std::size_t(blocks * blocks), 1);
  for (std::int64_t c = 0; c < blocks; ++c) mask[c] = 0, mask[2 * blocks + c] = 0, mask[blocks + c] = c == 1;
  const BlockPattern pattern = BlockPattern::from_block_mask(bs, 1, blocks, blocks, mask);
  const auto q = test::quantized(DType::bf16, test::random_rows(rng, 4 * seq, 128, 1.0f));
  const auto k = test::quantized(DType::bf16, test::random_rows(rng, 4 * seq, 128, 1.0f));
  const auto v = test::quantized(DType::bf16, test::random_rows(rng, 4 * seq, 128, 1.0f));
  for (const AttentionPath path : {AttentionPath::mma, AttentionPath::wgmma}) {
    if (path == AttentionPath::wgmma && !on_hopper()) continue;
    Case c{spec_of(128, DType::bf16, Causal::none, Sparsity::block_sparse, bs), 2, 2, 2, seq, seq};
    c.config.path = path;
    Attention attention(c.spec, c.config);
    REQUIRE(attention.config().path == path);
    const Result got = run_gpu(c, attention, q, k, v, &pattern);
    for (std::int64_t bh = 0; bh < 4; ++bh)
      for (std::int64_t row = 0; row < seq; ++row) {
        const bool empty = row / bs == 0 || row / bs == 2;
        const float lse = got.lse[bh * seq + row];
        if (empty) {
          REQUIRE((std::isinf(lse) && lse < 0));
          for (int col = 0; col < 128; ++col) REQUIRE(got.o[(bh * seq + row) * 128 + col] == 0.0f);
        } else {
          REQUIRE(std::isfinite(lse));
        }
      }
    expect_matches(c, got, run_reference(c, q, k, v, &pattern));
  }
}

TEST_CASE("a baked pattern gives bit for bit the output of the same pattern given at launch", "[gpu][attention]") {
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  for (const int bs : {32, 128}) {
    Case c{spec_of(64, DType::bf16, Causal::top_left, Sparsity::block_sparse, bs), 2, 4, 4, 700, 700, 0.3};
    c.per_head_pattern = bs == 32;
    const BlockPattern pattern = pattern_for(c, rng());
    const auto q = test::quantized(DType::bf16, test::random_rows(rng, 8 * 700, 64, 1.0f));
    const auto k = test::quantized(DType::bf16, test::random_rows(rng, 8 * 700, 64, 1.0f));
    const auto v = test::quantized(DType::bf16, test::random_rows(rng, 8 * 700, 64, 1.0f));
    Attention runtime(c.spec);
    Attention baked(c.spec, pattern);
    REQUIRE(baked.spec().sparsity == Sparsity::baked);
    REQUIRE(key(baked.spec()).find(fmt::format("{:016x}", pattern.digest())) != std::string::npos);
    const Result a = run_gpu(c, runtime, q, k, v, &pattern);
    Case cb = c;
    cb.spec = baked.spec();
    const Result b = run_gpu(cb, baked, q, k, v, nullptr);
    require_same_bits(a, b);
    expect_matches(c, a, run_reference(c, q, k, v, &pattern));
  }
}

// Pattern blocks of 16 and 32 put several pattern rows in a query tile, and a warp skips the tiles its
// own rows do not see: warps of 16 and 32 rows, tiles of 16 to 128 keys, at a density low enough that
// warps skip tiles their neighbours compute.
TEST_CASE("every tiling the tuner may pick computes the same attention", "[gpu][attention]") {
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  for (const int bs : {16, 32, 64}) {
    const Case c{spec_of(128, DType::bf16, Causal::top_left, Sparsity::block_sparse, bs), 1, 2, 1, 517, 517,
                 bs == 64 ? 0.5 : 0.3};
    const BlockPattern pattern = pattern_for(c, rng());
    const auto q = test::quantized(DType::bf16, test::random_rows(rng, 2 * 517, 128, 1.0f));
    const auto k = test::quantized(DType::bf16, test::random_rows(rng, 517, 128, 1.0f));
    const auto v = test::quantized(DType::bf16, test::random_rows(rng, 517, 128, 1.0f));
    const auto want = run_reference(c, q, k, v, &pattern);
    for (const AttentionConfig config : {AttentionConfig{4, 2, 64, 2, 0}, AttentionConfig{8, 1, 64, 2, 1},
                                         AttentionConfig{4, 1, 32, 3, 1}, AttentionConfig{4, 2, 32, 2, 0},
                                         AttentionConfig{8, 1, 128, 2, 0}, AttentionConfig{4, 1, 16, 2, 1},
                                         AttentionConfig{8, 1, 32, 2, 1}, AttentionConfig{8, 2, 16, 2, 0}}) {
      INFO("block " << bs << ", " << key(config));
      Attention attention(c.spec, config);
      expect_matches(c, run_gpu(c, attention, q, k, v, &pattern), want);
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// The Hopper path (wgmma, sm_90a): the same checks with path = wgmma, on compute capability 9.0 only.
// ---------------------------------------------------------------------------------------------------

TEST_CASE("wgmma path: one tile of each head dim and dtype (descriptor layouts)", "[gpu][attention][sm90]") {
  if (!on_hopper()) {
    WARN("not a compute capability 9.0 GPU: the wgmma path is not tested");
    return;
  }
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  for (const int d : {64, 96, 128, 256})
    for (const DType dt : {DType::bf16, DType::f16})
      for (const AttentionConfig config : {wgmma(4, 64, 2), wgmma(8, 128, 2), hopper(AttentionPath::wgmma_ws, 8, 128, 2),
                                           wgmma(8, 64, 2)}) {
        // d = 96: two swizzle blocks, the second half zeros. d = 256: 64-key tiles on the one-item
        // kernel (shared memory, see resolve).
        if (d == 256 && (config.block_n == 128 || config.path == AttentionPath::wgmma_ws)) continue;
        // Exactly one query tile and one key tile: S = Q K^T and O = P V through one descriptor each.
        Case c{spec_of(d, dt, Causal::none), 1, 1, 1, config.block_m(), config.block_n};
        c.config = config;
        check_case(c, rng);
      }
}

TEST_CASE("wgmma path: dense for every dtype and head dim and causal mode with GQA and odd lengths", "[gpu][attention][sm90]") {
  if (!on_hopper()) return;
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  for (const AttentionPath path : kHopperPaths) {
    for (const int d : {64, 96, 128, 256})
      for (const DType dt : {DType::bf16, DType::f16})
        for (const Causal causal : {Causal::none, Causal::top_left, Causal::bottom_right}) {
          if (d == 256 && path == AttentionPath::wgmma_ws) continue;  // d = 256: the one-item kernel only
          Case c{spec_of(d, dt, causal), 2, 4, 2, 197, 333};
          if (causal == Causal::bottom_right) std::swap(c.seq_q, c.seq_k);  // rows with no key
          c.config = hopper(path);
          check_case(c, rng);
        }
    // [B, S, H, D] layout, MQA, long causal, decode-like
    Case bshd{spec_of(128, DType::f16, Causal::none), 2, 4, 2, 100, 257};
    bshd.bshd = true;
    bshd.config = hopper(path);
    check_case(bshd, rng);
    Case mqa{spec_of(64, DType::bf16, Causal::top_left), 1, 8, 1, 130, 130};
    mqa.config = hopper(path);
    check_case(mqa, rng);
    Case long_causal{spec_of(128, DType::bf16, Causal::top_left), 1, 2, 1, 1024, 1024};
    long_causal.config = hopper(path);
    check_case(long_causal, rng);
    Case decode{spec_of(128, DType::bf16, Causal::bottom_right), 1, 2, 2, 3, 1000};
    decode.config = hopper(path);
    check_case(decode, rng);
  }
}

TEST_CASE("wgmma path: block-sparse and baked for every block size and density", "[gpu][attention][sm90]") {
  if (!on_hopper()) return;
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  // Causal mode, head dim, dtype and bsr/baked rotate with the variant so that every value of each
  // meets every block size without compiling a kernel per combination.
  for (const AttentionPath path : kHopperPaths) {
    int variant = 0;
    for (const int bs : {16, 32, 64, 128})
      for (const double density : {1.0, 0.5, 0.1, 0.02, 0.0}) {
        ++variant;
        const Causal causal = std::array{Causal::none, Causal::top_left, Causal::bottom_right}[variant % 3];
        const int d = variant % 2 ? 128 : 64;
        const DType dt = variant % 4 < 2 ? DType::bf16 : DType::f16;
        const Sparsity sparsity = variant % 5 == 2 ? Sparsity::baked : Sparsity::block_sparse;
        const std::int64_t seq = bs <= 32 ? 1000 : 1500;
        Case c{spec_of(d, dt, causal, sparsity, bs), 1, 4, 2, seq + 3, seq - 5, density};
        c.per_head_pattern = variant % 4 == 1;
        c.config = hopper(path);
        check_case(c, rng);
      }
  }
  // d = 96 (both kernels) and 256 (the one-item kernel): each block size, densities and causal modes
  // rotating.
  for (const int d : {96, 256})
    for (const AttentionPath path : kHopperPaths) {
      if (d == 256 && path == AttentionPath::wgmma_ws) continue;
      int variant = 0;
      for (const int bs : {16, 32, 64, 128})
        for (const double density : {1.0, 0.1, 0.0}) {
          ++variant;
          const Causal causal = std::array{Causal::none, Causal::top_left, Causal::bottom_right}[variant % 3];
          const Sparsity sparsity = variant % 4 == 2 ? Sparsity::baked : Sparsity::block_sparse;
          Case c{spec_of(d, variant % 2 ? DType::bf16 : DType::f16, causal, sparsity, bs), 1, 4, 2, 700, 650, density};
          c.per_head_pattern = variant % 3 == 1;
          c.config = hopper(path);
          check_case(c, rng);
        }
    }
}

TEST_CASE("wgmma_gather path: blocks of 16 and 32 for every head dim, dtype, causal mode and density",
          "[gpu][attention][sm90]") {
  if (!on_hopper()) return;
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  // Lengths that end inside a block and inside a 64-key step, query rows past the keys and keys past
  // the queries (causal bottom-right), GQA, per-head and shared patterns, baked ones; densities from
  // full (every step whole) to 0 (no step: output 0, lse -inf), with a last step that repeats its
  // last block.
  int variant = 0;
  for (const int d : {64, 96, 128, 256})
    for (const int bs : {16, 32})
      for (const double density : {1.0, 0.5, 0.1, 0.02, 0.0}) {
        ++variant;
        const Causal causal = std::array{Causal::none, Causal::top_left, Causal::bottom_right}[variant % 3];
        const DType dt = variant % 4 < 2 ? DType::bf16 : DType::f16;
        const Sparsity sparsity = variant % 5 == 2 ? Sparsity::baked : Sparsity::block_sparse;
        const std::int64_t seq = d == 256 ? 500 : 1000;
        Case c{spec_of(d, dt, causal, sparsity, bs), 2, 4, variant % 2 ? 2 : 4, seq + 3 + 8 * (variant % 3),
               seq - 5, density};
        c.per_head_pattern = variant % 4 == 1;
        c.bshd = variant % 7 == 3;
        c.config = hopper(AttentionPath::wgmma_gather);
        check_case(c, rng);
      }
  // Several query heads a CTA (mt), their blocks side by side as the columns: GQA groups of 4 and 8
  // query heads sharing one pattern, every head dim, causal modes and densities rotating.
  variant = 0;
  for (const int d : {64, 96, 128, 256})
    for (const auto& [bs, heads] : {std::pair{16, 2}, std::pair{16, 4}, std::pair{32, 2}})
      for (const double density : {0.5, 0.1, 0.0}) {
        ++variant;
        const Causal causal = std::array{Causal::none, Causal::top_left, Causal::bottom_right}[variant % 3];
        const DType dt = variant % 2 ? DType::bf16 : DType::f16;
        const Sparsity sparsity = variant % 5 == 2 ? Sparsity::baked : Sparsity::block_sparse;
        Case c{spec_of(d, dt, causal, sparsity, bs), 1, 8, variant % 2 ? 2 : 1, 517 + 8 * (variant % 3), 530, density};
        c.bshd = variant % 4 == 3;
        c.config = hopper(AttentionPath::wgmma_gather);
        c.config.m_tiles = heads;
        check_case(c, rng);
      }
}

TEST_CASE("wgmma path: every tiling it accepts computes the same attention", "[gpu][attention][sm90]") {
  if (!on_hopper()) return;
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  constexpr AttentionPath ws = AttentionPath::wgmma_ws;
  for (const int d : {64, 96, 128})
    for (const AttentionConfig config :
         {wgmma(4, 64, 2), wgmma(4, 128, 3), wgmma(8, 64, 2), wgmma(8, 64, 3), wgmma(8, 128, 2), hopper(ws, 4, 64, 2),
          hopper(ws, 4, 64, 3), hopper(ws, 4, 128, 2), hopper(ws, 4, 128, 3), hopper(ws, 8, 64, 2), hopper(ws, 8, 64, 3),
          hopper(ws, 8, 128, 2), hopper(ws, 8, 128, 3)}) {
      if (config.path == ws && config.warps == 8 && config.block_n == 128 && config.stages == 3 && d >= 96)
        continue;  // 2 x 32 KB of Q and 6 x 32 KB of K/V (d = 96 in whole swizzle blocks): more than a CTA may have
      Case c{spec_of(d, DType::bf16, Causal::top_left, Sparsity::block_sparse, 64), 1, 2, 1, 517, 517, 0.5};
      c.config = config;
      check_case(c, rng);
    }
  // d = 256: the one-item kernel's 64-key tilings that fit (Q and two or three slots of K and V).
  for (const AttentionConfig config : {wgmma(4, 64, 2), wgmma(4, 64, 3), wgmma(8, 64, 2)}) {
    Case c{spec_of(256, DType::f16, Causal::bottom_right, Sparsity::block_sparse, 64), 1, 2, 1, 517, 600, 0.5};
    c.config = config;
    check_case(c, rng);
  }
  // 16- and 32-key tiles (the one-item kernel, for pattern blocks of 16 and 32): a tile half a block,
  // one block, or two blocks wide, one and two warpgroups, two and three stages.
  for (const int d : {64, 128, 256})
    for (const int bs : {16, 32})
      for (const AttentionConfig config : {wgmma(4, 16, 2), wgmma(4, 32, 3), wgmma(8, 16, 3), wgmma(8, 32, 2)}) {
        if (d == 256 && config.stages == 3) continue;
        Case c{spec_of(d, d == 64 ? DType::f16 : DType::bf16, bs == 16 ? Causal::top_left : Causal::none,
                       Sparsity::block_sparse, bs),
               1, 2, 1, 517, 530, 0.3};
        c.per_head_pattern = bs == 32;
        c.config = config;
        check_case(c, rng);
      }
}

TEST_CASE("wgmma_ws path: CTAs that take many work items give bit for bit the output of one CTA an item",
          "[gpu][attention][sm90]") {
  if (!on_hopper()) return;
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  // Several hundred work items for the 132 persistent CTAs, of unequal lengths (causal rows; random
  // per-head patterns with empty rows), so that each CTA's copy warp and math warps cross many item
  // boundaries with ring slots and Q loads in flight. The two kernels do the same arithmetic in the
  // same order, so their outputs must be equal, and both must match the reference.
  struct Problem {
    Case c;
    int block_n, stages;
  };
  // The block-sparse walks issue an item's first two S together (WarpgroupRows::walk), S of tile 0 in
  // the output's registers where d = block_n (the default tiling, d = 128 with 128-key tiles, and
  // d = 64 with 64-key ones) or in registers of its own (d = 64 with 128-key tiles); with 64-key tiles
  // at d = 128 they walk plainly.
  const std::array problems{
      Problem{{spec_of(128, DType::bf16, Causal::top_left), 2, 8, 2, 2000, 2000}, 128, 2},
      Problem{{spec_of(128, DType::bf16, Causal::none, Sparsity::block_sparse, 128), 1, 8, 4, 3000, 3000, 0.1}, 64, 3},
      Problem{{spec_of(128, DType::bf16, Causal::top_left, Sparsity::block_sparse, 128), 1, 8, 8, 3000, 3000, 0.1}, 128, 2},
      Problem{{spec_of(64, DType::f16, Causal::none, Sparsity::block_sparse, 128), 2, 8, 2, 2600, 2500, 0.1}, 128, 2},
      Problem{{spec_of(64, DType::f16, Causal::bottom_right, Sparsity::block_sparse, 64), 1, 16, 16, 2500, 2600, 0.05}, 64, 2},
  };
  for (Problem problem : problems) {
    Case& c = problem.c;
    c.per_head_pattern = c.spec.sparsity != Sparsity::dense;
    const auto [q, k, v] = random_inputs(c, rng);
    const std::optional<BlockPattern> pattern = pattern_if_sparse(c, rng);
    const int warps = c.spec.sparsity != Sparsity::dense && c.spec.block_size <= 64 ? 4 : 8;
    Case one = c, persistent = c;
    one.config = wgmma(warps, problem.block_n, problem.stages);
    persistent.config = hopper(AttentionPath::wgmma_ws, warps, problem.block_n, problem.stages);
    persistent.last_round = LastRound::whole;  // a split last round merges its pieces: other bits (tested below)
    Attention a(one.spec, one.config), b(persistent.spec, persistent.config);
    const BlockPattern* pp = pattern ? &*pattern : nullptr;
    const Result want_bits = run_gpu(one, a, q, k, v, pp);
    const Result got = run_gpu(persistent, b, q, k, v, pp);
    INFO(persistent.name());
    require_same_bits(got, want_bits);
    const Result again = run_gpu(persistent, b, q, k, v, pp);  // the same Attention launched twice
    require_same_bits(again, got);
    expect_matches(persistent, got, run_reference(persistent, q, k, v, pp));
  }
}

// The persistent kernel's last round split across CTAs (templates/sparsejit/last_round.cuh): its
// items cut into pieces of key tiles on several CTAs, the last piece to finish merging them. Asked for
// (LastRound::split), so that it runs where the automatic choice would not: problems of few long items
// (up to 9 pieces an item), many items (60-72 over the H100's and H200's 132 CTAs), causal rows of
// unequal length (some one tile, whole), empty pattern rows in the last round, GQA, odd lengths,
// [B, S, H, D] strides, d = 64, 96 and 128, one and two math warpgroups. Each must match the
// reference, give the same bits when run again (the merger and its order are fixed, whichever piece
// finishes last), and so must every item whole.
TEST_CASE("wgmma_ws path: a last round split across CTAs matches the reference and runs the same twice",
          "[gpu][attention][sm90]") {
  if (!on_hopper()) return;
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  struct Problem {
    Case c;
    int warps, block_n, stages;
  };
  const std::array problems{
      Problem{{spec_of(128, DType::bf16, Causal::none), 1, 1, 1, 2048, 2048}, 8, 128, 2},
      Problem{{spec_of(128, DType::bf16, Causal::top_left), 1, 2, 1, 1000, 1000}, 8, 128, 2},
      Problem{{spec_of(128, DType::bf16, Causal::bottom_right), 1, 4, 2, 700, 1900}, 8, 64, 3},
      Problem{{spec_of(64, DType::f16, Causal::none), 2, 3, 3, 1500, 3333}, 8, 128, 2},
      Problem{{spec_of(96, DType::bf16, Causal::none), 1, 2, 1, 900, 2500}, 8, 128, 2},
      Problem{{spec_of(128, DType::bf16, Causal::none, Sparsity::block_sparse, 128), 1, 8, 4, 3000, 3000, 0.1}, 8, 128, 2},
      Problem{{spec_of(128, DType::f16, Causal::top_left, Sparsity::block_sparse, 128), 1, 8, 2, 3000, 3000, 0.3}, 8, 128, 2},
      Problem{{spec_of(128, DType::bf16, Causal::none, Sparsity::block_sparse, 64), 1, 2, 2, 2000, 2900, 0.2}, 4, 64, 2},
  };
  for (Problem problem : problems) {
    Case& c = problem.c;
    c.per_head_pattern = c.spec.sparsity != Sparsity::dense;
    c.bshd = c.spec.head_dim == 64;
    c.config = hopper(AttentionPath::wgmma_ws, problem.warps, problem.block_n, problem.stages);
    const auto [q, k, v] = random_inputs(c, rng);
    std::optional<BlockPattern> pattern = pattern_if_sparse(c, rng);
    if (pattern) {
      // Rows of no block, so that items with no key tile fall in the last round too.
      std::vector<std::uint8_t> mask = pattern->to_block_mask();
      const std::int64_t rows = pattern->block_rows(), cols = pattern->block_cols();
      for (std::int64_t h = 0; h < pattern->heads(); ++h)
        for (std::int64_t r = rows - 1; r >= 0; r -= 3)
          std::fill_n(mask.begin() + (h * rows + r) * cols, cols, std::uint8_t{0});
      pattern = BlockPattern::from_block_mask(pattern->block_size(), pattern->heads(), rows, cols, mask);
    }
    const BlockPattern* pp = pattern ? &*pattern : nullptr;
    c.last_round = LastRound::split;
    Case whole = c;
    whole.last_round = LastRound::whole;
    Attention attention(c.spec, c.config);
    INFO(c.name());
    const Result split = run_gpu(c, attention, q, k, v, pp);
    const Result again = run_gpu(c, attention, q, k, v, pp);
    require_same_bits(again, split);
    const reference::AttentionOutput want = run_reference(c, q, k, v, pp);
    expect_matches(c, split, want);
    expect_matches(whole, run_gpu(whole, attention, q, k, v, pp), want);
  }
}

// A forward captured into a CUDA graph splits its last round only with its stream's scratch, which
// prepare_forward allocates: a dense problem of 16 items, which the automatic rule splits, captured
// after it gives bit for bit the split output of a call (and after prepare() alone, the output of
// every item whole, since no call on the fresh capture stream allocated the scratch).
TEST_CASE("prepare_forward readies a captured forward to split its last round", "[gpu][attention][sm90]") {
  if (!on_hopper()) return;
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  Case c{spec_of(128, DType::bf16, Causal::none), 1, 1, 1, 2048, 2048};
  c.config = hopper(AttentionPath::wgmma_ws, 8, 128, 2);
  const auto [q, k, v] = random_inputs(c, rng);
  Attention attention(c.spec, c.config);
  Case split = c, whole = c;
  split.last_round = LastRound::split;
  whole.last_round = LastRound::whole;
  const Result called_split = run_gpu(split, attention, q, k, v, nullptr);
  const Result called_whole = run_gpu(whole, attention, q, k, v, nullptr);
  // First the capture after prepare() alone: a stream made later may reuse the handle of one that
  // had scratch, and scratch is found by the stream's handle.
  require_same_bits(run_gpu(c, attention, q, k, v, nullptr, Launch::graph), called_whole);
  require_same_bits(run_gpu(c, attention, q, k, v, nullptr, Launch::graph_after_prepare_forward), called_split);
  expect_matches(c, called_split, run_reference(c, q, k, v, nullptr));
}

// Pattern blocks of 16 and 32 on Hopper: an Attention built without a tiling runs each pattern on the
// tiles it is expected to be faster on (src/attention/wide_tiles.h), two warpgroups on 128-row tiles
// where the active blocks fill them, one warpgroup on tiles one key block wide elsewhere. One object
// serves both kinds of pattern; each matches the reference, also when captured into a graph after
// prepare(pattern).
TEST_CASE("small pattern blocks run dense-ish patterns on the wide tiles, sparse ones on narrow or gathered ones",
          "[gpu][attention][sm90]") {
  if (!on_hopper()) return;
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  enum class Tiling { narrow, wide, gathered };
  struct Run {
    const char* what;
    double density;  // random blocks; a negative density: a band of 16 blocks around the diagonal
    Tiling tiling;   // the 128-row tiles, the default tiling, or the gathered-key kernel
    int heads = 1;   // the gathered kernel's query heads a CTA
  };
  struct Problem {
    Case c;
    std::vector<Run> runs;
  };
  const std::vector<Problem> problems = {
      {{spec_of(128, DType::bf16, Causal::none, Sparsity::block_sparse, 16), 1, 4, 2, 1203, 1195},
       {{"random 0.5", 0.5, Tiling::wide}, {"random 0.03", 0.03, Tiling::narrow}, {"band", -1, Tiling::wide}}},
      // Blocks of 16 at 0.1 with 12 blocks a row: the narrow tiles would compute 3 times the active
      // scores (attention/gathered_keys.h).
      {{spec_of(128, DType::f16, Causal::none, Sparsity::block_sparse, 16), 1, 4, 4, 2003, 2011},
       {{"random 0.1", 0.1, Tiling::gathered}, {"random 0.6", 0.6, Tiling::wide}}},
      // GQA, 4 query heads a K/V head sharing the pattern: 4 heads a CTA read each block once for all,
      // which beats the wide tiles at 0.25 too.
      {{spec_of(128, DType::bf16, Causal::none, Sparsity::block_sparse, 16), 1, 8, 2, 2003, 2011},
       {{"random 0.1", 0.1, Tiling::gathered, 4}, {"random 0.3", 0.3, Tiling::gathered, 4}, {"random 0.7", 0.7, Tiling::wide}}},
      {{spec_of(64, DType::f16, Causal::top_left, Sparsity::block_sparse, 32), 2, 4, 4, 1100, 1100},
       {{"random 0.08", 0.08, Tiling::narrow}, {"random 0.8", 0.8, Tiling::wide}}},
      {{spec_of(96, DType::bf16, Causal::bottom_right, Sparsity::block_sparse, 32), 1, 2, 1, 700, 1000},
       {{"random 0.6", 0.6, Tiling::wide}}},
      // d = 256: the one-item kernel's 128 x 64 tiles.
      {{spec_of(256, DType::bf16, Causal::none, Sparsity::block_sparse, 16), 1, 2, 2, 1040, 1000},
       {{"random 0.5", 0.5, Tiling::wide}, {"random 0.05", 0.05, Tiling::narrow}}},
  };
  for (const Problem& problem : problems) {
    const Case& c = problem.c;
    const std::int64_t d = c.spec.head_dim;
    Attention attention(c.spec);
    const AttentionConfig narrow = attention.config();
    REQUIRE(narrow.path == AttentionPath::wgmma);
    REQUIRE(narrow.block_m() == 64);
    REQUIRE(narrow.block_n == c.spec.block_size);
    for (const Run& run : problem.runs) {
      INFO(c.name() << ", " << run.what);
      const int bs = c.spec.block_size;
      const BlockPattern pattern = run.density < 0 ? patterns::sliding_window(bs, c.seq_q, c.seq_k, 8, 7)
                                                   : patterns::random(bs, c.seq_q, c.seq_k, run.density, rng());
      const AttentionConfig runs_on = attention.forward_config(pattern, c.heads_q, c.heads_kv);
      switch (run.tiling) {
        case Tiling::narrow: REQUIRE(runs_on == narrow); break;
        case Tiling::gathered:
          REQUIRE(runs_on.path == AttentionPath::wgmma_gather);
          REQUIRE(runs_on.block_m() == bs);
          REQUIRE(runs_on.m_tiles == run.heads);
          break;
        case Tiling::wide:
          // The persistent kernel, or at d = 256, which it does not take, the one-item one.
          REQUIRE(runs_on.block_m() == 128);
          REQUIRE(runs_on.path == (d == 256 ? AttentionPath::wgmma : AttentionPath::wgmma_ws));
          break;
      }
      const auto [q, k, v] = random_inputs(c, rng);
      const auto want = run_reference(c, q, k, v, &pattern);
      expect_matches(c, run_gpu(c, attention, q, k, v, &pattern), want);
      expect_matches(c, run_gpu(c, attention, q, k, v, &pattern, Launch::graph), want);
    }
  }
}

// One Attention used from several threads at once, each with its own stream, pattern and buffers:
// the kernels, twins (dense, wide) and schedules it makes on first use are made while other threads
// ask for them. Every thread's output matches the reference (checked on this thread: Catch2's
// assertions are not thread-safe).
TEST_CASE("one Attention serves forwards from several threads at once", "[gpu][attention]") {
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  const Case c{spec_of(64, DType::bf16, Causal::top_left, Sparsity::block_sparse, 16), 1, 2, 2, 700, 700};
  // Dense-ish (the wide tiles on Hopper), sparse (the narrow ones), full (the dense twin), middling.
  constexpr std::array kDensities{0.6, 0.05, 1.0, 0.3};
  constexpr int kThreads = 8;
  struct Job {
    BlockPattern pattern;
    Inputs in;
  };
  std::vector<Job> jobs;
  for (int t = 0; t < kThreads; ++t)
    jobs.push_back({patterns::random(16, c.seq_q, c.seq_k, kDensities[t % 4], rng()), random_inputs(c, rng)});
  Attention attention(c.spec);
  std::vector<std::future<Result>> results;
  for (const Job& job : jobs)
    results.push_back(std::async(std::launch::async, [&] {
      const OwnedStream stream;
      return run_gpu(c, attention, job.in.q, job.in.k, job.in.v, &job.pattern, Launch::call, stream.get());
    }));
  for (int t = 0; t < kThreads; ++t) {
    INFO("thread " << t << ", density " << kDensities[t % 4]);
    const Job& job = jobs[std::size_t(t)];
    expect_matches(c, results[std::size_t(t)].get(), run_reference(c, job.in.q, job.in.k, job.in.v, &job.pattern));
  }
}

// sjit bench e23: the fused E23 forward (and with --backward, forward + backward through time), time per
// step, and how far it is from its floors.
#include <fmt/format.h>

#include <algorithm>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "commands.h"
#include "sparsejit/e23.h"

namespace sjit::tool {
namespace {

struct E23BenchOptions {
  std::int64_t batch = 4, steps = 64;
  int slots = 8, dim = 512;
  std::string kinds = "entmax15";
  std::string dtype = "bf16";
  int iterations = 50, warmup = 5;
  bool backward = false, profile = false;
  std::int64_t checkpoint_every = 0;
};

// H100 SXM figures the floors are quoted against: HBM3 bandwidth (where the driver does not report the
// device's own), dense bf16/f16 tensor rate (wgmma; mma.sync reaches about two thirds), fp32 FMA rate.
constexpr double kHbmBytesPerS = 3.35e12;
constexpr double kTensorFlopsPerS = 989e12;
constexpr double kFp32FlopsPerS = 67e12;

void print_spans(const std::vector<E23ProfileSpan>& spans) {
  Table table({"role", "span", "ns/step", "max"});
  for (const E23ProfileSpan& s : spans)
    table.add({s.role, s.span, fmt::format("{:.0f}", s.ns_per_step), fmt::format("{:.0f}", s.max_ns)});
  table.print();
}

// Forward with the state saved, then the backward through time, per kind. The training step's floor is
// taken as three forward floors (the backward reads both weights again and touches the tape and its
// gradient: about twice the forward's traffic; the dW products add 4 B D^2 FLOPs).
void run_e23_backward(const E23BenchOptions& o, E23ForwardArgs args, double fwd_bytes_us, double fwd_flops_us) {
  const DType dtype = parse_dtype(o.dtype);
  const std::int64_t b = o.batch, t = o.steps, n = o.slots, d = o.dim;
  const std::size_t e = size_of(dtype);
  std::mt19937_64 rng(7);
  DeviceBuffer dy = random_device_tensor(t * b * d, dtype, rng, 0.5f);
  DeviceBuffer du(std::size_t(t * b * d) * e), dh0(std::size_t(b * d) * e), dm0(std::size_t(b * n * d) * e);
  DeviceBuffer dw_h(std::size_t(d * d) * e), dw_w(std::size_t(d * d) * e);
  fmt::print("\nbackward through time: forward saving its state, then backward_sequence (K = {}); median of {} runs\n",
             E23::checkpoint_interval(t, o.checkpoint_every), o.iterations);
  std::vector<std::pair<std::string, std::vector<E23ProfileSpan>>> profiles;  // with --profile
  Table table({"kind", "bwd CTAs", "fwd us/step", "fwd+save", "bwd", "fwd+bwd", "ratio", "x floor", "saved MB",
               "tape history MB", "bwd workspace MB"});
  for (const std::string& kind : split_commas(o.kinds)) {
    const RowNormSpec norm = kind_from_name(kind, int(n), dtype);
    E23 cell(e23_spec(norm.kind, norm.alpha, int(n), int(d), dtype));
    cell.prepare(b);
    cell.prepare_backward(b, t, o.checkpoint_every);
    DeviceBuffer saved(cell.saved_bytes(b, t, o.checkpoint_every));
    args.saved = nullptr;
    const double fwd_us = 1000.0 * median_gpu_ms(o.warmup, o.iterations, [&](int) { cell.forward_sequence(args); });
    args.saved = saved.data(), args.checkpoint_every = o.checkpoint_every;
    const double save_us = 1000.0 * median_gpu_ms(o.warmup, o.iterations, [&](int) { cell.forward_sequence(args); });
    E23BackwardArgs bw;
    bw.w_h = args.w_h, bw.w_w = args.w_w, bw.dy = dy.data(), bw.saved = saved.data();
    bw.du = du.data(), bw.dh0 = dh0.data(), bw.dm0 = dm0.data(), bw.dw_h = dw_h.data(), bw.dw_w = dw_w.data();
    bw.batch = b, bw.steps = t, bw.checkpoint_every = o.checkpoint_every;
    const double bwd_us = 1000.0 * median_gpu_ms(o.warmup, o.iterations, [&](int) { cell.backward_sequence(bw); });
    if (o.profile) profiles.emplace_back(kind, cell.profile_backward(bw));
    const double per_step = (save_us + bwd_us) / double(t);
    const double floor_us = 3.0 * std::max(fwd_bytes_us, fwd_flops_us);
    table.add({kind, std::to_string(cell.backward_grid_size(b)), fmt::format("{:.2f}", fwd_us / double(t)),
               fmt::format("{:.2f}", save_us / double(t)), fmt::format("{:.2f}", bwd_us / double(t)),
               fmt::format("{:.2f}", per_step), fmt::format("{:.2f}x", (save_us + bwd_us) / fwd_us),
               fmt::format("{:.0f}x", per_step / floor_us), fmt::format("{:.2f}", cell.saved_bytes(b, t, o.checkpoint_every) / 1e6),
               fmt::format("{:.2f}", double(t + 1) * b * n * d * 4 / 1e6),
               fmt::format("{:.2f}", cell.backward_workspace_bytes(b, t, o.checkpoint_every) / 1e6)});
  }
  table.print();
  fmt::print("us columns per step (launch / {}); ratio = (fwd+save + bwd) / fwd, goal <= 3; x floor against three "
             "forward floors ({:.3f} us). saved = the activation memory kept from forward to backward; tape history = "
             "what storing every M_t in fp32 would take.\n",
             t, 3.0 * std::max(fwd_bytes_us, fwd_flops_us));
  for (const auto& [kind, spans] : profiles) {
    fmt::print("\nbackward profile, {}: ns per step (mean over steps {}..0 and the role's CTAs; max = slowest CTA's "
               "mean; launch rows: ns per launch)\n", kind, t - 2);
    print_spans(spans);
  }
}

// Per-phase timing of one instrumented launch per kind (E23::profile_forward), after a warm-up launch.
void print_e23_profile(const E23BenchOptions& o, const E23ForwardArgs& args) {
  const DType dtype = parse_dtype(o.dtype);
  for (const std::string& kind : split_commas(o.kinds)) {
    const RowNormSpec norm = kind_from_name(kind, o.slots, dtype);
    E23 cell(e23_spec(norm.kind, norm.alpha, o.slots, o.dim, dtype));
    cell.prepare(o.batch);
    cell.forward_sequence(args);
    const std::vector<E23ProfileSpan> spans = cell.profile_forward(args);
    fmt::print("\nprofile, {}: ns per step (mean over steps 1..{} and the role's CTAs; max = slowest CTA's mean)\n",
               kind, o.steps - 1);
    print_spans(spans);
  }
}

int run_e23(const E23BenchOptions& o) {
  // Every flag refused or taken before any GPU work.
  require_at_least("--batch", o.batch, 1);
  require_at_least("--steps", o.steps, 1);
  require_at_least("--iters", o.iterations, 1);
  require_at_least("--warmup", o.warmup, 0);
  require_at_least("--checkpoint-every", o.checkpoint_every, 0);  // 0: ceil(sqrt(steps))
  const DType dtype = parse_dtype(o.dtype);
  for (const std::string& kind : split_commas(o.kinds)) {  // an unknown kind, or N or D out of range
    const RowNormSpec norm = kind_from_name(kind, 8, dtype);  // the kind alone: e23_spec checks N
    e23_spec(norm.kind, norm.alpha, o.slots, o.dim, dtype);
  }
  if (!gpu_available()) throw NoDevice("sjit bench needs a GPU: " + system_info().no_gpu_reason);
  const DeviceInfo dev = current_device();
  const std::int64_t b = o.batch, t = o.steps, n = o.slots, d = o.dim;
  const std::size_t e = size_of(dtype);

  std::mt19937_64 rng(2026);
  const float w_scale = 0.9f / std::sqrt(float(d));
  DeviceBuffer u = random_device_tensor(t * b * d, dtype, rng, 0.5f);
  DeviceBuffer h0 = random_device_tensor(b * d, dtype, rng, 0.5f);
  DeviceBuffer m0 = random_device_tensor(b * n * d, dtype, rng, 1.5f);
  DeviceBuffer w_h = random_device_tensor(d * d, dtype, rng, w_scale);
  DeviceBuffer w_w = random_device_tensor(d * d, dtype, rng, 2 * w_scale);
  DeviceBuffer y(std::size_t(t * b * d) * e), h_final(std::size_t(b * d) * e), m_final(std::size_t(b * n * d) * e);
  DeviceBuffer read_support(std::size_t(t) * 4), write_support(std::size_t(t) * 4);
  E23ForwardArgs args;
  args.u = u.data(), args.h0 = h0.data(), args.m0 = m0.data(), args.w_h = w_h.data(), args.w_w = w_w.data();
  args.y = y.data(), args.h_final = h_final.data(), args.m_final = m_final.data();
  args.batch = b, args.steps = t;

  // Floors per step. Bytes: both weight matrices (read from L2 or HBM every step) and the fp32 state the
  // step must touch at least once (the tape read and written, h, u and y); over HBM bandwidth. FLOPs:
  // the two products (2 * 2 * B * D^2) and the tape (three passes of 2 * B * N * D) over the tensor rate
  // (bf16/f16) or the fp32 FMA rate (f32).
  const double bytes = 2.0 * d * d * e + double(b) * (2.0 * n * d * 4 + 4.0 * d * 4 + 2.0 * d * e);
  const double flops = 4.0 * b * d * d + 6.0 * b * n * d;
  const double dram_bytes_per_s = dev.memory_bandwidth > 0 ? dev.memory_bandwidth : kHbmBytesPerS;
  const double bytes_us = bytes / dram_bytes_per_s * 1e6;
  const double flops_us = flops / (dtype == DType::f32 ? kFp32FlopsPerS : kTensorFlopsPerS) * 1e6;

  fmt::print("device {}; B={} N={} D={} T={} {}; median of {} runs of the whole sequence\n", describe_device(dev), b,
             n, d, t, name(dtype), o.iterations);
  Table table({"kind", "CTAs", "tape", "us/launch", "us/step", "floor bytes", "floor FLOPs", "x floor", "read supp",
               "write supp"});
  double first_us = 0;
  for (const std::string& kind : split_commas(o.kinds)) {
    const RowNormSpec norm = kind_from_name(kind, int(n), dtype);
    E23 cell(e23_spec(norm.kind, norm.alpha, int(n), int(d), dtype));
    cell.prepare(b);
    const double launch_us = 1000.0 * median_gpu_ms(o.warmup, o.iterations, [&](int) { cell.forward_sequence(args); });
    const double step_us = launch_us / double(t);
    if (first_us == 0) first_us = step_us;
    // Supports of one more run, for the table.
    args.read_support = read_support.as<float>(), args.write_support = write_support.as<float>();
    cell.forward_sequence(args);
    synchronize();
    args.read_support = args.write_support = nullptr;
    std::vector<float> rs(static_cast<std::size_t>(t)), ws(static_cast<std::size_t>(t));
    read_support.download(rs.data(), rs.size() * 4);
    write_support.download(ws.data(), ws.size() * 4);
    double mean_read = 0, mean_write = 0;
    for (std::int64_t i = 0; i < t; ++i) mean_read += rs[i] / double(t), mean_write += ws[i] / double(t);
    table.add({kind, std::to_string(cell.grid_size(b)), cell.tape_on_chip(b) ? "on chip" : "in L2/HBM",
               fmt::format("{:.1f}", launch_us), fmt::format("{:.2f}", step_us),
               fmt::format("{:.3f} us", bytes_us), fmt::format("{:.3f} us", flops_us),
               fmt::format("{:.0f}x", step_us / std::max(bytes_us, flops_us)), fmt::format("{:.2f}", mean_read),
               fmt::format("{:.2f}", mean_write)});
  }
  table.print();
  if (o.profile) print_e23_profile(o, args);
  fmt::print("us/step = time of one launch of all {} steps / {}. Floors per step: {:.0f} KB of weights and state "
             "over {:.2f} TB/s; {:.1f} MFLOP over {:.0f} TFLOP/s.\n",
             t, t, bytes / 1024, dram_bytes_per_s / 1e12, flops / 1e6,
             (dtype == DType::f32 ? kFp32FlopsPerS : kTensorFlopsPerS) / 1e12);
  if (o.backward) run_e23_backward(o, args, bytes_us, flops_us);
  return 0;
}

}  // namespace

Runner add_bench_e23(CLI::App& bench) {
  auto* cmd = bench.add_subcommand("e23", "E23 cell over a sequence (forward, --backward): us/step and the floors");
  auto o = std::make_shared<E23BenchOptions>();
  cmd->add_option("--batch", o->batch, "Batch rows (default 4)");
  cmd->add_option("--slots", o->slots, "Tape slots N (default 8)");
  cmd->add_option("--dim", o->dim, "State width D (default 512)");
  cmd->add_option("--steps", o->steps, "Steps per launch (default 64)");
  cmd->add_option("--kind", o->kinds, "softmax | sparsemax | entmax15 | entmax:ALPHA, comma-separated to compare");
  cmd->add_option("--dtype", o->dtype, "bf16 | f16 | f32");
  cmd->add_option("--iters", o->iterations, "Timed runs (median reported)");
  cmd->add_option("--warmup", o->warmup, "Untimed runs first");
  cmd->add_flag("--backward", o->backward, "Also time the forward that saves its state and the backward through time");
  cmd->add_flag("--profile", o->profile,
                "Also time each phase of one instrumented launch per kind (docs/e23.md); with --backward the backward's too");
  cmd->add_option("--checkpoint-every", o->checkpoint_every, "K, steps between saved tapes (0: ceil(sqrt(steps)))");
  return [=] { return cmd->parsed() ? run_e23(*o) : -1; };
}

}  // namespace sjit::tool

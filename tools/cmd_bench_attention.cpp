// sjit bench attention: dense and block-sparse forward time, TFLOP/s over the active blocks, and the
// speedup over our own dense kernel, at the densities asked for.
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <random>

#include "commands.h"

namespace sjit::tool {
namespace {

struct AttentionBenchOptions {
  std::int64_t batch = 2, heads = 16, heads_kv = 0, seq = 8192, seq_k = 0;
  int head_dim = 128;
  std::string dtype = "bf16";
  std::string causal = "none";
  int block = 128;
  std::vector<double> densities = {1, 0.5, 0.25, 0.1, 0.05, 0.02};
  std::string pattern_file;
  std::vector<std::int64_t> window;  // blocks before and after the diagonal: a sliding window
  bool baked = false;
  bool per_head = false;
  bool backward = false;
  bool deterministic = false;
  std::string dq;  // "" (chosen per call), atomic or pass
  std::string walk;     // "" (chosen per call), tiles, packed or gathered: the pattern rows' backward
  int query_tiles = 0;  // 0 (chosen per call), 64 or 128: the pattern rows' dK/dV query tiles
  bool queued = false;
  bool graph = false;
  std::string last_round = "auto";  // the persistent kernel's last round: auto, whole or split
  std::string config;
  int iterations = 20, warmup = 3;
};

// Peak dense bf16/f16 tensor rate of the H100 SXM (989 TFLOP/s, wgmma). The mma.sync path these
// kernels use reaches about two thirds of it; both are quoted so the gap is visible.
constexpr double kH100PeakTflops = 989.0;

Causal causal_from(const std::string& text) {
  if (text == "none") return Causal::none;
  if (text == "tl" || text == "top_left") return Causal::top_left;
  if (text == "br" || text == "bottom_right") return Causal::bottom_right;
  throw InvalidArgument(fmt::format("--causal {}: use none, tl or br", text));
}

double median_ms(const AttentionBenchOptions& o, const std::function<void()>& run) {
  return median_gpu_ms(o.warmup, o.iterations, [&](int) { run(); }, o.queued);
}

int run_attention(const AttentionBenchOptions& o) {
  // --dq: the way the backward sums dQ, where asked (checked before anything runs).
  std::optional<DqSummation> dq_asked;
  if (o.dq == "atomic") dq_asked = DqSummation::atomic;
  else if (o.dq == "pass") dq_asked = DqSummation::pass;
  else if (!o.dq.empty()) throw InvalidArgument(fmt::format("--dq {}: use atomic or pass", o.dq));
  // --walk and --query-tiles: how the pattern rows' dK/dV pass walks their queries, where asked. A row
  // whose pattern cannot take it shows why under the table; the dense row always walks tiles.
  std::optional<BackwardWalk> walk_asked;
  if (o.walk == "tiles") walk_asked = BackwardWalk::tiles;
  else if (o.walk == "packed") walk_asked = BackwardWalk::packed;
  else if (o.walk == "gathered") walk_asked = BackwardWalk::gathered;
  else if (!o.walk.empty()) throw InvalidArgument(fmt::format("--walk {}: use tiles, packed or gathered", o.walk));
  if (o.query_tiles != 0 && o.query_tiles != 64 && o.query_tiles != 128)
    throw InvalidArgument(fmt::format("--query-tiles {}: use 64 or 128", o.query_tiles));
  if (!o.backward && (dq_asked || walk_asked || o.query_tiles != 0))
    throw InvalidArgument("--dq, --walk and --query-tiles choose how the backward runs: add --backward");
  const LastRound last_round = parse_last_round(o.last_round);
  // The sizes, the spec, the tiling and the patterns: every other flag refused or taken before any GPU work.
  require_at_least("--batch", o.batch, 1);
  require_at_least("--heads", o.heads, 1);
  require_at_least("--heads-kv", o.heads_kv, 0);  // 0: --heads
  require_at_least("--seq", o.seq, 1);
  require_at_least("--seq-k", o.seq_k, 0);  // 0: --seq
  require_at_least("--iters", o.iterations, 1);
  require_at_least("--warmup", o.warmup, 0);
  const std::int64_t heads_kv = o.heads_kv ? o.heads_kv : o.heads, seq_k = o.seq_k ? o.seq_k : o.seq;
  if (o.heads % heads_kv != 0)
    throw InvalidArgument(fmt::format("--heads {} --heads-kv {}: the query heads must be a multiple of the K/V heads",
                                      o.heads, heads_kv));
  const DType dtype = parse_dtype(o.dtype);
  AttentionSpec dense;
  dense.head_dim = o.head_dim, dense.dtype = dtype, dense.causal = causal_from(o.causal);
  dense.deterministic = o.deterministic;
  dense = canonical(dense);  // refuses a head dim or dtype the kernels do not take
  const AttentionConfig config =
      o.config.empty() ? AttentionConfig{} : parse_flag("--config", o.config, parse_attention_config);
  // The patterns (each builder refuses a bad block size, density or window, naming it).
  std::vector<std::pair<std::string, BlockPattern>> patterns_to_run;
  if (!o.pattern_file.empty()) {
    patterns_to_run.emplace_back(o.pattern_file, BlockPattern::load(o.pattern_file));
  } else if (!o.window.empty()) {
    patterns_to_run.emplace_back(fmt::format("window {},{}", o.window[0], o.window[1]),
                                 patterns::sliding_window(o.block, o.seq, seq_k, o.window[0], o.window[1],
                                                          o.per_head ? int(o.heads) : 1));
  } else {
    for (const double density : o.densities)
      patterns_to_run.emplace_back(fmt::format("{:g}", density),
                                   patterns::random(o.block, o.seq, seq_k, density, 7, o.per_head ? int(o.heads) : 1));
  }
  if (!gpu_available()) throw NoDevice("sjit bench needs a GPU: " + system_info().no_gpu_reason);
  const DeviceInfo dev = current_device();

  std::mt19937_64 rng(2026);
  DeviceBuffer q = random_device_tensor(o.batch * o.heads * o.seq * o.head_dim, dtype, rng);
  DeviceBuffer k = random_device_tensor(o.batch * heads_kv * seq_k * o.head_dim, dtype, rng);
  DeviceBuffer v = random_device_tensor(o.batch * heads_kv * seq_k * o.head_dim, dtype, rng);
  DeviceBuffer out(std::size_t(o.batch * o.heads * o.seq * o.head_dim) * size_of(dtype));
  DeviceBuffer lse(std::size_t(o.batch * o.heads * o.seq) * 4);
  AttentionForwardArgs args;
  args.q = q.data(), args.k = k.data(), args.v = v.data(), args.o = out.data(), args.lse = lse.as<float>();
  args.batch = o.batch, args.heads_q = o.heads, args.heads_kv = heads_kv, args.seq_q = o.seq, args.seq_k = seq_k;
  args.last_round = last_round;

  // Without --deterministic the backward sums dQ whichever way is faster for the call, unless --dq or
  // the environment forces one (docs/attention.md, "Choosing how to sum dQ").
  const char* dq_env = std::getenv("SJIT_BACKWARD_DQ");
  const std::string dq_method = dq_asked                                   ? fmt::format("--dq {}", o.dq)
                                : dq_env != nullptr && *dq_env != '\0' ? fmt::format("SJIT_BACKWARD_DQ={}", dq_env)
                                                                          : "chosen per call";
  const std::string walk_method =
      (walk_asked ? fmt::format(", --walk {}", o.walk) : "") +
      (o.query_tiles ? fmt::format(", --query-tiles {}", o.query_tiles) : "");
  const std::string backward_mode = !o.backward ? ""
                                    : o.deterministic
                                        ? fmt::format("; deterministic backward{}", walk_method)
                                        : fmt::format("; backward, dQ atomic or by a pass ({}){}", dq_method, walk_method);
  fmt::print("device {}; B={} Hq={} Hkv={} Sq={} Sk={} D={} {} causal={}{}{}; median of {} runs{}\n",
             describe_device(dev), o.batch, o.heads, heads_kv, o.seq, seq_k, o.head_dim, name(dtype), o.causal,
             backward_mode, o.last_round == "auto" ? "" : "; last round " + o.last_round, o.iterations,
             o.queued ? ", queued (the host's launch latency hidden)" : ", each alone (the host's launch latency included)");
  std::vector<std::string> headers = {"kernel", "density", "blocks/row", "time", "TFLOP/s", "% of 989", "vs dense",
                                      "vs dense x density", "config"};
  if (o.backward)
    headers.insert(headers.end(),
                   {"bwd", "dQ", "fwd+bwd", "in it: fwd / bwd", "fwd+bwd TFLOP/s", "fwd+bwd vs dense", "bwd vs dense"});
  if (o.backward && o.graph) headers.insert(headers.end(), {"fwd+bwd graph", "calls / graph"});
  headers.push_back(o.backward ? "host us: fwd / bwd" : "host us");
  Table table(headers);

  // The backward's buffers: dO random, gradients written.
  std::optional<DeviceBuffer> d_o, dq, dk, dv;
  AttentionBackwardArgs bargs;
  if (o.backward) {
    d_o.emplace(random_device_tensor(o.batch * o.heads * o.seq * o.head_dim, dtype, rng));
    dq.emplace(out.bytes());
    dk.emplace(k.bytes());
    dv.emplace(v.bytes());
    bargs.q = q.data(), bargs.k = k.data(), bargs.v = v.data(), bargs.o = out.data(), bargs.lse = lse.as<float>();
    bargs.d_o = d_o->data(), bargs.dq = dq->data(), bargs.dk = dk->data(), bargs.dv = dv->data();
    bargs.batch = o.batch, bargs.heads_q = o.heads, bargs.heads_kv = heads_kv, bargs.seq_q = o.seq, bargs.seq_k = seq_k;
    bargs.dq_summation = dq_asked;
  }
  // The backward's args for a row: its pattern, and the walk asked for pattern rows only.
  auto backward_args_for = [&](const BlockPattern* pattern) {
    bargs.pattern = pattern;
    bargs.walk = pattern ? walk_asked : std::nullopt;
    bargs.query_tile_cols = pattern ? o.query_tiles : 0;
  };
  // Pattern rows whose backward refused the walk or query tiles asked: the row's label and why.
  std::vector<std::pair<std::string, std::string>> refusals;
  // The dense rows and the 'vs dense' columns: the tiling asked for, unless it takes patterns only
  // (wgmma_gather), where the device's dense default.
  Attention dense_attention(dense, config.path == AttentionPath::wgmma_gather ? AttentionConfig{} : config);
  const AttentionForwardArgs dense_args = args;
  // --graph: the forward and backward captured into one CUDA graph (on a stream of their own, made
  // ready first), its replays timed on the default stream (a training step without the host's
  // launches), alternately with the same two calls made directly, which see the same clocks.
  auto graph_step_ms = [&](Attention& attention, const BlockPattern* pattern) {
    const OwnedStream capture_stream;
    if (pattern) attention.prepare(*pattern);
    else attention.prepare();
    attention.prepare_backward(bargs, capture_stream.get());
    begin_capture(capture_stream.get());
    attention.forward(args, capture_stream.get());
    attention.backward(bargs, capture_stream.get());
    const CudaGraph step = end_capture(capture_stream.get());
    return paired_median_gpu_ms(o.warmup, o.iterations, [&] { step.launch(); },
                                [&] { attention.forward(args), attention.backward(bargs); }, o.queued);
  };
  // Backward columns: the backward's time, how it summed dQ (atomic or pass), then the forward and
  // backward as one step, back to back between one pair of events as a training step runs them (timed
  // apart, each call's end misses what it leaves to the next, the L2's write-backs of its outputs or a
  // tail of CTAs, and each start pays the host's launch latency), its split, its rate counted as 3.5 x
  // the forward's FLOPs (FlashAttention's convention: the backward does 2.5 x the forward's matrix
  // work), and its speedup over the dense step, timed once with the dense row. `args` holds the row's
  // pattern already.
  double dense_step_ms = 0;
  auto backward_cells = [&](Attention& attention, const BlockPattern* pattern, double flops, bool refused) {
    if (!o.backward) return std::vector<std::string>{};
    if (refused) {
      std::vector<std::string> cells(o.graph ? 9 : 7, "-");
      cells[1] = "refused (below)";
      return cells;
    }
    backward_args_for(pattern);
    const double bwd_ms = median_ms(o, [&] { attention.backward(bargs); });
    const StepTimes step = median_step_ms(
        o.warmup, o.iterations, {[&] { attention.forward(args); }, [&] { attention.backward(bargs); }}, o.queued);
    if (pattern == nullptr) dense_step_ms = step.step;
    // How dQ was summed, and how the dK/dV pass walked the queries: gathered (pattern blocks of 16, 32
    // and 64), packed, or on contiguous tiles; and at d = 64 whether on its 64-query tiles (blocks of
    // 64, and short walks of blocks of 16 and 32; 128 otherwise).
    const std::string tiling = attention.backward_tiling(bargs);
    const BackwardWalk walk = attention.backward_walk(bargs);
    const bool narrow_queries = walk != BackwardWalk::gathered && o.head_dim == 64 &&
                                tiling.find("cols=64,") != std::string::npos &&
                                tiling.find("path=wgmma") != std::string::npos;
    const std::string walk_note = walk == BackwardWalk::tiles ? "" : fmt::format(", {}", name(walk));
    // The backward against the dense one at the same moment (a, b, a, b, ..., as the forward's 'vs
    // dense'): the 'bwd' column, timed apart, sees a later and warmer GPU than the dense row's.
    double bwd_vs_dense = 1;
    if (pattern != nullptr) {
      AttentionBackwardArgs dense_bargs = bargs;
      dense_bargs.pattern = nullptr, dense_bargs.walk = std::nullopt, dense_bargs.query_tile_cols = 0;
      const auto [ms, dense_now_ms] =
          paired_median_gpu_ms(o.warmup, o.iterations, [&] { attention.backward(bargs); },
                               [&] { dense_attention.backward(dense_bargs); }, o.queued);
      bwd_vs_dense = dense_now_ms / ms;
    }
    std::vector<std::string> cells = {fmt::format("{:.3f} ms", bwd_ms),
                                      fmt::format("{}{}{}", name(attention.dq_summation(bargs)),
                                                  narrow_queries ? ", 64-query" : "", walk_note),
                                      fmt::format("{:.3f} ms", step.step),
                                      fmt::format("{:.3f} / {:.3f}", step.parts[0], step.parts[1]),
                                      fmt::format("{:.0f}", 3.5 * flops / step.step / 1e9),
                                      fmt::format("{:.2f}x", dense_step_ms / step.step),
                                      fmt::format("{:.2f}x", bwd_vs_dense)};
    if (o.graph) {
      const auto [graph_ms, calls_ms] = graph_step_ms(attention, pattern);
      cells.push_back(fmt::format("{:.3f} ms", graph_ms));
      cells.push_back(fmt::format("{:.2f}x", calls_ms / graph_ms));
    }
    return cells;
  };
  // How long a call keeps the host (checks, lookups, tensor maps, launches), the GPU idle before it: a
  // run timed alone pays it before its first kernel, a queued one hides it.
  auto host_cell = [&](Attention& attention, const BlockPattern* pattern, bool refused) {
    const double fwd_us = median_host_us(o.iterations, [&] { attention.forward(args); });
    if (!o.backward) return fmt::format("{:.1f}", fwd_us);
    if (refused) return fmt::format("{:.1f} / -", fwd_us);
    backward_args_for(pattern);
    return fmt::format("{:.1f} / {:.1f}", fwd_us, median_host_us(o.iterations, [&] { attention.backward(bargs); }));
  };

  const double dense_ms = median_ms(o, [&] { dense_attention.forward(args); });
  const double dense_flops = attention_forward_flops(dense, args);
  std::vector<std::string> dense_row = {
      "dense", "1", "-", fmt::format("{:.3f} ms", dense_ms), fmt::format("{:.0f}", dense_flops / dense_ms / 1e9),
      fmt::format("{:.0f}%", 100 * dense_flops / dense_ms / 1e9 / kH100PeakTflops), "1.00x", "-",
      key(dense_attention.config())};
  for (auto& cell : backward_cells(dense_attention, nullptr, dense_flops, false)) dense_row.push_back(cell);
  dense_row.push_back(host_cell(dense_attention, nullptr, false));
  table.add(dense_row);

  for (const auto& [label, pattern_of_row] : patterns_to_run) {
    const BlockPattern& pattern = pattern_of_row;  // (a reference the lambdas below can capture: clang 14
                                                   // does not capture structured bindings)
    AttentionSpec sparse = dense;
    sparse.sparsity = Sparsity::block_sparse;
    sparse.block_size = pattern.block_size();
    args.pattern = &pattern;
    const PatternStats stats = pattern.stats();
    const double flops = attention_forward_flops(sparse, args);
    auto add_row = [&](Attention& attention, const std::string& kernel) {
      attention.prepare(pattern);
      const auto [ms, dense_now_ms] = paired_median_gpu_ms(o.warmup, o.iterations, [&] { attention.forward(args); },
                                                           [&] { dense_attention.forward(dense_args); }, o.queued);
      const double tflops = flops / ms / 1e9;
      std::vector<std::string> row = {
          kernel, fmt::format("{:.3f}", stats.density), fmt::format("{:.1f}", stats.mean_per_row),
          fmt::format("{:.3f} ms", ms), fmt::format("{:.0f}", tflops),
          fmt::format("{:.0f}%", 100 * tflops / kH100PeakTflops), fmt::format("{:.2f}x", dense_now_ms / ms),
          stats.density > 0 ? fmt::format("{:.2f}", ms / (dense_now_ms * stats.density)) : "-",
          key(attention.forward_config(pattern, o.heads, heads_kv))};
      // A walk or query tiles asked that this pattern's backward cannot take: checked (nothing timed)
      // before its backward columns, which then say so.
      bool refused = false;
      if (o.backward && (walk_asked || o.query_tiles != 0)) try {
          backward_args_for(&pattern);
          attention.backward_walk(bargs);
        } catch (const InvalidArgument& e) {
          refusals.emplace_back(kernel, e.what());
          refused = true;
        }
      for (auto& cell : backward_cells(attention, &pattern, flops, refused)) row.push_back(cell);
      row.push_back(host_cell(attention, &pattern, refused));
      table.add(row);
    };
    Attention runtime(sparse, config);
    add_row(runtime, fmt::format("bsr {} ({})", pattern.block_size(), label));
    if (o.baked) {
      Attention baked(sparse, pattern, config);
      add_row(baked, fmt::format("baked {} ({})", pattern.block_size(), label));
    }
    args.pattern = nullptr;
  }
  table.print();
  for (const auto& [row, why] : refusals) fmt::print("{}: backward not run: {}\n", row, why);
  fmt::print("TFLOP/s count 4*D per (query, key) pair the mask allows, over the active blocks only.\n"
             "'vs dense x density' is the time over (dense time x density): 1.00 is perfect scaling.\n"
             "A row's 'vs dense' columns use the dense kernels timed alternately with the row's (a, b, a, b, ..),\n"
             "so both see the same clocks: an H100's drift by several percent over a run as it warms.\n"
             "'host us' is how long one call keeps the calling thread (checks, lookups, launches), the GPU idle before it.\n");
  if (o.backward)
    fmt::print("fwd+bwd is one step: the forward then the backward, back to back between one pair of events, as in\n"
               "training ('in it' splits it). It differs from the two timed apart, which pay the host's launch\n"
               "latency twice and whose ends miss what each leaves to the next (the L2's write-backs, say).\n"
               "dQ: summed atomically or by a pass of its own; 'gathered': the pattern ran the gathered backward\n"
               "(pattern blocks of 16, 32 and 64, a block a CTA); 'packed': the 128-key pass filled its query tiles\n"
               "from the blocks its keys see (blocks narrower than the tiles); neither: contiguous query tiles\n"
               "(--walk tiles|packed|gathered asks one of the pattern rows; SJIT_BACKWARD_WALK=... forces one where it exists);\n"
               "'64-query': at d = 64 the dK/dV pass ran 64-query tiles (blocks of 64, and of 16 or 32 on short walks;\n"
               "128 otherwise; --query-tiles 64|128 asks one of the pattern rows).\n"
               "'bwd vs dense': the dense backward's time over the row's, the two timed alternately (a, b, a, b, ..);\n"
               "'bwd' is the row's timed apart, as 'fwd+bwd vs dense' compares with the dense row's step, timed first.\n");
  return 0;
}

}  // namespace

Runner add_bench_attention(CLI::App& bench) {
  auto* cmd = bench.add_subcommand("attention", "Attention forward (and --backward): dense and block-sparse time, TFLOP/s, speedup");
  auto o = std::make_shared<AttentionBenchOptions>();
  cmd->add_option("--batch", o->batch, "Batch (default 2)");
  cmd->add_option("--heads", o->heads, "Query heads (default 16)");
  cmd->add_option("--heads-kv", o->heads_kv, "K/V heads (default: --heads)");
  cmd->add_option("--seq", o->seq, "Query length (default 8192)");
  cmd->add_option("--seq-k", o->seq_k, "Key length (default: --seq)");
  cmd->add_option("--d", o->head_dim, "Head dim (default 128)");
  cmd->add_option("--dtype", o->dtype, "bf16 | f16");
  cmd->add_option("--causal", o->causal, "none | tl | br");
  cmd->add_option("--block", o->block, "Pattern block size (default 128)");
  cmd->add_option("--density", o->densities, "Densities of random patterns (diagonal + random key blocks)")
      ->delimiter(',');
  cmd->add_option("--pattern", o->pattern_file, "A pattern file (BlockPattern::save) instead of random patterns");
  cmd->add_option("--window", o->window,
                  "BEFORE,AFTER: a sliding window of key blocks around the diagonal instead of random patterns")
      ->delimiter(',')
      ->expected(2)
      ->excludes("--pattern");
  cmd->add_flag("--baked", o->baked, "Also time the pattern baked into the kernel");
  cmd->add_flag("--per-head", o->per_head, "A different random pattern for every head");
  cmd->add_flag("--backward", o->backward, "Also time the backward (dQ, dK, dV) and forward + backward");
  cmd->add_flag("--deterministic", o->deterministic, "Backward in deterministic mode (a dQ pass of its own, no atomics)");
  cmd->add_option("--dq", o->dq,
                  "With --backward: sum dQ this way, atomic or pass (default: chosen per call; "
                  "AttentionBackwardArgs::dq_summation)");
  cmd->add_option("--walk", o->walk,
                  "How the pattern rows' backward walks their queries: tiles | packed | gathered (default: chosen "
                  "per call; AttentionBackwardArgs::walk). A row that cannot take it says why under the table");
  cmd->add_option("--query-tiles", o->query_tiles,
                  "The pattern rows' dK/dV query tiles: 64 | 128 (default: chosen per call; only d = 64 with pattern "
                  "blocks of 16 or 32 has both; AttentionBackwardArgs::query_tile_cols)");
  cmd->add_option("--last-round", o->last_round,
                  "The persistent kernel's (wgmma_ws) last round of CTAs: auto, whole (every item on one CTA) or split "
                  "(its items shared out by key tiles)");
  cmd->add_option("--config", o->config, "Tiling, e.g. warps=4,mt=2,bn=64,stages=2,qreg=0 (default: chosen)");
  cmd->add_flag("--queued", o->queued,
                "Enqueue every timed run before waiting (each with its own events), so the host's launch latency "
                "hides behind the GPU's work as in a training loop; by default each run is timed alone");
  cmd->add_flag("--graph", o->graph,
                "With --backward, also time the forward and backward captured into one CUDA graph and replayed "
                "(the 'fwd+bwd graph' column), alternately with the same calls made directly ('calls / graph')");
  cmd->add_option("--iters", o->iterations, "Timed runs (median reported)");
  cmd->add_option("--warmup", o->warmup, "Untimed runs first");
  return [=] { return cmd->parsed() ? run_attention(*o) : -1; };
}

}  // namespace sjit::tool

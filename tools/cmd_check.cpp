// sjit check SPEC...: runs each spec's kernels on fresh random inputs on this GPU and compares them with
// the float64 reference, with the GPU tests' bounds: what `sjit demo` does for its fixed set, for the
// specs, shapes, patterns and tilings a user has.
#include <fmt/format.h>

#include <memory>
#include <optional>
#include <random>
#include <variant>

#include "demo.h"

namespace sjit::tool {
namespace {

struct CheckOptions {
  std::vector<std::string> specs;
  std::vector<std::int64_t> shape;  // B,Hq,Hkv,Sq,Sk
  double density = 0.25;
  std::string pattern_file;
  std::string config;
  bool backward = false;
  std::int64_t rows = 64;
  std::uint64_t seed = 0;
};

using AnySpec = std::variant<RowNormSpec, AttentionSpec, E23Spec>;

// What one spec's check ran, and how it came out.
struct Checked {
  std::string runs, max_error, bound, result;
  bool ok = false;
};

std::string verdict(const demo::Outcome& o) {
  return fmt::format("{} ({:.0f}% of the bound){}", o.ok() ? "ok" : "MISMATCH", 100 * o.worst,
                     o.note.empty() ? "" : ", " + o.note);
}

// The float64 reference's FLOPs for an attention shape: two products of Sq x Sk x D a head for the
// forward, five with the backward.
double reference_flops(const demo::AttentionCheckShape& s, int head_dim, bool backward) {
  return (backward ? 5.0 : 2.0) * 2 * double(s.batch * s.heads_q) * double(s.seq_q) * double(s.seq_k) * head_dim;
}

Checked check_attention(const AttentionSpec& spec, const CheckOptions& o, const AttentionConfig& config,
                        std::mt19937_64& rng) {
  demo::AttentionCheckShape shape;
  if (!o.shape.empty()) shape = {o.shape[0], o.shape[1], o.shape[2], o.shape[3], o.shape[4]};
  // A pattern for block-sparse and baked specs: the file's, or a random one of the spec's block size.
  std::optional<BlockPattern> pattern;
  std::string pattern_note;
  if (spec.sparsity != Sparsity::dense) {
    if (!o.pattern_file.empty()) {
      pattern = BlockPattern::load(o.pattern_file);
      pattern_note = fmt::format(", pattern {}", o.pattern_file);
    } else if (spec.sparsity == Sparsity::baked) {
      throw InvalidArgument(fmt::format("{}: a baked spec needs its pattern: give it with --pattern FILE", key(spec)));
    } else {
      pattern = patterns::random(spec.block_size, shape.seq_q, shape.seq_k, o.density, rng());
      pattern_note = fmt::format(", random {:g} of blocks of {}", o.density, spec.block_size);
    }
  } else if (!o.pattern_file.empty()) {
    throw InvalidArgument(fmt::format("{}: --pattern is for block-sparse (sparsity=bsr) and baked specs", key(spec)));
  }
  const double flops = reference_flops(shape, spec.head_dim, o.backward);
  if (flops > 2e10)
    fmt::print("(the float64 reference takes {:.0f} GFLOP on the CPU here: a while)\n", flops / 1e9);
  const BlockPattern* p = pattern ? &*pattern : nullptr;
  const demo::Outcome out = o.backward ? demo::check_attention_backward(spec, shape, p, config, rng)
                                       : demo::check_attention_forward(spec, shape, p, config, rng);
  return {fmt::format("{} B{} Hq{} Hkv{} Sq{} Sk{}{}{}", o.backward ? "fwd+bwd" : "fwd", shape.batch, shape.heads_q,
                      shape.heads_kv, shape.seq_q, shape.seq_k, pattern_note,
                      o.config.empty() ? "" : ", config " + o.config),
          fmt::format("{:.1e}", out.max_error), demo::attention_bound(spec.dtype, o.backward),
          verdict(out), out.ok()};
}

// Parses `text` by its op (throws InvalidSpec naming the field, or InvalidArgument for an unknown op).
AnySpec parse_spec(const std::string& text) {
  if (text.starts_with("rownorm:")) return parse_rownorm(text);
  if (text.starts_with("attention:")) return parse_attention(text);
  if (text.starts_with("e23:")) return parse_e23(text);
  throw InvalidArgument(fmt::format("spec '{}': the op comes first, rownorm:, attention: or e23: (sjit compile --list)",
                                    text));
}

Checked check_one(const AnySpec& parsed, const CheckOptions& o, const AttentionConfig& config, std::mt19937_64& rng) {
  if (const auto* rownorm = std::get_if<RowNormSpec>(&parsed)) {
    const RowNormSpec& spec = *rownorm;
    const demo::RowNormOutcome out = demo::check_rownorm(spec, o.rows, rng);
    const bool ok = out.ok(spec.dtype);
    return {fmt::format("fwd+bwd {} rows", o.rows), fmt::format("{:.1e}", out.max_error),
            demo::rownorm_bound(spec.dtype),
            fmt::format("{} (|sum-1| {:.1e}, support {:.1f}/{})", ok ? "ok" : "MISMATCH", out.worst_sum,
                        out.mean_support, spec.n),
            ok};
  }
  if (const auto* attention = std::get_if<AttentionSpec>(&parsed)) return check_attention(*attention, o, config, rng);
  {
    const E23Spec& spec = std::get<E23Spec>(parsed);
    const demo::Outcome out = o.backward ? demo::check_e23_backward(spec, rng) : demo::check_e23_forward(spec, rng);
    return {fmt::format("{} {}", o.backward ? "fwd+bwd" : "fwd", demo::e23_check_run()),
            fmt::format("{:.1e}", out.max_error), demo::e23_bound(spec.dtype, o.backward), verdict(out),
            out.ok()};
  }
}

}  // namespace

Runner add_check(CLI::App& app) {
  auto* cmd = app.add_subcommand("check", "Run specs' kernels on this GPU and compare them with the float64 reference");
  auto o = std::make_shared<CheckOptions>();
  cmd->add_option("specs", o->specs, "Spec key texts: rownorm:..., attention:..., e23:...")->required();
  cmd->add_option("--shape", o->shape, "attention: B,Hq,Hkv,Sq,Sk (default 1,2,2,512,512)")->delimiter(',');
  cmd->add_option("--density", o->density, "attention, bsr specs: density of the random pattern (default 0.25)");
  cmd->add_option("--pattern", o->pattern_file, "attention, bsr or baked specs: a pattern file instead");
  cmd->add_option("--config", o->config, "attention: the tiling to check, e.g. warps=8,mt=1,bn=128,stages=2,qreg=0,path=wgmma_ws");
  cmd->add_flag("--backward", o->backward, "attention and e23: also the backward");
  cmd->add_option("--rows", o->rows, "rownorm: rows to check (default 64)");
  CLI::Option* seed_option = cmd->add_option("--seed", o->seed, "The random inputs' seed (default: a fresh one, printed)");
  return [=] {
    require_at_least("--rows", o->rows, 1);
    if (!(o->density > 0 && o->density <= 1))
      throw InvalidArgument(fmt::format("--density {}: give a density in (0, 1]", o->density));
    if (!o->shape.empty() && o->shape.size() != 5)
      throw InvalidArgument(fmt::format("--shape has {} numbers: give B,Hq,Hkv,Sq,Sk", o->shape.size()));
    // Every argument refused or taken before any GPU work.
    const AttentionConfig config =
        o->config.empty() ? AttentionConfig{} : parse_flag("--config", o->config, parse_attention_config);
    std::vector<AnySpec> specs;
    for (const std::string& text : o->specs) specs.push_back(parse_spec(text));
    if (!gpu_available()) throw NoDevice("sjit check needs a GPU: " + system_info().no_gpu_reason);
    const std::uint64_t seed = seed_option->count() > 0 ? o->seed : std::random_device{}() * 0x9E3779B97F4A7C15ull;
    std::mt19937_64 rng(seed);
    fmt::print("device {}; random inputs from --seed {}\n", describe_device(current_device()), seed);
    Table table({"spec", "runs", "max err", "bound", "result"});
    int failures = 0;
    for (std::size_t i = 0; i < specs.size(); ++i) {
      const Checked c = check_one(specs[i], *o, config, rng);
      failures += c.ok ? 0 : 1;
      table.add({o->specs[i], c.runs, c.max_error, c.bound, c.result});
    }
    table.print();
    fmt::print("{} of {} matched the float64 reference.\n", o->specs.size() - failures, o->specs.size());
    return failures == 0 ? 0 : 1;
  };
}

}  // namespace sjit::tool

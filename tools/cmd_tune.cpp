// sjit tune OP SPEC... : time every layout of each spec on this GPU and store the winners
// (rownorm at --rows, attention at --shape; attention --backward: how its backward sums dQ, and with
// --walk how it walks the --pattern);
// sjit tune --show | --export FILE | --import FILE : the
// tuning database.
#include <fmt/format.h>
#include <unistd.h>

#include <fstream>
#include <optional>
#include <sstream>

#include "commands.h"

namespace sjit::tool {
namespace {

void print_report(const TuneReport& r) {
  fmt::print("\n{}  rows {} ({})\n", key(r.spec), r.rows, r.bucket);
  Table table({"config", "time", "GB/s", "vs default", "note"});
  for (const TuneCandidate& c : r.candidates) {
    const bool is_default = key(c.config) == key(r.default_config);
    const bool is_winner = key(c.config) == key(r.winner);
    if (!c.rejected.empty()) {
      table.add({key(c.config), "-", "-", "-", "rejected: " + c.rejected.substr(0, 100)});
      continue;
    }
    std::string note = is_winner && is_default ? "default, winner" : is_winner ? "winner" : is_default ? "default" : "";
    table.add({key(c.config), fmt::format("{:.1f} us", c.median_us), fmt::format("{:.0f}", c.gb_per_s),
               fmt::format("{:.2f}x", r.default_us / c.median_us), note});
  }
  table.print();
  double worst = 0;
  for (const TuneCandidate& c : r.candidates) worst = std::max(worst, c.rejected.empty() ? c.median_us : 0.0);
  fmt::print("default {:.1f} us, tuned {:.1f} us ({:.2f}x, {}), worst {:.1f} us; {}\n", r.default_us, r.winner_us,
             r.default_us / r.winner_us, key(r.winner), worst, r.stored ? "stored in the tuning database" : "NOT stored");
}

// A rejection as a table cell: resolve()'s refusal without the config and spec it repeats
// ("attention config '...' for '...': needs ..."), a budget note as it is, the rest cut short.
std::string short_reason(const std::string& rejected) {
  if (rejected.starts_with("not timed")) return rejected;
  std::string reason = rejected;
  if (reason.starts_with("attention config '"))
    if (const std::size_t at = reason.rfind("': "); at != std::string::npos) reason = "resolve: " + reason.substr(at + 3);
  return "rejected: " + reason.substr(0, 100);
}

void print_report(const AttentionTuneReport& r) {
  const AttentionTuneShape& s = r.shape;
  fmt::print("\n{}  B={} Hq={} Hkv={} Sq={} Sk={}{} ({}); compiled in {:.0f} s, timed in {:.0f} s\n", key(r.spec),
             s.batch, s.heads_q, s.heads_kv, s.seq_q, s.seq_k,
             r.spec.sparsity == Sparsity::dense ? "" : fmt::format(" density {:.3f}", r.density), r.bucket, r.compile_s,
             r.timing_s);
  Table table({"config", "time", "TFLOP/s", "vs default", "note"});
  int rejected = 0;
  for (const AttentionTuneCandidate& c : r.candidates) {
    const bool is_default = key(c.config) == key(r.default_config), is_winner = key(c.config) == key(r.winner);
    if (!c.rejected.empty()) {
      ++rejected;
      table.add({key(c.config), "-", "-", "-", short_reason(c.rejected)});
      continue;
    }
    const std::string note = is_winner && is_default ? "default, winner" : is_winner ? "winner" : is_default ? "default" : "";
    table.add({key(c.config), fmt::format("{:.3f} ms", c.median_us / 1e3), fmt::format("{:.0f}", c.tflops),
               fmt::format("{:.2f}x", r.default_us / c.median_us), note});
  }
  table.print();
  fmt::print("default {} {:.3f} ms; tuned {} {:.3f} ms ({:.2f}x); {} of {} candidates timed; {}\n",
             key(r.default_config), r.default_us / 1e3, key(r.winner), r.winner_us / 1e3, r.default_us / r.winner_us,
             int(r.candidates.size()) - rejected, r.candidates.size(),
             !r.stored ? "NOT stored" : r.note.empty() ? "stored in the tuning database" : r.note);
}

void print_report(const DqTuneReport& r) {
  const AttentionTuneShape& s = r.shape;
  fmt::print("\n{}  B={} Hq={} Hkv={} Sq={} Sk={}{}: {:.1f} key tiles a query row ({})\n", key(r.spec), s.batch,
             s.heads_q, s.heads_kv, s.seq_q, s.seq_k,
             r.spec.sparsity == Sparsity::dense ? "" : fmt::format(" density {:.3f}", r.density), r.key_tiles_per_row,
             r.bucket);
  Table table({"dQ summed", "backward", "note"});
  for (const DqSummation way : {DqSummation::atomic, DqSummation::pass}) {
    const std::string note = std::string(way == r.winner ? "winner" : "") +
                             (way == r.winner && way == r.chosen_before ? ", " : "") +
                             (way == r.chosen_before ? "chosen before tuning" : "");
    table.add({std::string(name(way)), fmt::format("{:.3f} ms", (way == DqSummation::atomic ? r.atomic_us : r.pass_us) / 1e3),
               note});
  }
  table.print();
  fmt::print("dQ {} wins ({:.2f}x over {}); {}\n", name(r.winner),
             std::max(r.atomic_us, r.pass_us) / std::min(r.atomic_us, r.pass_us),
             name(r.winner == DqSummation::atomic ? DqSummation::pass : DqSummation::atomic),
             r.stored ? "stored in the tuning database (used where SJIT_AUTOTUNE is on or force)" : "NOT stored");
}

void print_report(const WalkTuneReport& r) {
  const AttentionTuneShape& s = r.shape;
  fmt::print("\n{}  B={} Hq={} Hkv={} Sq={} Sk={}, pattern {:016x} (density {:.3f}; {})\n", key(r.spec), s.batch,
             s.heads_q, s.heads_kv, s.seq_q, s.seq_k, r.pattern_digest, r.density, r.bucket);
  Table table({"walk", "query tiles", "dQ summed", "backward", "vs chosen before", "note"});
  for (std::size_t i = 0; i < r.candidates.size(); ++i) {
    const WalkTuneCandidate& c = r.candidates[i];
    const std::string note = std::string(i == r.winner ? "winner" : "") + (i == r.winner && i == 0 ? ", " : "") +
                             (i == 0 ? "chosen before tuning" : "");
    table.add({std::string(name(c.walk)), c.query_tile_cols ? std::to_string(c.query_tile_cols) : "-",
               std::string(name(c.dq)), fmt::format("{:.3f} ms", c.median_us / 1e3),
               fmt::format("{:.2f}x", r.candidates[0].median_us / c.median_us), note});
  }
  table.print();
  fmt::print("{} ways timed ({} asked that this pattern cannot take); {}\n", r.candidates.size(), r.not_runnable,
             r.stored ? "the winner is stored in the tuning database (used where SJIT_AUTOTUNE is on or force)"
                      : "NOT stored");
}

// "B,Hq,Hkv,Sq,Sk" as given to --shape.
AttentionTuneShape attention_shape(const std::vector<std::int64_t>& sizes, double density) {
  if (sizes.size() != 5)
    throw InvalidArgument(fmt::format("--shape takes 5 sizes B,Hq,Hkv,Sq,Sk; {} given", sizes.size()));
  AttentionTuneShape shape;
  shape.batch = sizes[0], shape.heads_q = sizes[1], shape.heads_kv = sizes[2], shape.seq_q = sizes[3];
  shape.seq_k = sizes[4];
  shape.density = density;
  return shape;
}

// A progress bar on a terminal, else one line per step (logs).
std::function<void(int, int, const std::string&)> progress_printer() {
  const bool terminal = isatty(STDERR_FILENO);
  return [terminal](int done, int total, const std::string& what) {
    if (terminal) {
      const int filled = 30 * done / total;
      fmt::print(stderr, "\r[{:#<{}}{:.<{}}] {}/{} {:<56}", "", filled, "", 30 - filled, done, total, what);
      if (done == total) fmt::print(stderr, "\n");
    } else {
      fmt::print(stderr, "{}/{} {}\n", done, total, what);
    }
  };
}

// Every entry, rownorm and attention alike (the spec's key text starts with its op).
void show_database() {
  fmt::print("tuning database: {}\n", tuning_dir());
  Table table({"device", "spec", "bucket", "winner", "time", "default", "default time", "speedup", "measured",
               "kernels"});
  int passed_over = 0;
  for (const TunedEntry& e : tuning_entries()) {
    passed_over += e.current_kernels ? 0 : 1;
    table.add({e.device, e.spec_key, e.bucket, e.winner_config, fmt::format("{:.1f} us", e.winner_us), e.default_config,
               fmt::format("{:.1f} us", e.default_us), fmt::format("{:.2f}x", e.default_us / e.winner_us),
               e.measured_at, e.current_kernels ? "these" : "other (passed over)"});
  }
  table.print();
  if (passed_over > 0)
    fmt::print("{} entr{} measured with other kernels (another sparsejit): launches pass over them until tuned again\n",
               passed_over, passed_over == 1 ? "y was" : "ies were");
}

}  // namespace

Runner add_tune(CLI::App& app) {
  auto* cmd = app.add_subcommand("tune", "Autotune kernels on this GPU; show, export or import the tuning database");
  auto op = std::make_shared<std::string>();
  auto specs = std::make_shared<std::vector<std::string>>();
  auto rows = std::make_shared<std::vector<std::int64_t>>();
  auto shape = std::make_shared<std::vector<std::int64_t>>();
  auto density = std::make_shared<double>(0.1);
  auto pattern_file = std::make_shared<std::string>();
  auto budget = std::make_shared<double>(60);
  auto iterations = std::make_shared<int>(TuneOptions{}.iterations);
  auto show = std::make_shared<bool>(false);
  auto export_file = std::make_shared<std::string>();
  auto import_file = std::make_shared<std::string>();
  auto backward = std::make_shared<bool>(false);
  auto walk = std::make_shared<bool>(false);
  cmd->add_option("op", *op, "The op: rownorm or attention (the forward's tiling; with --backward, how dQ is summed)");
  cmd->add_option("specs", *specs,
                  "Spec key texts, e.g. rownorm:kind=entmax,alpha=1.5,n=64 or "
                  "attention:d=128,dtype=bf16,causal=none,sparsity=dense,pass=fwd");
  cmd->add_option("--rows", *rows, "rownorm: row counts to tune for (default: 16M elements' worth)")->delimiter(',');
  cmd->add_option("--shape", *shape, "attention: B,Hq,Hkv,Sq,Sk to tune at (required)")->delimiter(',');
  cmd->add_option("--density", *density, "attention, bsr specs: density of the random pattern (default 0.1)");
  cmd->add_option("--pattern", *pattern_file, "attention, bsr or baked specs: a pattern file (BlockPattern::save)");
  cmd->add_flag("--backward", *backward,
                "attention: time the backward with dQ atomic and with the dQ pass, and store the faster, "
                "instead of the forward's tilings");
  cmd->add_flag("--walk", *walk,
                "attention --backward with --pattern: time every way the backward can walk that pattern (walk, "
                "query tiles, dQ summed), and store the fastest for it");
  cmd->add_option("--budget-s", *budget, "Seconds of timing per spec and size");
  cmd->add_option("--iters", *iterations, "Timed runs per candidate (the median is kept)");
  cmd->add_flag("--show", *show, "List the tuning database");
  cmd->add_option("--export", *export_file, "Write the whole database to one JSON file");
  cmd->add_option("--import", *import_file, "Read a file written by --export");
  return [=] {
    if (*show) {
      show_database();
      return 0;
    }
    if (!export_file->empty()) {
      std::ofstream(*export_file) << export_tuning();
      fmt::print("wrote {} entries to {}\n", tuning_entries().size(), *export_file);
      return 0;
    }
    if (!import_file->empty()) {
      std::ifstream in(*import_file);
      if (!in) throw InvalidArgument(fmt::format("cannot read {}", *import_file));
      std::stringstream text;
      text << in.rdbuf();
      fmt::print("imported {} entries into {}\n", import_tuning(text.str()), tuning_dir());
      return 0;
    }
    if (*op != "rownorm" && *op != "attention")
      throw InvalidArgument(fmt::format("op '{}' cannot be tuned: the ops are rownorm and attention", *op));
    if (specs->empty()) throw InvalidArgument("tune needs at least one spec");
    if (*op == "attention") {
      AttentionTuneShape tune_shape = attention_shape(*shape, *density);
      std::optional<BlockPattern> pattern;
      if (!pattern_file->empty()) tune_shape.pattern = &pattern.emplace(BlockPattern::load(*pattern_file));
      TuneOptions options;
      options.budget_s = *budget;
      options.iterations = *iterations;
      options.progress = progress_printer();
      if (*walk && !*backward) throw InvalidArgument("--walk tunes how the backward walks a pattern: add --backward");
      if (*walk && !pattern) throw InvalidArgument("--walk tunes the backward for one pattern: give it with --pattern FILE");
      for (const std::string& text : *specs) {
        if (*walk) print_report(tune_backward_walk(parse_attention(text), tune_shape, options));
        else if (*backward) print_report(tune_dq_summation(parse_attention(text), tune_shape, options));
        else print_report(tune_attention(parse_attention(text), tune_shape, options));
      }
      return 0;
    }
    if (*backward || *walk)
      throw InvalidArgument("--backward and --walk tune attention's backward: use them with op attention");
    const std::vector<std::int64_t> sizes = rows->empty() ? std::vector<std::int64_t>{0} : *rows;
    for (const std::string& text : *specs)
      for (std::int64_t r : sizes) {
        TuneOptions options;
        options.rows = r;
        options.budget_s = *budget;
        options.iterations = *iterations;
        options.progress = progress_printer();
        print_report(tune_rownorm(parse_rownorm(text), options));
      }
    return 0;
  };
}

}  // namespace sjit::tool

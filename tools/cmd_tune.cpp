// sjit tune OP SPEC... : time every layout of each spec on this GPU and store the winners;
// sjit tune --show | --export FILE | --import FILE : the tuning database.
#include <fmt/format.h>
#include <unistd.h>

#include <fstream>
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

void show_database() {
  fmt::print("tuning database: {}\n", tuning_dir());
  Table table({"device", "spec", "bucket", "winner", "time", "default", "default time", "measured"});
  for (const TunedEntry& e : tuning_entries())
    table.add({e.device, e.spec_key, e.bucket, e.winner_config, fmt::format("{:.1f} us", e.winner_us), e.default_config,
               fmt::format("{:.1f} us", e.default_us), e.measured_at});
  table.print();
}

}  // namespace

Runner add_tune(CLI::App& app) {
  auto* cmd = app.add_subcommand("tune", "Autotune kernels on this GPU; show, export or import the tuning database");
  auto op = std::make_shared<std::string>();
  auto specs = std::make_shared<std::vector<std::string>>();
  auto rows = std::make_shared<std::vector<std::int64_t>>();
  auto budget = std::make_shared<double>(60);
  auto show = std::make_shared<bool>(false);
  auto export_file = std::make_shared<std::string>();
  auto import_file = std::make_shared<std::string>();
  cmd->add_option("op", *op, "The op: rownorm");
  cmd->add_option("specs", *specs, "Spec key texts, e.g. rownorm:kind=entmax,alpha=1.5,n=64");
  cmd->add_option("--rows", *rows, "Row counts to tune for (default: 16M elements' worth)")->delimiter(',');
  cmd->add_option("--budget-s", *budget, "Seconds of timing per spec and size");
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
    if (*op != "rownorm") throw InvalidArgument(fmt::format("op '{}' cannot be tuned: the ops are rownorm", *op));
    if (specs->empty()) throw InvalidArgument("tune needs at least one spec");
    const std::vector<std::int64_t> sizes = rows->empty() ? std::vector<std::int64_t>{0} : *rows;
    const bool terminal = isatty(STDERR_FILENO);
    for (const std::string& text : *specs)
      for (std::int64_t r : sizes) {
        TuneOptions options;
        options.rows = r;
        options.budget_s = *budget;
        options.progress = [&](int done, int total, const std::string& what) {
          if (terminal) {
            const int filled = 30 * done / total;
            fmt::print(stderr, "\r[{:#<{}}{:.<{}}] {}/{} {:<40}", "", filled, "", 30 - filled, done, total, what);
            if (done == total) fmt::print(stderr, "\n");
          } else {
            fmt::print(stderr, "tuned {}/{} {}\n", done, total, what);
          }
        };
        print_report(tune_rownorm(parse_rownorm(text), options));
      }
    return 0;
  };
}

}  // namespace sjit::tool

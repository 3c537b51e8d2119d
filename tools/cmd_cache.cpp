// sjit cache ls | stats | verify [--fix] | prune [--max-size] | clear
#include <fmt/format.h>

#include "commands.h"

namespace sjit::tool {
namespace {

std::string human_bytes(std::uint64_t b) {
  if (b >= (1ull << 30)) return fmt::format("{:.2f} GiB", double(b) / (1ull << 30));
  if (b >= (1ull << 20)) return fmt::format("{:.1f} MiB", double(b) / (1ull << 20));
  if (b >= (1ull << 10)) return fmt::format("{:.1f} KiB", double(b) / (1ull << 10));
  return fmt::format("{} B", b);
}

std::uint64_t parse_size(const std::string& text) {
  std::size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  const std::string suffix = text.substr(used);
  const double unit = suffix == "" ? 1 : suffix == "K" ? 1024.0 : suffix == "M" ? 1048576.0 : suffix == "G" ? 1073741824.0 : -1;
  if (used == 0 || unit < 0 || value < 0)
    throw InvalidArgument(fmt::format("size '{}' is not a number of bytes with an optional K, M or G suffix", text));
  return std::uint64_t(value * unit);
}

std::string_view mode_name(CacheMode m) { return m == CacheMode::rw ? "rw" : m == CacheMode::ro ? "ro" : "off"; }

}  // namespace

Runner add_cache(CLI::App& app) {
  auto* cmd = app.add_subcommand("cache", "Inspect and maintain the disk kernel cache");
  cmd->require_subcommand(1);
  auto* ls = cmd->add_subcommand("ls", "List the entries");
  auto* stats = cmd->add_subcommand("stats", "Size, entries, location and mode");
  auto* verify = cmd->add_subcommand("verify", "Check every entry; --fix removes bad ones");
  auto fix = std::make_shared<bool>(false);
  verify->add_flag("--fix", *fix, "Remove the bad entries found");
  auto* prune = cmd->add_subcommand("prune", "Evict least recently used entries down to a size");
  auto max_size = std::make_shared<std::string>();
  prune->add_option("--max-size", *max_size, "Target size, e.g. 500M (default: the cache's cap)");
  auto* clear = cmd->add_subcommand("clear", "Remove every entry");
  return [=] {
    if (ls->parsed()) {
      Table table({"key", "arch", "size", "compile", "created"});
      for (const CacheEntryInfo& e : cache_entries())
        table.add({e.key_text, e.arch, human_bytes(e.bytes), fmt::format("{:.0f} ms", e.compile_ms), e.created});
      table.print();
    } else if (stats->parsed()) {
      const CacheStats s = cache_stats();
      fmt::print("folder     {}\nmode       {}{}\nentries    {}\nsize       {} of {}\n", s.dir, mode_name(s.mode),
                 s.mode == CacheMode::rw && !s.writable ? " (writes failed: read-only use)" : "", s.entries,
                 human_bytes(s.bytes), human_bytes(s.max_bytes));
    } else if (verify->parsed()) {
      const CacheVerifyReport r = cache_verify(*fix);
      for (const std::string& p : r.problems) fmt::print("{}\n", p);
      fmt::print("{} entries checked, {} problem(s){}\n", r.checked, r.problems.size(),
                 *fix ? fmt::format(", {} removed", r.removed) : "");
      return r.problems.empty() || *fix ? 0 : 1;
    } else if (prune->parsed()) {
      const std::uint64_t target = max_size->empty() ? cache_settings().max_bytes : parse_size(*max_size);
      fmt::print("{} entries removed; {} left\n", cache_prune(target), human_bytes(cache_stats().bytes));
    } else if (clear->parsed()) {
      const std::uint64_t before = cache_stats().entries;
      cache_clear();
      fmt::print("{} entries removed from {}\n", before, cache_settings().dir);
    }
    return 0;
  };
}

}  // namespace sjit::tool

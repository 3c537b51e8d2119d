// sjit: the sparsejit command. Thin: CLI11 parses, the public API does the work, fmt prints.
#include <fmt/format.h>

#include "commands.h"

int main(int argc, char** argv) {
  CLI::App app{"sjit: specialize, compile, cache and run sparse-attention kernels"};
  app.require_subcommand(1);
  std::vector<std::pair<CLI::App*, sjit::tool::Runner>> commands;
  for (auto add : {sjit::tool::add_info, sjit::tool::add_compile, sjit::tool::add_warmup, sjit::tool::add_cache,
                   sjit::tool::add_pattern, sjit::tool::add_tune, sjit::tool::add_bench, sjit::tool::add_check, sjit::tool::add_demo}) {
    const std::size_t before = app.get_subcommands({}).size();
    sjit::tool::Runner run = add(app);
    commands.emplace_back(app.get_subcommands({})[before], std::move(run));
  }
  CLI11_PARSE(app, argc, argv);
  try {
    for (auto& [cmd, run] : commands)
      if (cmd->parsed()) return run();
  } catch (const sjit::CompileError& e) {
    fmt::print(stderr, "sjit: {}\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "sjit: {}\n", e.what());
    return 1;
  }
  return 0;
}

// Runs the sjit tool built with the tests (SJIT_TOOL_PATH, defined for the CPU suite) with `args`, and
// returns what it wrote to stdout and stderr; *status gets its exit code (-1 if it did not exit).
#pragma once

#include <fmt/format.h>
#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace sjit::test {

inline std::string run_tool(const std::string& args, int* status) {
  FILE* pipe = popen(fmt::format("'{}' {} 2>&1", SJIT_TOOL_PATH, args).c_str(), "r");
  std::string out;
  char buf[4096];
  for (std::size_t got; (got = std::fread(buf, 1, sizeof(buf), pipe)) > 0;) out.append(buf, got);
  const int raw = pclose(pipe);
  *status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  return out;
}

}  // namespace sjit::test

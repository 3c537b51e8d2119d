// `sjit bench attention` on the GPU: the walk and query tiles asked with --walk and --query-tiles run
// where a pattern row can take them, and a row that cannot says why under the table.
#include <catch2/catch.hpp>

#include <sstream>

#include "support/attention_support.h"
#include "support/run_tool.h"

using Catch::Matchers::Contains;

namespace {
// The line of `out` that holds `text` ("" if none).
std::string line_with(const std::string& out, const std::string& text) {
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);)
    if (line.find(text) != std::string::npos) return line;
  return "";
}
}  // namespace

TEST_CASE("sjit bench attention --walk and --query-tiles run where a pattern can take them, and say why not elsewhere",
          "[gpu][tool][attention][backward]") {
  const std::string shape = "--iters 2 --warmup 1 --batch 1 --heads 2 --seq 1024 --block 16 --backward";
  int status = -1;
  // Blocks of 16 at 0.25 take the packed walk when asked (by the rules they gather on Hopper); the
  // full pattern runs the dense kernels, which walk tiles, so it refuses.
  std::string out = sjit::test::run_tool(fmt::format("bench attention {} --d 64 --density 0.25,1 --walk packed", shape),
                                         &status);
  INFO(out);
  CHECK(status == 0);
  CHECK_THAT(out, Contains("--walk packed"));
  const std::string sparse_row = line_with(out, "bsr 16 (0.25)");
  const std::string full_row = line_with(out, "bsr 16 (1)");
  if (sjit::test::on_hopper("the packed walk of blocks of 16")) CHECK_THAT(sparse_row, Contains("packed"));
  CHECK_THAT(full_row, Contains("refused (below)"));
  CHECK_THAT(out, Contains("bsr 16 (1): backward not run: attention backward: walk = packed asked") &&
                      Contains("with every block active"));
  // 64-query tiles and 128-query tiles both exist at d = 64 only (with blocks of 16 or 32, on Hopper);
  // d = 128's dK/dV tiles have 64 queries.
  if (sjit::test::on_hopper("64-query dK/dV tiles")) {
    out = sjit::test::run_tool(fmt::format("bench attention {} --d 64 --density 0.25 --walk packed --query-tiles 64", shape),
                               &status);
    CHECK(status == 0);
    CHECK_THAT(line_with(out, "bsr 16 (0.25)"), Contains("64-query, packed"));
  }
  out = sjit::test::run_tool(fmt::format("bench attention {} --d 128 --density 0.25 --query-tiles 128", shape), &status);
  CHECK(status == 0);
  CHECK_THAT(line_with(out, "bsr 16 (0.25)"), Contains("refused (below)"));
  CHECK_THAT(out, Contains("bsr 16 (0.25): backward not run: attention backward: query_tile_cols = 128 asked"));
}

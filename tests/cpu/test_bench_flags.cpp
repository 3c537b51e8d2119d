// `sjit bench attention` checks its flags before it looks for a GPU, so a bad one is refused here too,
// with the flag, its value and what is allowed.
#include <catch2/catch.hpp>

#include "support/run_tool.h"

using Catch::Matchers::Contains;

TEST_CASE("sjit bench attention refuses a bad --walk or --query-tiles, and backward flags without --backward",
          "[tool][attention][backward]") {
  int status = 0;
  std::string out = sjit::test::run_tool("bench attention --backward --walk sideways", &status);
  CHECK(status != 0);
  CHECK_THAT(out, Contains("--walk sideways: use tiles, packed or gathered"));
  out = sjit::test::run_tool("bench attention --backward --query-tiles 96", &status);
  CHECK(status != 0);
  CHECK_THAT(out, Contains("--query-tiles 96: use 64 or 128"));
  for (const char* flag : {"--walk packed", "--query-tiles 64", "--dq atomic"}) {
    out = sjit::test::run_tool(fmt::format("bench attention {}", flag), &status);
    INFO(flag);
    CHECK(status != 0);
    CHECK_THAT(out, Contains("choose how the backward runs: add --backward"));
  }
}

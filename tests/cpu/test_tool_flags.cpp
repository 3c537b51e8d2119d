// `sjit bench attention` and `sjit check` check their flags before they look for a GPU, so a bad one is
// refused here too, with the flag, its value and what is allowed.
#include <catch2/catch.hpp>

#include <utility>

#include "sparsejit/device.h"
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

TEST_CASE("sjit check refuses a bad spec, shape, tiling or count before it looks for a GPU", "[tool]") {
  const std::pair<const char*, const char*> refusals[] = {
      {"check foo:x", "spec 'foo:x': the op comes first, rownorm:, attention: or e23:"},
      {"check attention:d=63", "head_dim = 63"},
      {"check attention:d=64 --shape 1,2", "--shape has 2 numbers: give B,Hq,Hkv,Sq,Sk"},
      {"check attention:d=64 --config bogus=1", "--config bogus=1:"},
      {"check rownorm:kind=softmax,n=64 --rows 0", "--rows 0: give at least 1"},
      {"check attention:d=64,sparsity=bsr,block=64 --density 2", "--density 2: give a density in (0, 1]"},
  };
  for (const auto& [args, message] : refusals) {
    int status = 0;
    const std::string out = sjit::test::run_tool(args, &status);
    INFO(args);
    CHECK(status != 0);
    CHECK_THAT(out, Contains(message));
  }
  if (!sjit::gpu_available()) {
    int status = 0;
    const std::string out = sjit::test::run_tool("check rownorm:kind=softmax,n=64", &status);
    CHECK(status != 0);
    CHECK_THAT(out, Contains("sjit check needs a GPU"));
  }
}

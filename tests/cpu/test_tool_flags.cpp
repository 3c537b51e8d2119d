// `sjit bench attention` and `sjit check` check their flags before they look for a GPU, so a bad one is
// refused here too, with the flag, its value and what is allowed.
#include <catch2/catch.hpp>

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
  int status = 0;
  std::string out = sjit::test::run_tool("check foo:x", &status);
  CHECK(status != 0);
  CHECK_THAT(out, Contains("spec 'foo:x': the op comes first, rownorm:, attention: or e23:"));
  out = sjit::test::run_tool("check attention:d=63", &status);
  CHECK(status != 0);
  CHECK_THAT(out, Contains("head_dim = 63"));
  out = sjit::test::run_tool("check attention:d=64 --shape 1,2", &status);
  CHECK(status != 0);
  CHECK_THAT(out, Contains("--shape has 2 numbers: give B,Hq,Hkv,Sq,Sk"));
  out = sjit::test::run_tool("check attention:d=64 --config bogus=1", &status);
  CHECK(status != 0);
  CHECK_THAT(out, Contains("--config bogus=1:"));
  out = sjit::test::run_tool("check rownorm:kind=softmax,n=64 --rows 0", &status);
  CHECK(status != 0);
  CHECK_THAT(out, Contains("--rows 0: give at least 1"));
  out = sjit::test::run_tool("check attention:d=64,sparsity=bsr,block=64 --density 2", &status);
  CHECK(status != 0);
  CHECK_THAT(out, Contains("--density 2: give a density in (0, 1]"));
  if (!sjit::gpu_available()) {
    out = sjit::test::run_tool("check rownorm:kind=softmax,n=64", &status);
    CHECK(status != 0);
    CHECK_THAT(out, Contains("sjit check needs a GPU"));
  }
}

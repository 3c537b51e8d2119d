// `sjit demo` without running anything: every kernel it needs, of every op family, specializes and
// compiles (for the GPU here, else sm_90a), and the tool says so and exits 0. The checks themselves
// run with a GPU (scripts/device-demo.sh).
#include <catch2/catch.hpp>

#include <sstream>

#include "support/run_tool.h"

using Catch::Matchers::Contains;

TEST_CASE("sjit demo --compile-only compiles a kernel of every op family and exits 0", "[demo][tool][nvrtc]") {
  int status = -1;
  const std::string out = sjit::test::run_tool("demo --compile-only", &status);
  INFO(out);
  CHECK(status == 0);
  CHECK_THAT(out, !Contains("FAILED") && !Contains("MISMATCH"));
  // A row for each: 24 normalizers, the dense and block-sparse attention forwards, the block-sparse
  // backward, the E23 forward with 1.5-entmax and softmax, and the softmax cell's backward.
  int rows = 0, rownorm = 0, attention = 0, e23 = 0;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    if (line.find("compiled (") == std::string::npos) continue;
    ++rows;
    rownorm += line.rfind("rownorm:", 0) == 0;
    attention += line.rfind("attention:", 0) == 0;
    e23 += line.rfind("e23:", 0) == 0;
  }
  CHECK(rownorm == 24);
  CHECK(attention == 3);
  CHECK(e23 == 3);
  CHECK(rows == rownorm + attention + e23);
  CHECK_THAT(out, Contains("sparsity=dense") && Contains("sparsity=bsr,block=64,pass=fwd") &&
                      Contains("sparsity=bsr,block=64,pass=bwd") && Contains("e23:kind=entmax,alpha=1.5") &&
                      Contains("e23:kind=softmax") && Contains("fwd+bwd"));
}

// The sjit tool on the GPU: `sjit bench attention`'s walk and query tiles asked with --walk and
// --query-tiles run where a pattern row can take them, and a row that cannot says why under the table;
// `sjit check` runs a spec of every op against the float64 reference.
#include <catch2/catch.hpp>

#include <sstream>

#include "support/temp_dir.h"

#include "sparsejit/sparsejit.h"
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

TEST_CASE("sjit check runs a normalizer, block-sparse and baked attention with GQA and odd lengths, and E23, "
          "against the float64 reference",
          "[gpu][tool]") {
  const sjit::test::TempDir dir("sjit-check");
  const sjit::BlockPattern pattern = sjit::patterns::bigbird(32, 300, 250, 1, 1, 1, 11);
  const std::string file = (dir.path() / "p.bsr").string();
  pattern.save(file);
  sjit::AttentionSpec baked;
  baked.head_dim = 64, baked.sparsity = sjit::Sparsity::baked, baked.block_size = 32;
  baked.pattern_digest = pattern.digest();
  const std::string specs = fmt::format(
      "rownorm:kind=entmax,alpha=1.5,n=64,dtype=bf16 attention:d=64,dtype=bf16,causal=none,sparsity=bsr,block=32 "
      "{} {}",
      sjit::key(sjit::canonical(baked)), sjit::key(sjit::e23_spec(sjit::NormKind::softmax, 1.0f, 8, 64, sjit::DType::bf16)));
  int status = -1;
  // The file's pattern for both the bsr spec and the baked one (which needs it).
  std::string out = sjit::test::run_tool(fmt::format("check {} --shape 1,4,2,300,250 --backward --pattern '{}'", specs, file),
                                         &status);
  INFO(out);
  CHECK(status == 0);
  CHECK_THAT(out, Contains("4 of 4 matched the float64 reference") && Contains("fwd+bwd B1 Hq4 Hkv2 Sq300 Sk250") &&
                      Contains("random inputs from --seed"));
  out = sjit::test::run_tool(fmt::format("check {} --shape 1,4,2,300,250", specs), &status);
  CHECK(status != 0);
  CHECK_THAT(out, Contains("a baked spec needs its pattern: give it with --pattern FILE"));
}

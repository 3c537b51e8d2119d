// Generation and NVRTC compiles with no GPU: every kind x dtype x representative N for sm_80 and sm_90a.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <future>

#include "sparsejit/sparsejit.h"
#include "support/test_support.h"

using namespace sjit;
using Catch::Matchers::Contains;

TEST_CASE("the generated unit is a config struct and an include, nothing more", "[codegen]") {
  const std::string src = generate_source(entmax_spec(1.5f, 64, DType::bf16));
  CHECK_THAT(src, Contains("#include \"sparsejit/rownorm.cuh\""));
  CHECK_THAT(src, Contains("using T = __nv_bfloat16;"));
  CHECK_THAT(src, Contains("static constexpr int n = 64;"));
  CHECK_THAT(src, Contains("0x1.8p+0f"));  // alpha = 1.5 exactly
  CHECK(std::count(src.begin(), src.end(), '\n') < 20);
}

TEST_CASE("every kind, dtype and representative N compiles for sm_80 and sm_90a", "[codegen][nvrtc]") {
  std::vector<std::tuple<RowNormSpec, std::string>> jobs;
  for (const char* arch : {"sm_80", "sm_90a"})
    for (DType d : {DType::f32, DType::f16, DType::bf16})
      for (int n : {1, 7, 64, 1024, 16384})
        for (Pass p : {Pass::forward, Pass::backward})
          for (const RowNormSpec& s : {softmax_spec(n, d, p), sparsemax_spec(n, d, p), entmax_spec(1.5f, n, d, p),
                                       entmax_spec(1.7f, n, d, p)})
            if (n != 7 || d == DType::f32) jobs.emplace_back(s, arch);
  // Two at a time: CI has two cores.
  std::vector<std::future<CompiledKernel>> pending;
  std::size_t checked = 0;
  auto drain = [&](std::size_t keep) {
    while (pending.size() > keep) {
      const CompiledKernel k = pending.front().get();
      pending.erase(pending.begin());
      CAPTURE(k.kernel_key, k.arch);
      CHECK(k.binary.size() > 1000);
      CHECK(k.binary.compare(0, 4, "\x7f" "ELF") == 0);  // a CUBIN is an ELF file
      CHECK(k.usage.registers > 0);
      CHECK(k.usage.spill_store_bytes == 0);
      ++checked;
    }
  };
  for (const auto& [spec, arch] : jobs) {
    pending.push_back(std::async(std::launch::async, [spec = spec, arch = arch] { return compile(spec, {}, arch); }));
    drain(1);
  }
  drain(0);
  CHECK(checked == jobs.size());
}

TEST_CASE("PTX on request", "[codegen][nvrtc]") {
  const CompiledKernel k = compile(entmax_spec(1.5f, 64), {}, "sm_90a", Emit::ptx);
  CHECK_THAT(k.binary, Contains(".target sm_90a"));
  CHECK_THAT(k.binary, Contains(".entry"));
}

TEST_CASE("SJIT_LINEINFO=1 compiles with line information, and a bad value is refused", "[codegen][nvrtc]") {
  const sjit::test::EnvironmentGuard guard({"SJIT_LINEINFO"});
  const RowNormSpec spec = softmax_spec(24);
  guard.clear_all();
  const CompiledKernel plain = compile(spec, {}, "sm_90a", Emit::ptx);
  ::setenv("SJIT_LINEINFO", "1", 1);
  const CompiledKernel lined = compile(spec, {}, "sm_90a", Emit::ptx);
  // PTX names its source lines in .loc directives; the template's file is in the .file table.
  CHECK_THAT(lined.binary, Contains(".loc") && Contains("sparsejit/rownorm.cuh"));
  CHECK_THAT(plain.binary, !Contains(".loc"));
  ::setenv("SJIT_LINEINFO", "yes please", 1);
  CHECK_THROWS_AS(compile(spec, {}, "sm_90a", Emit::ptx), InvalidArgument);
  CHECK_THROWS_WITH(compile(spec, {}, "sm_90a", Emit::ptx), Contains("yes please") && Contains("1 or on"));
}

TEST_CASE("an unknown arch is refused with the list of targets", "[codegen][nvrtc]") {
  CHECK_THROWS_WITH(compile(softmax_spec(8), {}, "sm_42"), Contains("sm_42") && Contains("sm_90a"));
}

TEST_CASE("resource usage is read from ptxas' report", "[codegen]") {
  const ResourceUsage u = parse_resource_usage(
      "ptxas info    : Function properties for _Z3foo\n"
      "    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n"
      "ptxas info    : Used 40 registers, used 1 barriers, 1024 bytes smem, 400 bytes cmem[0]\n");
  CHECK(u.registers == 40);
  CHECK(u.shared_bytes == 1024);
  CHECK(u.stack_frame_bytes == 8);
  CHECK(u.spill_store_bytes == 4);
  CHECK(u.spill_load_bytes == 12);
}

// E23 without a GPU: the generated unit, NVRTC compiles for sm_90a, and the argument checks (which run
// before anything touches a device).
#include <catch2/catch.hpp>

#include "sparsejit/e23.h"
#include "sparsejit/sparsejit.h"

using namespace sjit;
using Catch::Matchers::Contains;

namespace {

// Fake device addresses: the checks only look at the numbers.
const void* at(std::uintptr_t address) { return reinterpret_cast<const void*>(address); }
void* at_mut(std::uintptr_t address) { return reinterpret_cast<void*>(address); }

E23ForwardArgs valid_args() {  // spec dim 64, 4 slots, bf16: 16-byte aligned, disjoint buffers
  E23ForwardArgs a;
  a.u = at(0x100000), a.h0 = at(0x200000), a.m0 = at(0x300000), a.w_h = at(0x400000), a.w_w = at(0x500000);
  a.y = at_mut(0x600000), a.h_final = at_mut(0x700000), a.m_final = at_mut(0x800000);
  a.batch = 2, a.steps = 3;
  return a;
}

}  // namespace

TEST_CASE("e23: the generated unit is an include and a config struct", "[e23][codegen]") {
  const std::string src = source_for_key("e23:kind=entmax,alpha=1.5,n_slots=8,dim=512,dtype=bf16");
  CHECK_THAT(src, Contains("#include \"sparsejit/e23_forward.cuh\""));
  CHECK_THAT(src, Contains("using T = __nv_bfloat16;"));
  CHECK_THAT(src, Contains("static constexpr int n_slots = 8;"));
  CHECK_THAT(src, Contains("static constexpr int dim = 512;"));
  CHECK_THAT(src, Contains("0x1.8p+0f"));  // alpha = 1.5 exactly
  CHECK_THAT(src, Contains("static constexpr bool tensor_cores = true;"));
  CHECK(std::count(src.begin(), src.end(), '\n') < 20);
  CHECK_THAT(source_for_key("e23:kind=softmax,n_slots=4,dim=64"), Contains("tensor_cores = false"));
}

TEST_CASE("e23: kernels compile for sm_90a without spills", "[e23][codegen][nvrtc]") {
  for (const char* k : {"e23:kind=entmax,alpha=1.5,n_slots=8,dim=512,dtype=bf16",
                        "e23:kind=softmax,n_slots=33,dim=520,dtype=f32",
                        "e23:kind=entmax,alpha=1.25,n_slots=1,dim=8,dtype=f16"}) {
    const CompiledKernel c = compile_key(k, "sm_90a", Emit::cubin);
    CAPTURE(k, c.log);
    CHECK(c.binary.compare(0, 4, "\x7f" "ELF") == 0);
    CHECK(c.usage.registers > 0);
    CHECK(c.usage.spill_store_bytes == 0);
  }
}

TEST_CASE("e23: unknown kernel configs are refused", "[e23][codegen]") {
  CHECK_THROWS_WITH(source_for_key("e23:kind=softmax,n_slots=4,dim=64|pass=bwd"), Contains("pass=fwd"));
  CHECK_THROWS_AS(source_for_key("e23:kind=softmax,n_slots=0,dim=64"), InvalidSpec);
}

TEST_CASE("e23: bad arguments raise InvalidArgument naming the argument and its value", "[e23]") {
  E23 cell(e23_spec(NormKind::entmax, 1.5f, 4, 64, DType::bf16));
  SECTION("negative sizes") {
    E23ForwardArgs a = valid_args();
    a.batch = -1;
    CHECK_THROWS_WITH(cell.forward_sequence(a), Contains("batch = -1"));
    a = valid_args();
    a.steps = -2;
    CHECK_THROWS_WITH(cell.forward_sequence(a), Contains("steps = -2"));
  }
  SECTION("a required pointer is null") {
    E23ForwardArgs a = valid_args();
    a.w_w = nullptr;
    CHECK_THROWS_WITH(cell.forward_sequence(a), Contains("w_w is null"));
    a = valid_args();
    a.y = nullptr;
    CHECK_THROWS_WITH(cell.forward_sequence(a), Contains("y is null"));
  }
  SECTION("misaligned") {
    E23ForwardArgs a = valid_args();
    a.m0 = at(0x300008);
    CHECK_THROWS_WITH(cell.forward_sequence(a), Contains("m0") && Contains("16-byte aligned"));
  }
  SECTION("an output overlaps an input") {
    E23ForwardArgs a = valid_args();
    a.m_final = at_mut(0x300000);
    CHECK_THROWS_WITH(cell.forward_sequence(a), Contains("m_final overlaps input m0"));
  }
  SECTION("sizes that disagree with the spec") {
    E23ForwardArgs a = valid_args();
    a.dim = 128;
    CHECK_THROWS_WITH(cell.forward_sequence(a), Contains("args.dim = 128") && Contains("dim = 64"));
    a = valid_args();
    a.n_slots = 8;
    CHECK_THROWS_WITH(cell.forward_sequence(a), Contains("args.n_slots = 8") && Contains("n_slots = 4"));
  }
  SECTION("step() takes one step") {
    CHECK_THROWS_WITH(cell.step(valid_args()), Contains("args.steps = 1, not 3"));
  }
  SECTION("batch too large for int offsets") {
    E23ForwardArgs a = valid_args();
    a.batch = std::int64_t(1) << 40;
    CHECK_THROWS_WITH(cell.forward_sequence(a), Contains("too large"));
  }
  SECTION("a misaligned workspace") {
    E23ForwardArgs a = valid_args();
    a.workspace = at_mut(0x900010);
    CHECK_THROWS_WITH(cell.forward_sequence(a), Contains("workspace") && Contains("256-byte"));
  }
}

TEST_CASE("e23: the workspace grows with the batch and is zero for none", "[e23]") {
  E23 cell(e23_spec(NormKind::softmax, 1.0f, 8, 512, DType::bf16));
  CHECK(cell.workspace_bytes(0) > 0);  // the barrier word
  CHECK(cell.workspace_bytes(4) >= 4 * 8 * 512 * 4);
  CHECK(cell.workspace_bytes(64) > cell.workspace_bytes(4));
  CHECK_THROWS_AS(cell.workspace_bytes(-1), InvalidArgument);
}

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

E23BackwardArgs valid_backward_args() {  // the same spec; the saved state at 0xA00000 (saved_bytes: < 1 MB)
  E23BackwardArgs a;
  a.w_h = at(0x400000), a.w_w = at(0x500000), a.dy = at(0x100000), a.saved = at(0xA00000);
  a.du = at_mut(0x600000), a.dh0 = at_mut(0x700000), a.dm0 = at_mut(0x800000), a.dw_h = at_mut(0x900000),
  a.dw_w = at_mut(0x980000);
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

TEST_CASE("e23: the backward unit includes the backward template", "[e23][codegen]") {
  const std::string src = source_for_key("e23:kind=sparsemax,n_slots=16,dim=256,dtype=f16|pass=bwd");
  CHECK_THAT(src, Contains("#include \"sparsejit/e23_backward.cuh\""));
  CHECK_THAT(src, Contains("using T = __half;"));
  CHECK_THAT(src, Contains("static constexpr int n_slots = 16;"));
}

TEST_CASE("e23: backward kernels compile for sm_90a without spills", "[e23][codegen][nvrtc]") {
  // The backward asks for one CTA an SM (__launch_bounds__(256, 1)): 120 to 185 registers, no spills;
  // held to 128 registers it spilled up to 250 bytes.
  for (const char* k : {"e23:kind=entmax,alpha=1.5,n_slots=8,dim=512,dtype=bf16|pass=bwd",
                        "e23:kind=softmax,n_slots=33,dim=520,dtype=f32|pass=bwd",
                        "e23:kind=entmax,alpha=1.25,n_slots=8,dim=256,dtype=f16|pass=bwd"}) {
    const CompiledKernel c = compile_key(k, "sm_90a", Emit::cubin);
    CAPTURE(k, c.log);
    CHECK(c.binary.compare(0, 4, "\x7f" "ELF") == 0);
    CHECK(c.usage.registers <= 255);
    CHECK(c.usage.spill_store_bytes == 0);
  }
}

TEST_CASE("e23: unknown kernel configs are refused", "[e23][codegen]") {
  CHECK_THROWS_WITH(source_for_key("e23:kind=softmax,n_slots=4,dim=64|pass=sideways"),
                    Contains("pass=fwd") && Contains("pass=bwd"));
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

TEST_CASE("e23: saved state and backward workspace sizes follow their formulas", "[e23]") {
  E23 cell(e23_spec(NormKind::entmax, 1.5f, 8, 512, DType::bf16));
  CHECK(E23::checkpoint_interval(64) == 8);
  CHECK(E23::checkpoint_interval(65) == 9);
  CHECK(E23::checkpoint_interval(1) == 1);
  CHECK(E23::checkpoint_interval(5, 16) == 5);  // never longer than the sequence
  CHECK(E23::checkpoint_interval(64, 4) == 4);
  CHECK_THROWS_WITH(E23::checkpoint_interval(64, -1), Contains("checkpoint_every = -1"));
  // 4 ((2 T + 1) B D + ceil(T / K) B N D) bytes: every part here is a multiple of 256 bytes.
  const std::size_t b = 4, t = 64, n = 8, d = 512;
  CHECK(cell.saved_bytes(4, 64) == 4 * ((2 * t + 1) * b * d + 8 * b * n * d));
  CHECK(cell.saved_bytes(4, 64, 16) == 4 * ((2 * t + 1) * b * d + 4 * b * n * d));
  CHECK(cell.saved_bytes(4, 64, 16) < cell.saved_bytes(4, 64, 4));
  CHECK(cell.backward_workspace_bytes(4, 64) >= 4 * (9 * b * n * d + 2 * t * b * d) + 2 * d * d * 2);
  CHECK_THROWS_AS(cell.saved_bytes(-1, 4), InvalidArgument);
  CHECK_THROWS_AS(cell.backward_workspace_bytes(4, -1), InvalidArgument);
}

TEST_CASE("e23: bad backward arguments raise InvalidArgument naming the argument and its value", "[e23]") {
  E23 cell(e23_spec(NormKind::entmax, 1.5f, 4, 64, DType::bf16));
  REQUIRE(cell.saved_bytes(2, 3) < 0x100000);
  SECTION("negative sizes") {
    E23BackwardArgs a = valid_backward_args();
    a.batch = -3;
    CHECK_THROWS_WITH(cell.backward_sequence(a), Contains("batch = -3"));
    a = valid_backward_args();
    a.steps = -1;
    CHECK_THROWS_WITH(cell.backward_sequence(a), Contains("steps = -1"));
    a = valid_backward_args();
    a.checkpoint_every = -2;
    CHECK_THROWS_WITH(cell.backward_sequence(a), Contains("checkpoint_every = -2"));
  }
  SECTION("required pointers") {
    for (const char* name : {"dy", "saved", "w_h", "du", "dh0", "dm0", "dw_h", "dw_w"}) {
      E23BackwardArgs a = valid_backward_args();
      const std::string which = name;
      if (which == "dy") a.dy = nullptr;
      if (which == "saved") a.saved = nullptr;
      if (which == "w_h") a.w_h = nullptr;
      if (which == "du") a.du = nullptr;
      if (which == "dh0") a.dh0 = nullptr;
      if (which == "dm0") a.dm0 = nullptr;
      if (which == "dw_h") a.dw_h = nullptr;
      if (which == "dw_w") a.dw_w = nullptr;
      CHECK_THROWS_WITH(cell.backward_sequence(a), Contains(which + " is null"));
    }
  }
  SECTION("misaligned") {
    E23BackwardArgs a = valid_backward_args();
    a.dh_final = at(0x200004);
    CHECK_THROWS_WITH(cell.backward_sequence(a), Contains("dh_final") && Contains("16-byte aligned"));
    a = valid_backward_args();
    a.workspace = at_mut(0xF00040);
    CHECK_THROWS_WITH(cell.backward_sequence(a), Contains("workspace") && Contains("256-byte"));
  }
  SECTION("outputs overlapping inputs or each other") {
    E23BackwardArgs a = valid_backward_args();
    a.du = at_mut(0x100000);  // on dy
    CHECK_THROWS_WITH(cell.backward_sequence(a), Contains("du overlaps input dy"));
    a = valid_backward_args();
    a.dm0 = at_mut(0xA00100);  // inside the saved state
    CHECK_THROWS_WITH(cell.backward_sequence(a), Contains("dm0 overlaps input saved"));
    a = valid_backward_args();
    a.dw_w = at_mut(0x900100);  // inside dw_h ([64, 64] bf16 = 8 KB)
    CHECK_THROWS_WITH(cell.backward_sequence(a), Contains("dw_h and dw_w overlap"));
  }
  SECTION("sizes that disagree with the spec") {
    E23BackwardArgs a = valid_backward_args();
    a.dim = 32;
    CHECK_THROWS_WITH(cell.backward_sequence(a), Contains("args.dim = 32") && Contains("dim = 64"));
    a = valid_backward_args();
    a.n_slots = 5;
    CHECK_THROWS_WITH(cell.backward_sequence(a), Contains("args.n_slots = 5") && Contains("n_slots = 4"));
  }
  SECTION("the forward's saved state is checked the same way") {
    E23ForwardArgs a = valid_args();
    a.saved = at_mut(0x300000);  // on m0
    CHECK_THROWS_WITH(cell.forward_sequence(a), Contains("saved overlaps input m0"));
    a = valid_args();
    a.saved = at_mut(0xA00008);
    CHECK_THROWS_WITH(cell.forward_sequence(a), Contains("saved") && Contains("16-byte aligned"));
    a = valid_args();
    a.checkpoint_every = -5;
    CHECK_THROWS_WITH(cell.forward_sequence(a), Contains("checkpoint_every = -5"));
  }
}

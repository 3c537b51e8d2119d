#include "codegen/e23_codegen.h"

#include <algorithm>

#include <fmt/format.h>

#include "codegen/cuda_names.h"

namespace sjit::codegen {

bool e23_uses_tensor_cores(const E23Spec& spec) { return spec.dtype != DType::f32; }

std::string e23_kernel_key(const E23Spec& spec) { return key(spec) + "|pass=fwd"; }
std::string e23_backward_kernel_key(const E23Spec& spec) { return key(spec) + "|pass=bwd"; }

int e23_forward_shared_bytes(const E23Spec& spec) {
  constexpr int tile_outputs = 16 * 32, warps = kE23Threads / 32;
  const int slots_padded = (spec.n_slots + 3) / 4 * 4;
  const int tape_floats = 2 * spec.dim + 2 * slots_padded;
  const int tile_floats = (e23_uses_tensor_cores(spec) ? 1 : 2) * warps * tile_outputs;
  return 4 * std::max(tape_floats, tile_floats);
}

int e23_backward_shared_bytes(const E23Spec& spec) {
  const int slots_padded = (spec.n_slots + 3) / 4 * 4;
  const int tape_floats = 3 * spec.dim + 6 * slots_padded + 8;  // E23BackwardTraits::tape_floats
  const int outer_floats = 2 * 32 * 64;  // the dW tiles' two stages
  return std::max({e23_forward_shared_bytes(spec), 4 * tape_floats, 4 * outer_floats});
}

namespace {

KernelSource e23_unit(const E23Spec& in, bool backward) {
  const E23Spec spec = canonical(in);
  KernelSource out;
  out.kernel_key = backward ? e23_backward_kernel_key(spec) : e23_kernel_key(spec);
  const float alpha = spec.kind == NormKind::entmax ? spec.alpha : spec.kind == NormKind::sparsemax ? 2.0f : 1.0f;
  const float scale = effective_scale(spec);
  const char* pass = backward ? "backward" : "forward";
  // Floats as hex literals: exact, whatever the decimal text would round to.
  out.source = fmt::format(
      "// {}\n"
      "#include \"sparsejit/e23_{}.cuh\"\n"
      "\n"
      "struct Cfg {{\n"
      "  using T = {};\n"
      "  static constexpr int kind = {};  // {}\n"
      "  static constexpr float alpha = {:a}f;  // {}\n"
      "  static constexpr int n_slots = {};\n"
      "  static constexpr int dim = {};\n"
      "  static constexpr float scale = {:a}f;  // {}\n"
      "  static constexpr int threads = {};\n"
      "  static constexpr bool tensor_cores = {};\n"
      "}};\n",
      out.kernel_key, pass, cuda_type(spec.dtype), kind_id(spec.kind), name(spec.kind), alpha, alpha, spec.n_slots,
      spec.dim, scale, scale, kE23Threads, e23_uses_tensor_cores(spec) ? "true" : "false");
  out.source_name = fmt::format("e23_{}.cu", pass);
  out.name_expression = fmt::format("sjit_kernels::e23_{}<Cfg>", pass);
  out.dynamic_shared_bytes = backward ? e23_backward_shared_bytes(spec) : e23_forward_shared_bytes(spec);
  return out;
}

}  // namespace

KernelSource e23_source(const E23Spec& spec) { return e23_unit(spec, false); }
KernelSource e23_backward_source(const E23Spec& spec) { return e23_unit(spec, true); }

}  // namespace sjit::codegen

#include "codegen/e23_codegen.h"

#include <algorithm>

#include <fmt/format.h>

#include "codegen/cuda_names.h"

namespace sjit::codegen {

bool e23_uses_tensor_cores(const E23Spec& spec) { return spec.dtype != DType::f32; }

std::string e23_kernel_key(const E23Spec& spec) { return key(spec) + "|pass=fwd"; }

int e23_forward_shared_bytes(const E23Spec& spec) {
  constexpr int tile_outputs = 16 * 32, warps = kE23Threads / 32;
  const int slots_padded = (spec.n_slots + 3) / 4 * 4;
  const int tape_floats = 2 * spec.dim + 2 * slots_padded;
  const int tile_floats = (e23_uses_tensor_cores(spec) ? 1 : 2) * warps * tile_outputs;
  return 4 * std::max(tape_floats, tile_floats);
}

KernelSource e23_source(const E23Spec& in) {
  const E23Spec spec = canonical(in);
  KernelSource out;
  out.kernel_key = e23_kernel_key(spec);
  const float alpha = spec.kind == NormKind::entmax ? spec.alpha : spec.kind == NormKind::sparsemax ? 2.0f : 1.0f;
  const float scale = effective_scale(spec);
  // Floats as hex literals: exact, whatever the decimal text would round to.
  out.source = fmt::format(
      "// {}\n"
      "#include \"sparsejit/e23_forward.cuh\"\n"
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
      out.kernel_key, cuda_type(spec.dtype), kind_id(spec.kind), name(spec.kind), alpha, alpha, spec.n_slots,
      spec.dim, scale, scale, kE23Threads, e23_uses_tensor_cores(spec) ? "true" : "false");
  out.source_name = "e23_forward.cu";
  out.name_expression = "sjit_kernels::e23_forward<Cfg>";
  out.dynamic_shared_bytes = e23_forward_shared_bytes(spec);
  return out;
}

}  // namespace sjit::codegen

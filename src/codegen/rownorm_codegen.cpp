#include "codegen/rownorm_codegen.h"

#include <fmt/format.h>

#include "codegen/cuda_names.h"

namespace sjit::codegen {

std::string rownorm_kernel_key(const RowNormSpec& spec, const RowNormConfig& config) {
  return key(spec) + "|" + key(config);
}

KernelSource rownorm_source(const RowNormSpec& spec, const RowNormConfig& config) {
  KernelSource out;
  out.kernel_key = rownorm_kernel_key(spec, config);
  const bool forward = spec.pass == Pass::forward;
  // alpha as a hex float literal: exact, whatever the decimal text would round to.
  out.source = fmt::format(
      "// {}\n"
      "#include \"sparsejit/rownorm.cuh\"\n"
      "\n"
      "struct Cfg {{\n"
      "  using T = {};\n"
      "  static constexpr int kind = {};  // {}\n"
      "  static constexpr float alpha = {:a}f;  // {}\n"
      "  static constexpr int n = {};\n"
      "  static constexpr int threads_per_row = {};\n"
      "  static constexpr int vec = {};\n"
      "  static constexpr int block_threads = {};\n"
      "  static constexpr bool row_in_smem = {};\n"
      "  static constexpr bool wrong_result_for_tests = {};\n"
      "}};\n",
      out.kernel_key, cuda_type(spec.dtype), kind_id(spec.kind), name(spec.kind), spec.alpha, spec.alpha, spec.n,
      config.threads_per_row, config.vec, config.block_threads, config.row_in_smem == 1 ? "true" : "false",
      config.wrong_result_for_tests ? "true" : "false");
  out.source_name = forward ? "rownorm_forward.cu" : "rownorm_backward.cu";
  // A row in shared memory: n floats, two slices (y and dy) in the backward.
  out.dynamic_shared_bytes = config.row_in_smem == 1 ? spec.n * 4 * (forward ? 1 : 2) : 0;
  out.name_expression = forward ? "sjit_kernels::rownorm_forward<Cfg>" : "sjit_kernels::rownorm_backward<Cfg>";
  return out;
}

}  // namespace sjit::codegen

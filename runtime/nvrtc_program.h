// NVRTC: a generated unit plus in-memory template headers in, a CUBIN (or PTX) and the log out.
#pragma once

#include <string>
#include <vector>

namespace sjit::runtime {

struct InMemoryHeader {
  std::string name;  // as #included, e.g. "sparsejit/rownorm.cuh"
  const std::string* text;
};

struct CompileRequest {
  std::string source;
  std::string source_name;       // shown in the log, e.g. "rownorm_fwd_ab12cd.cu"
  std::vector<InMemoryHeader> headers;
  std::string name_expression;   // the kernel to instantiate, e.g. "sjit_kernels::rownorm_forward<Cfg>"
  std::string arch;              // "sm_90a", "sm_80", ...
  bool ptx = false;              // PTX for compute_XX instead of a CUBIN for sm_XX
};

struct CompileResult {
  std::string binary;            // CUBIN bytes, or PTX text
  std::string lowered_name;      // the mangled name to look up in the module
  std::string log;               // NVRTC's log, with ptxas' resource report for CUBINs
  std::vector<std::string> options;
  double compile_ms = 0;
};

// Compiles; throws CompileError carrying the full log and the generated source on failure.
CompileResult nvrtc_compile(const CompileRequest& request);

// Options a request compiles with (these are part of the cache key).
std::vector<std::string> nvrtc_options(const CompileRequest& request);

// "13.0"
std::string nvrtc_version();

// Architectures NVRTC can target, as "sm_XX" names (and "sm_XXa" for those with arch-specific features).
std::vector<std::string> nvrtc_supported_archs();

// Throws InvalidArgument if `arch` is not a target this NVRTC supports; returns it normalized.
std::string validate_arch(const std::string& arch);

// The toolkit's include folder NVRTC reads cuda_fp16.h and cuda_bf16.h from: $SJIT_CUDA_INCLUDE, else
// the folder found when sparsejit was built.
std::string cuda_include_dir();

}  // namespace sjit::runtime

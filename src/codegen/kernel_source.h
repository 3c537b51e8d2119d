// What the generator hands the JIT core: a short unit and the name of the kernel to instantiate.
#pragma once

#include <string>

namespace sjit::codegen {

// The most dynamic shared memory a block may opt into on sm_80 .. sm_90 (227 KB): configs that need
// more are refused by name before any compile.
inline constexpr int kMaxDynamicSharedBytes = 227 * 1024;

struct KernelSource {
  std::string kernel_key;       // spec key text + "|" + config key text: names the binary
  std::string source;           // the generated unit: an #include, a config struct, nothing else
  std::string source_name;      // e.g. "rownorm_forward.cu"
  std::string name_expression;  // e.g. "sjit_kernels::rownorm_forward<Cfg>"
  int dynamic_shared_bytes = 0; // what every launch of it asks for (opened up at load beyond 48 KB)
};

}  // namespace sjit::codegen

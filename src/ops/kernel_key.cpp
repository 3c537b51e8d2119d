#include "ops/kernel_key.h"

#include <mutex>
#include <unordered_map>

#include <fmt/format.h>

#include "codegen/attention_codegen.h"
#include "codegen/e23_codegen.h"
#include "codegen/rownorm_codegen.h"
#include "jit/jit.h"
#include "sparsejit/cache.h"
#include "sparsejit/error.h"

namespace sjit::ops {

codegen::KernelSource source_for_key(std::string_view kernel_key) {
  const auto bar = kernel_key.find('|');
  const std::string_view spec_text = kernel_key.substr(0, bar);
  const std::string_view config_text = bar == std::string_view::npos ? std::string_view{} : kernel_key.substr(bar + 1);
  if (spec_text.rfind("rownorm:", 0) == 0) {
    const RowNormSpec spec = parse_rownorm(spec_text);
    const RowNormConfig config = resolve(spec, config_text.empty() ? RowNormConfig{} : parse_rownorm_config(config_text));
    return codegen::rownorm_source(spec, config);
  }
  if (spec_text.rfind("attention:", 0) == 0) {
    const AttentionSpec spec = parse_attention(spec_text);
    if (spec.pass == Pass::backward) {
      if (config_text.empty())
        throw InvalidSpec(fmt::format("kernel key '{}': an attention backward key names its part after '|' "
                                      "(part=prep, dkdv, dq or dq_convert)", kernel_key));
      return codegen::attention_backward_source(spec, codegen::parse_backward_tiling(config_text));
    }
    const AttentionConfig config =
        resolve(spec, config_text.empty() ? AttentionConfig{} : parse_attention_config(config_text));
    return codegen::attention_source(spec, config);  // baked specs throw: they need their pattern
  }
  if (spec_text.rfind("e23:", 0) == 0) {
    const E23Spec spec = parse_e23(spec_text);
    if (config_text == "pass=bwd") return codegen::e23_backward_source(spec);
    if (!config_text.empty() && config_text != "pass=fwd")
      throw InvalidSpec(fmt::format("e23: kernel config '{}' is unknown: the E23 kernels are 'pass=fwd' and 'pass=bwd'",
                                    config_text));
    return codegen::e23_source(spec);
  }
  throw InvalidSpec(fmt::format("kernel key '{}' names no known op: the ops are rownorm, attention and e23", kernel_key));
}

}  // namespace sjit::ops

namespace sjit {

CompiledKernel compile_key(const std::string& kernel_key, const std::string& arch, Emit emit) {
  return jit::compile(ops::source_for_key(kernel_key), arch, emit);
}

std::string source_for_key(const std::string& kernel_key) { return ops::source_for_key(kernel_key).source; }

void prepare_key(const std::string& kernel_key) {
  // The canonical name of each key text seen, so that a repeated call is two map lookups rather
  // than parsing the key and generating the unit again.
  static std::mutex mutex;
  static std::unordered_map<std::string, std::string> canonical_names;
  std::string canonical;
  {
    std::lock_guard lock(mutex);
    if (auto it = canonical_names.find(kernel_key); it != canonical_names.end()) canonical = it->second;
  }
  if (canonical.empty()) {
    canonical = ops::source_for_key(kernel_key).kernel_key;  // validates the key text
    std::lock_guard lock(mutex);
    canonical_names.emplace(kernel_key, canonical);
  }
  (void)jit::get_kernel(jit::current_target(), canonical, [&] { return ops::source_for_key(canonical); });
}

}  // namespace sjit

#include "sparsejit/dtype.h"

#include <fmt/format.h>

#include "sparsejit/error.h"

namespace sjit {

std::string_view name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
  }
  return "?";
}

DType parse_dtype(std::string_view text) {
  if (text == "f32" || text == "fp32" || text == "float32" || text == "float") return DType::f32;
  if (text == "f16" || text == "fp16" || text == "float16" || text == "half") return DType::f16;
  if (text == "bf16" || text == "bfloat16") return DType::bf16;
  throw InvalidSpec(fmt::format("dtype '{}' is not supported: use f32, f16 or bf16", text));
}

std::size_t size_of(DType dtype) { return dtype == DType::f32 ? 4 : 2; }

}  // namespace sjit

// Element types of the tensors sparsejit kernels read and write. Arithmetic is always fp32.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace sjit {

enum class DType { f32, f16, bf16 };

std::string_view name(DType dtype);         // "f32", "f16", "bf16"
DType parse_dtype(std::string_view text);   // accepts the names above (and fp32/fp16/float32...), throws InvalidSpec
std::size_t size_of(DType dtype);           // bytes per element

}  // namespace sjit

#include <span>

namespace sjit {

// Host-side conversions for filling and reading device buffers (round to nearest even; NaN and
// infinities preserved). `bytes` point at size_of(dtype) * count bytes.
void encode(DType dtype, std::span<const float> values, void* bytes);
void decode(DType dtype, const void* bytes, std::span<float> values);

}  // namespace sjit

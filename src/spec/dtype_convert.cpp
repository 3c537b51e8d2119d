// fp32 <-> fp16 / bf16 on the host, bit by bit (IEEE 754 binary16; bfloat16 is fp32's top half).
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "sparsejit/dtype.h"

namespace sjit {
namespace {

std::uint16_t float_to_bf16(float f) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if (std::isnan(f)) return std::uint16_t((u >> 16) | 0x40);  // stay a (quiet) NaN
  const std::uint32_t rounding = 0x7fff + ((u >> 16) & 1);    // to nearest, ties to even
  return std::uint16_t((u + rounding) >> 16);
}

float bf16_to_float(std::uint16_t h) { return std::bit_cast<float>(std::uint32_t(h) << 16); }

std::uint16_t float_to_f16(float f) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (u >> 16) & 0x8000;
  const std::uint32_t abs = u & 0x7fffffff;
  if (abs > 0x7f800000) return std::uint16_t(sign | 0x7e00);           // NaN
  if (abs >= 0x477ff000) return std::uint16_t(sign | 0x7c00);          // rounds to >= 65520: infinity
  if (abs < 0x38800000) {                                              // below 2^-14: subnormal or zero
    const float scaled = std::bit_cast<float>(abs) * 16777216.0f;     // in units of 2^-24
    return std::uint16_t(sign | std::uint32_t(std::nearbyint(scaled)));  // default rounding: ties to even
  }
  const std::uint32_t rounded = abs + 0xfff + ((abs >> 13) & 1);       // to nearest even at bit 13
  return std::uint16_t(sign | ((rounded - 0x38000000) >> 13));
}

float f16_to_float(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t(h & 0x8000) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1f;
  const std::uint32_t mantissa = h & 0x3ff;
  float magnitude;
  if (exponent == 0) magnitude = std::ldexp(float(mantissa), -24);
  else if (exponent == 31) magnitude = mantissa ? NAN : INFINITY;
  else magnitude = std::bit_cast<float>(((exponent + 112) << 23) | (mantissa << 13));
  return std::bit_cast<float>(std::bit_cast<std::uint32_t>(magnitude) | sign);
}

}  // namespace

void encode(DType dtype, std::span<const float> values, void* bytes) {
  if (dtype == DType::f32) {
    if (!values.empty()) std::memcpy(bytes, values.data(), values.size_bytes());  // an empty span may hold null
    return;
  }
  auto* out = static_cast<std::uint16_t*>(bytes);
  for (std::size_t i = 0; i < values.size(); ++i)
    out[i] = dtype == DType::bf16 ? float_to_bf16(values[i]) : float_to_f16(values[i]);
}

void decode(DType dtype, const void* bytes, std::span<float> values) {
  if (dtype == DType::f32) {
    if (!values.empty()) std::memcpy(values.data(), bytes, values.size_bytes());
    return;
  }
  const auto* in = static_cast<const std::uint16_t*>(bytes);
  for (std::size_t i = 0; i < values.size(); ++i)
    values[i] = dtype == DType::bf16 ? bf16_to_float(in[i]) : f16_to_float(in[i]);
}

}  // namespace sjit

// Helpers shared by the parts of `sjit demo` (demo.h).
#include <fmt/format.h>

#include <cmath>
#include <string>

#include "demo.h"

namespace sjit::tool::demo {

void Outcome::add(double error, double allowed) {
  if (std::isnan(error)) error = INFINITY;
  max_error = std::max(max_error, error);
  worst = std::max(worst, allowed > 0 ? error / allowed : error > 0 ? INFINITY : 0.0);
}

Tensor random_tensor(std::int64_t elements, DType dtype, std::mt19937_64& rng, float scale) {
  Tensor t{random_device_tensor(elements, dtype, rng, scale), {}};
  const std::vector<float> values = download(t.device, dtype, std::size_t(elements));
  t.values.assign(values.begin(), values.end());
  return t;
}

std::string compact(double value) {
  std::string text = fmt::format("{:e}", value);  // "2.500000e-02"
  const std::size_t e = text.find('e');
  std::string mantissa = text.substr(0, e);
  mantissa.erase(mantissa.find_last_not_of('0') + 1);
  if (mantissa.back() == '.') mantissa.pop_back();
  const int exponent = std::stoi(text.substr(e + 1));
  return exponent == 0 ? mantissa : fmt::format("{}e{}", mantissa, exponent);
}

DeviceBuffer poisoned(std::size_t bytes) {
  DeviceBuffer buffer(std::max<std::size_t>(bytes, 16));
  buffer.fill_bytes(0xFF);
  return buffer;
}

std::vector<float> download(const DeviceBuffer& buffer, DType dtype, std::size_t elements) {
  std::vector<unsigned char> bytes(elements * size_of(dtype));
  buffer.download(bytes.data(), bytes.size());
  std::vector<float> values(elements);
  decode(dtype, bytes.data(), values);
  return values;
}

}  // namespace sjit::tool::demo

#include "support/test_support.h"

#include <cerrno>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace sjit::test {

std::uint64_t fresh_seed() {
  // SJIT_TEST_SEED replays a failed draw: every failing check prints the seed it ran with.
  if (const char* fixed = std::getenv("SJIT_TEST_SEED"); fixed && *fixed) {
    char* end = nullptr;
    errno = 0;
    const std::uint64_t seed = std::strtoull(fixed, &end, 0);
    if (*end != '\0' || errno == ERANGE || *fixed == '-')
      throw std::invalid_argument(std::string("SJIT_TEST_SEED = '") + fixed +
                                  "': use the seed a failed check printed, decimal or 0x hexadecimal");
    return seed;
  }
  std::random_device rd;
  return (std::uint64_t(rd()) << 32) ^ rd();
}

std::vector<float> random_rows(std::mt19937_64& rng, std::int64_t rows, int n, float scale) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(std::size_t(rows) * n);
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<unsigned char> to_bytes(DType dtype, const std::vector<float>& values) {
  std::vector<unsigned char> bytes(values.size() * size_of(dtype));
  encode(dtype, values, bytes.data());
  return bytes;
}

std::vector<float> from_bytes(DType dtype, const std::vector<unsigned char>& bytes) {
  std::vector<float> values(bytes.size() / size_of(dtype));
  decode(dtype, bytes.data(), values);
  return values;
}

std::vector<float> quantized(DType dtype, const std::vector<float>& values) {
  return from_bytes(dtype, to_bytes(dtype, values));
}

double atol_for(DType dtype) { return dtype == DType::f32 ? 2e-6 : dtype == DType::f16 ? 1e-3 : 8e-3; }
double rtol_for(DType dtype) { return dtype == DType::f32 ? 1e-4 : dtype == DType::f16 ? 2e-3 : 1.6e-2; }

EnvironmentGuard::EnvironmentGuard(std::initializer_list<const char*> names) : names_(names.begin(), names.end()) {
  for (const std::string& name : names_)
    if (const char* value = std::getenv(name.c_str())) saved_[name] = value;
}

EnvironmentGuard::~EnvironmentGuard() {
  for (const std::string& name : names_) {
    const auto it = saved_.find(name);
    if (it == saved_.end()) ::unsetenv(name.c_str());
    else ::setenv(name.c_str(), it->second.c_str(), 1);
  }
}

void EnvironmentGuard::clear_all() const {
  for (const std::string& name : names_) ::unsetenv(name.c_str());
}

}  // namespace sjit::test

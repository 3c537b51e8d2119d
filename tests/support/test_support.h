// Shared by the test suites: fresh random inputs (seed reported on failure) and tolerance checks.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "sparsejit/dtype.h"

namespace sjit::test {

// A seed drawn fresh for every run (std::random_device), printed by the tests through CAPTURE.
std::uint64_t fresh_seed();

// Row-major [rows, n] scores, N(0, scale^2).
std::vector<float> random_rows(std::mt19937_64& rng, std::int64_t rows, int n, float scale);

// float values as double, for the float64 references.
inline std::vector<double> wide(const std::vector<float>& values) {
  return std::vector<double>(values.begin(), values.end());
}

// Values as they are after a round trip through `dtype` (what the GPU actually reads).
std::vector<float> quantized(DType dtype, const std::vector<float>& values);

// Bytes for a device buffer holding `values` as `dtype`, and back.
std::vector<unsigned char> to_bytes(DType dtype, const std::vector<float>& values);
std::vector<float> from_bytes(DType dtype, const std::vector<unsigned char>& bytes);

// Output tolerance of a kernel writing `dtype` (fp32 arithmetic, rounding of the result).
double atol_for(DType dtype);
double rtol_for(DType dtype);

// Saves the environment variables `names` and puts them back (or unsets them) at the end of the scope,
// so that a test may set and clear them freely.
class EnvironmentGuard {
 public:
  explicit EnvironmentGuard(std::initializer_list<const char*> names);
  EnvironmentGuard(const EnvironmentGuard&) = delete;
  EnvironmentGuard& operator=(const EnvironmentGuard&) = delete;
  ~EnvironmentGuard();
  void clear_all() const;  // unsets every guarded variable

 private:
  std::vector<std::string> names_;
  std::map<std::string, std::string> saved_;
};

}  // namespace sjit::test

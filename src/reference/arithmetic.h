// The references' conversions between their float64 interface and the arithmetic R they run in
// (double for the oracles; float for their fp32 twins, e23_reference_fp32.h and
// attention_reference_fp32.h).
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

namespace sjit::reference {

template <class R>
std::vector<R> in_arithmetic(std::span<const double> values) {
  return std::vector<R>(values.begin(), values.end());
}

// values[from, to) as float64.
template <class R>
std::vector<double> widened(const std::vector<R>& values, std::size_t from = 0, std::size_t to = std::size_t(-1)) {
  return std::vector<double>(values.begin() + from, values.begin() + std::min(to, values.size()));
}

}  // namespace sjit::reference

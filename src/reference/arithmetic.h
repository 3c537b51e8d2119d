// The references' conversions between their float64 interface and the arithmetic R they run in
// (double for the oracles; float for their fp32 twins, e23_reference_fp32.h and
// attention_reference_fp32.h).
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
#include <type_traits>
#include <vector>

namespace sjit::reference {

template <class R>
std::vector<R> in_arithmetic(std::span<const double> values) {
  return std::vector<R>(values.begin(), values.end());
}

// Read-only inputs in arithmetic R: the caller's float64 values themselves where R is double (no copy:
// the long GPU tests pass hundreds of MB), a rounded copy where it is float.
template <class R>
class ValuesIn {
 public:
  explicit ValuesIn(std::span<const double> values) {
    if constexpr (std::is_same_v<R, double>) {
      view_ = values;
    } else {
      copy_ = in_arithmetic<R>(values);
      view_ = copy_;
    }
  }
  ValuesIn(const ValuesIn&) = delete;  // view_ may point into copy_
  ValuesIn& operator=(const ValuesIn&) = delete;
  ValuesIn(ValuesIn&&) = default;      // a moved vector keeps its buffer
  const R* data() const { return view_.data(); }
  std::size_t size() const { return view_.size(); }
  const R& operator[](std::size_t i) const { return view_[i]; }
  auto begin() const { return view_.begin(); }

 private:
  std::vector<R> copy_;
  std::span<const R> view_;
};

// values[from, to) as float64.
template <class R>
std::vector<double> widened(const std::vector<R>& values, std::size_t from = 0, std::size_t to = std::size_t(-1)) {
  return std::vector<double>(values.begin() + from, values.begin() + std::min(to, values.size()));
}

}  // namespace sjit::reference

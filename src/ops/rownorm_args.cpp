#include "ops/rownorm_args.h"

#include <fmt/format.h>

#include <cmath>

#include "sparsejit/error.h"

namespace sjit::ops {
namespace {

std::uintptr_t address(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

bool aligned(const MatrixArg& m, std::size_t bytes, std::size_t elem) {
  return address(m.ptr) % bytes == 0 && (std::uint64_t(m.ld) * elem) % bytes == 0;
}

}  // namespace

void check_matrices(const RowNormSpec& spec, std::int64_t rows, const MatrixArg* inputs, int n_inputs,
                    const MatrixArg& output) {
  if (rows < 0) throw InvalidArgument(fmt::format("rownorm: rows = {} is negative", rows));
  const std::size_t elem = size_of(spec.dtype);
  auto check_one = [&](const MatrixArg& m) {
    if (rows > 0 && m.ptr == nullptr) throw InvalidArgument(fmt::format("rownorm: {} is a null pointer", m.name));
    if (m.ld < spec.n)
      throw InvalidArgument(fmt::format("rownorm: {} has row stride {} but rows hold n = {} elements (stride >= n, "
                                        "or 0 for n)", m.name, m.ld, spec.n));
    if (address(m.ptr) % elem != 0)
      throw InvalidArgument(fmt::format("rownorm: {} = {} is not aligned to its {}-byte {} elements", m.name, m.ptr,
                                        elem, name(spec.dtype)));
  };
  for (int i = 0; i < n_inputs; ++i) check_one(inputs[i]);
  check_one(output);
  if (rows == 0) return;
  // An output may alias an input exactly (in place) but must not overlap it any other way.
  const auto span_end = [&](const MatrixArg& m) { return address(m.ptr) + ((rows - 1) * m.ld + spec.n) * elem; };
  for (int i = 0; i < n_inputs; ++i) {
    const MatrixArg& in = inputs[i];
    const bool same = in.ptr == output.ptr && in.ld == output.ld;
    const bool overlap = address(in.ptr) < span_end(output) && address(output.ptr) < span_end(in);
    if (overlap && !same)
      throw InvalidArgument(fmt::format("rownorm: {} overlaps {} without being the same matrix (in-place use needs "
                                        "the same pointer and row stride)", output.name, in.name));
  }
}

void check_temperature(float temperature) {
  if (!(temperature > 0.0f) || !std::isfinite(temperature))
    throw InvalidArgument(fmt::format("rownorm: temperature = {} must be a finite number > 0", temperature));
}

int widest_vec(const RowNormSpec& spec, const MatrixArg* matrices, int count) {
  const std::size_t elem = size_of(spec.dtype);
  int vec = int(16 / elem);
  for (; vec > 1; vec /= 2) {
    bool ok = true;
    for (int i = 0; i < count; ++i) ok = ok && aligned(matrices[i], vec * elem, elem);
    if (ok) break;
  }
  return vec;
}

void check_vec_alignment(const RowNormSpec& spec, int vec, const MatrixArg* matrices, int count) {
  const std::size_t elem = size_of(spec.dtype);
  for (int i = 0; i < count; ++i)
    if (!aligned(matrices[i], vec * elem, elem))
      throw InvalidArgument(fmt::format("rownorm: {} = {} with row stride {} is not aligned to {} bytes, which the "
                                        "config's vec = {} needs: use a smaller vec or leave it 0 to choose",
                                        matrices[i].name, matrices[i].ptr, matrices[i].ld, vec * elem, vec));
}

}  // namespace sjit::ops

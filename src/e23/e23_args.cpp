#include "e23/e23_args.h"

#include <fmt/format.h>

#include <climits>
#include <cstdint>
#include <vector>

#include "sparsejit/error.h"

namespace sjit::e23 {
namespace {

std::size_t round_up(std::size_t bytes, std::size_t to) { return (bytes + to - 1) / to * to; }

struct Range {
  const char* name;
  std::uintptr_t begin, end;
};

}  // namespace

WorkspaceLayout workspace_layout(const E23Spec& spec, std::int64_t batch) {
  const std::size_t b = std::size_t(batch), n = std::size_t(spec.n_slots), d = std::size_t(spec.dim);
  WorkspaceLayout l;
  std::size_t at = 0;
  auto part = [&](std::size_t floats) {
    const std::size_t offset = at;
    at = round_up(at + floats * 4, 256);
    return offset;
  };
  l.barrier = part(1);
  l.h = part(b * d);
  l.z = part(b * d);
  l.v = part(b * d);
  l.w = part(b * d);
  l.m = part(b * n * d);
  l.b = part(b * n);
  l.total = at;
  return l;
}

void check_forward_args(const E23Spec& spec, const E23ForwardArgs& a) {
  if (a.batch < 0)
    throw InvalidArgument(fmt::format("e23: batch = {} is not allowed: it must be >= 0", a.batch));
  if (a.steps < 0)
    throw InvalidArgument(fmt::format("e23: steps = {} is not allowed: it must be >= 0", a.steps));
  // Offsets inside the kernel are int for [batch, dim] and [steps] arrays.
  if (a.batch > INT_MAX / spec.dim)
    throw InvalidArgument(fmt::format("e23: batch = {} is too large: batch * dim must stay below 2^31 (at most {} "
                                      "batch rows for dim = {})", a.batch, INT_MAX / spec.dim, spec.dim));
  if (a.steps > INT_MAX)
    throw InvalidArgument(fmt::format("e23: steps = {} is too large: at most {}", a.steps, INT_MAX));
  if (a.dim != 0 && a.dim != spec.dim)
    throw InvalidArgument(fmt::format("e23: args.dim = {} but the kernel was specialized for dim = {} ('{}')", a.dim,
                                      spec.dim, key(spec)));
  if (a.n_slots != 0 && a.n_slots != spec.n_slots)
    throw InvalidArgument(fmt::format("e23: args.n_slots = {} but the kernel was specialized for n_slots = {} ('{}')",
                                      a.n_slots, spec.n_slots, key(spec)));
  if (a.batch == 0) return;

  const std::size_t elem = size_of(spec.dtype);
  const std::size_t b = std::size_t(a.batch), t = std::size_t(a.steps), n = std::size_t(spec.n_slots),
                    d = std::size_t(spec.dim);
  struct Pointer {
    const char* name;
    const void* p;
    std::size_t bytes;
    bool required, output;
    std::uintptr_t alignment;  // tensors move in 16-byte packets; the support arrays are plain floats
  };
  const bool any_step = a.steps > 0;
  const std::vector<Pointer> pointers = {
      {"u", a.u, t * b * d * elem, any_step, false, 16},
      {"h0", a.h0, b * d * elem, true, false, 16},
      {"m0", a.m0, b * n * d * elem, true, false, 16},
      {"w_h", a.w_h, d * d * elem, any_step, false, 16},
      {"w_w", a.w_w, d * d * elem, any_step, false, 16},
      {"y", a.y, t * b * d * elem, any_step, true, 16},
      {"h_final", a.h_final, b * d * elem, false, true, 16},
      {"m_final", a.m_final, b * n * d * elem, false, true, 16},
      {"read_support", a.read_support, t * 4, false, true, 4},
      {"write_support", a.write_support, t * 4, false, true, 4},
  };
  std::vector<Range> inputs, outputs;
  for (const Pointer& p : pointers) {
    const auto address = reinterpret_cast<std::uintptr_t>(p.p);
    if (p.p == nullptr) {
      if (p.required)
        throw InvalidArgument(fmt::format("e23: {} is null: it is required (batch = {}, steps = {})", p.name, a.batch,
                                          a.steps));
      continue;
    }
    if (address % p.alignment != 0)
      throw InvalidArgument(fmt::format("e23: {} = {} is not {}-byte aligned", p.name, p.p, p.alignment));
    if (p.bytes > 0) (p.output ? outputs : inputs).push_back({p.name, address, address + p.bytes});
  }
  auto overlaps = [](const Range& x, const Range& y) { return x.begin < y.end && y.begin < x.end; };
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    for (const Range& in : inputs)
      if (overlaps(outputs[i], in))
        throw InvalidArgument(fmt::format("e23: output {} overlaps input {}: outputs must not alias inputs (the "
                                          "kernel reads inputs after it starts writing)", outputs[i].name, in.name));
    for (std::size_t j = i + 1; j < outputs.size(); ++j)
      if (overlaps(outputs[i], outputs[j]))
        throw InvalidArgument(fmt::format("e23: outputs {} and {} overlap", outputs[i].name, outputs[j].name));
  }
  if (a.workspace != nullptr && reinterpret_cast<std::uintptr_t>(a.workspace) % 256 != 0)
    throw InvalidArgument(fmt::format("e23: workspace = {} is not 256-byte aligned", a.workspace));
}

}  // namespace sjit::e23

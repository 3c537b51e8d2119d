#include "e23/e23_args.h"

#include <fmt/format.h>

#include <algorithm>
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

// Carves 256-byte aligned parts out of one allocation, in order.
struct Carver {
  std::size_t at = 0;
  std::size_t part(std::size_t bytes) {
    const std::size_t offset = at;
    at = round_up(at + bytes, 256);
    return offset;
  }
};

struct Pointer {
  const char* name;
  const void* p;
  std::size_t bytes;
  bool required, output;
  std::uintptr_t alignment;  // tensors move in 16-byte packets; the support arrays are plain floats
};

// Null, alignment and overlap checks over one call's pointers.
void check_pointers(const std::vector<Pointer>& pointers, std::int64_t batch, std::int64_t steps) {
  std::vector<Range> inputs, outputs;
  for (const Pointer& p : pointers) {
    const auto address = reinterpret_cast<std::uintptr_t>(p.p);
    if (p.p == nullptr) {
      if (p.required)
        throw InvalidArgument(fmt::format("e23: {} is null: it is required (batch = {}, steps = {})", p.name, batch,
                                          steps));
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
}

// The checks every launch shares: sizes, their agreement with the spec.
void check_sizes(const E23Spec& spec, std::int64_t batch, std::int64_t steps, std::int64_t dim, std::int64_t n_slots) {
  if (batch < 0)
    throw InvalidArgument(fmt::format("e23: batch = {} is not allowed: it must be >= 0", batch));
  if (steps < 0)
    throw InvalidArgument(fmt::format("e23: steps = {} is not allowed: it must be >= 0", steps));
  // Offsets inside the kernel are int for [batch, dim] and [steps] arrays.
  if (batch > INT_MAX / spec.dim)
    throw InvalidArgument(fmt::format("e23: batch = {} is too large: batch * dim must stay below 2^31 (at most {} "
                                      "batch rows for dim = {})", batch, INT_MAX / spec.dim, spec.dim));
  if (steps > INT_MAX)
    throw InvalidArgument(fmt::format("e23: steps = {} is too large: at most {}", steps, INT_MAX));
  if (dim != 0 && dim != spec.dim)
    throw InvalidArgument(fmt::format("e23: args.dim = {} but the kernel was specialized for dim = {} ('{}')", dim,
                                      spec.dim, key(spec)));
  if (n_slots != 0 && n_slots != spec.n_slots)
    throw InvalidArgument(fmt::format("e23: args.n_slots = {} but the kernel was specialized for n_slots = {} ('{}')",
                                      n_slots, spec.n_slots, key(spec)));
}

void check_checkpoint_every(std::int64_t checkpoint_every) {
  if (checkpoint_every < 0 || checkpoint_every > INT_MAX)
    throw InvalidArgument(fmt::format("e23: checkpoint_every = {} is not allowed: it must be 0 (ceil(sqrt(steps))) "
                                      "or a step count from 1 to {}", checkpoint_every, INT_MAX));
}

}  // namespace

std::int64_t checkpoint_interval(std::int64_t steps, std::int64_t checkpoint_every) {
  check_checkpoint_every(checkpoint_every);
  std::int64_t k = checkpoint_every;
  if (k == 0) {
    k = 1;
    while (k * k < steps) ++k;
  }
  return std::max<std::int64_t>(1, std::min(k, steps));
}

SavedLayout saved_layout(const E23Spec& spec, std::int64_t batch, std::int64_t steps, std::int64_t k) {
  const std::size_t b = std::size_t(batch), t = std::size_t(steps), n = std::size_t(spec.n_slots),
                    d = std::size_t(spec.dim), checkpoints = std::size_t((steps + k - 1) / k);
  SavedLayout l;
  Carver c;
  l.h = c.part((t + 1) * b * d * 4);
  l.w = c.part(t * b * d * 4);
  l.m = c.part(checkpoints * b * n * d * 4);
  l.total = c.at;
  return l;
}

BackwardLayout backward_layout(const E23Spec& spec, std::int64_t batch, std::int64_t steps, std::int64_t k) {
  const std::size_t b = std::size_t(batch), t = std::size_t(steps), n = std::size_t(spec.n_slots),
                    d = std::size_t(spec.dim), kk = std::size_t(k), elem = size_of(spec.dtype);
  BackwardLayout l;
  Carver c;
  l.barrier = c.part(forward_counter_bytes(batch));  // the same counters: a grid barrier, two per batch group
  l.w_h_t = c.part(d * d * elem);
  l.w_w_t = c.part(d * d * elem);
  l.g_m = c.part(b * n * d * 4);
  l.seg_m = c.part(kk * b * n * d * 4);
  l.seg_a = c.part(kk * b * n * 4);
  l.seg_b = c.part(kk * b * n * 4);
  l.g_w = c.part(t * b * d * 4);
  l.g_z = c.part(t * b * d * 4);
  l.g_h_tape = c.part(b * d * 4);
  l.g_h_gemm = c.part(b * d * 4);
  l.g_h_write = c.part(b * d * 4);
  l.g_z_tagged = c.part(b * d * 8);  // tagged words: value and phase
  l.total = c.at;
  return l;
}

std::size_t forward_counter_bytes(std::int64_t batch) {
  const std::size_t groups = std::size_t((batch + 31) / 32);
  return 128 * (1 + 2 * groups);
}

WorkspaceLayout workspace_layout(const E23Spec& spec, std::int64_t batch) {
  const std::size_t b = std::size_t(batch), n = std::size_t(spec.n_slots), d = std::size_t(spec.dim);
  WorkspaceLayout l;
  Carver c;
  l.barrier = c.part(forward_counter_bytes(batch));
  l.h = c.part(b * d * 4);
  l.z = c.part(b * d * 8);  // tagged words: value and phase
  l.w = c.part(b * d * 8);
  l.m = c.part(b * n * d * 4);
  l.q = c.part(b * n * 4);
  l.b = c.part(b * n * 4);
  l.total = c.at;
  return l;
}

void check_forward_args(const E23Spec& spec, const E23ForwardArgs& a) {
  check_sizes(spec, a.batch, a.steps, a.dim, a.n_slots);
  check_checkpoint_every(a.checkpoint_every);
  if (a.batch == 0) return;

  const std::size_t elem = size_of(spec.dtype);
  const std::size_t b = std::size_t(a.batch), t = std::size_t(a.steps), n = std::size_t(spec.n_slots),
                    d = std::size_t(spec.dim);
  const bool any_step = a.steps > 0;
  const std::size_t saved =
      a.saved != nullptr ? saved_layout(spec, a.batch, a.steps, checkpoint_interval(a.steps, a.checkpoint_every)).total
                         : 0;
  check_pointers({{"u", a.u, t * b * d * elem, any_step, false, 16},
                  {"h0", a.h0, b * d * elem, true, false, 16},
                  {"m0", a.m0, b * n * d * elem, true, false, 16},
                  {"w_h", a.w_h, d * d * elem, any_step, false, 16},
                  {"w_w", a.w_w, d * d * elem, any_step, false, 16},
                  {"y", a.y, t * b * d * elem, any_step, true, 16},
                  {"h_final", a.h_final, b * d * elem, false, true, 16},
                  {"m_final", a.m_final, b * n * d * elem, false, true, 16},
                  {"read_support", a.read_support, t * 4, false, true, 4},
                  {"write_support", a.write_support, t * 4, false, true, 4},
                  {"saved", a.saved, saved, false, true, 16}},
                 a.batch, a.steps);
  if (a.workspace != nullptr && reinterpret_cast<std::uintptr_t>(a.workspace) % 256 != 0)
    throw InvalidArgument(fmt::format("e23: workspace = {} is not 256-byte aligned", a.workspace));
}

void check_backward_args(const E23Spec& spec, const E23BackwardArgs& a) {
  check_sizes(spec, a.batch, a.steps, a.dim, a.n_slots);
  check_checkpoint_every(a.checkpoint_every);
  const std::size_t elem = size_of(spec.dtype);
  const std::size_t b = std::size_t(a.batch), t = std::size_t(a.steps), n = std::size_t(spec.n_slots),
                    d = std::size_t(spec.dim);
  const bool any_step = a.steps > 0 && a.batch > 0, any_row = a.batch > 0;
  const std::size_t saved = saved_layout(spec, a.batch, a.steps, checkpoint_interval(a.steps, a.checkpoint_every)).total;
  check_pointers({{"w_h", a.w_h, d * d * elem, any_step, false, 16},
                  {"w_w", a.w_w, d * d * elem, any_step, false, 16},
                  {"dy", a.dy, t * b * d * elem, any_step, false, 16},
                  {"dh_final", a.dh_final, b * d * elem, false, false, 16},
                  {"dm_final", a.dm_final, b * n * d * elem, false, false, 16},
                  {"saved", a.saved, saved, any_step, false, 16},
                  {"du", a.du, t * b * d * elem, any_step, true, 16},
                  {"dh0", a.dh0, b * d * elem, any_row, true, 16},
                  {"dm0", a.dm0, b * n * d * elem, any_row, true, 16},
                  {"dw_h", a.dw_h, d * d * elem, true, true, 16},
                  {"dw_w", a.dw_w, d * d * elem, true, true, 16}},
                 a.batch, a.steps);
  if (a.workspace != nullptr && reinterpret_cast<std::uintptr_t>(a.workspace) % 256 != 0)
    throw InvalidArgument(fmt::format("e23: workspace = {} is not 256-byte aligned", a.workspace));
}

}  // namespace sjit::e23

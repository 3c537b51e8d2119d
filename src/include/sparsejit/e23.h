// The E23 dual-memory Elman cell on the GPU (docs/e23.md): a fused forward over a sequence, one
// persistent launch for all steps and batch rows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "sparsejit/device.h"
#include "sparsejit/e23_spec.h"

namespace sjit {

// Device pointers, row-major in spec.dtype (docs/e23.md "Shapes and layouts"); every pointer 16-byte
// aligned. Outputs must not overlap inputs.
struct E23ForwardArgs {
  const void* u = nullptr;    // [steps, batch, dim]: u_t = W_x x_t + b, computed by the caller
  const void* h0 = nullptr;   // [batch, dim]
  const void* m0 = nullptr;   // [batch, n_slots, dim]
  const void* w_h = nullptr;  // [dim, dim]: (W h)_i = sum_j W[i * dim + j] h_j
  const void* w_w = nullptr;  // [dim, dim]
  void* y = nullptr;          // [steps, batch, dim]: y_t = h_{t+1}
  void* h_final = nullptr;    // [batch, dim], optional
  void* m_final = nullptr;    // [batch, n_slots, dim], optional
  float* read_support = nullptr;   // [steps], optional: mean over batch rows of #{i : a_i > 0}
  float* write_support = nullptr;  // [steps], optional: the same for the write weights b
  std::int64_t batch = 1, steps = 1;
  // Optional: the caller's idea of the sizes the weights and tape were made for, checked against the
  // spec (0: not checked). A mismatch raises InvalidArgument instead of reading the wrong rows.
  std::int64_t dim = 0, n_slots = 0;
  // Optional: workspace_bytes(batch) bytes of device memory, 256-byte aligned, for this call alone.
  // Null: the object's own workspace, which serializes calls on one E23 object (see forward_sequence).
  void* workspace = nullptr;
};

// A prepared E23 cell: compiles (or finds) its kernel once, then launches with little host work.
class E23 {
 public:
  explicit E23(const E23Spec& spec);
  ~E23();
  E23(E23&&) noexcept;
  E23& operator=(E23&&) noexcept;

  // Compiles and loads the kernel for the current device now; with batch > 0 also allocates the own
  // workspace for that many batch rows (so a later launch, for instance under graph capture, allocates
  // nothing).
  void prepare(std::int64_t batch = 0);

  // All steps in one launch. The launch is persistent: its CTAs wait for each other at grid barriers,
  // so it must not share the GPU with a kernel that could keep some of them from starting (see
  // docs/e23.md). Calls that use the object's own workspace must not run concurrently on two streams.
  void forward_sequence(const E23ForwardArgs& args, Stream stream = nullptr);
  // One step: forward_sequence with args.steps == 1 (checked).
  void step(const E23ForwardArgs& args, Stream stream = nullptr);

  std::size_t workspace_bytes(std::int64_t batch) const;
  // CTAs of a launch for this batch on the current device (at most what can be resident at once).
  int grid_size(std::int64_t batch);

  const E23Spec& spec() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace sjit

// The E23 dual-memory Elman cell on the GPU (docs/e23.md): a fused forward over a sequence, one
// persistent launch for all steps and batch rows, and its backward through time (another one).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

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
  // Optional, for training: saved_bytes(batch, steps, checkpoint_every) bytes of device memory, 16-byte
  // aligned, where the forward keeps what backward_sequence needs (docs/e23.md "Backward through time on
  // the GPU": h_t and w_t of every step in fp32, the tape every K steps). Null: nothing is saved.
  void* saved = nullptr;
  // K, the steps between saved tapes: 0 picks ceil(sqrt(steps)). The backward must be given the same.
  std::int64_t checkpoint_every = 0;
};

// Device pointers for the backward through time of one forward_sequence call made with args.saved set
// (same batch, steps and checkpoint_every). Gradients of a loss L: inputs dL/dy and optionally dL/dh_final
// and dL/dm_final; outputs dL/du, dL/dh0, dL/dm0, dL/dW_h, dL/dW_w. All in spec.dtype (rounded once at the
// end; everything inside is fp32), row-major as in the forward, 16-byte aligned; outputs must not overlap
// inputs or each other. dW_h and dW_w are overwritten, not accumulated into, and are deterministic.
struct E23BackwardArgs {
  const void* w_h = nullptr;       // [dim, dim], as given to the forward
  const void* w_w = nullptr;       // [dim, dim]
  const void* dy = nullptr;        // [steps, batch, dim]
  const void* dh_final = nullptr;  // [batch, dim], optional (zero)
  const void* dm_final = nullptr;  // [batch, n_slots, dim], optional (zero)
  const void* saved = nullptr;     // what the forward saved: saved_bytes(batch, steps, checkpoint_every) bytes
  void* du = nullptr;              // [steps, batch, dim]
  void* dh0 = nullptr;             // [batch, dim]
  void* dm0 = nullptr;             // [batch, n_slots, dim]
  void* dw_h = nullptr;            // [dim, dim]
  void* dw_w = nullptr;            // [dim, dim]
  std::int64_t batch = 1, steps = 1;
  std::int64_t dim = 0, n_slots = 0;  // optional checks against the spec, as in E23ForwardArgs
  std::int64_t checkpoint_every = 0;  // the forward's
  // Optional: backward_workspace_bytes(batch, steps, checkpoint_every) bytes, 256-byte aligned. Null: the
  // object's own backward workspace (calls on one object then must not run concurrently).
  void* workspace = nullptr;
};

// One span of a profiled forward launch (E23::profile_forward): the mean time per step that the CTAs of
// one role spend between two points of a step, or a cross-CTA figure (role "grid").
struct E23ProfileSpan {
  std::string role;  // "tape" (CTAs that own a batch row's tape item), "tile" (product tiles only), "grid"
  std::string span;  // e.g. "A: scores -> normalized", "A: arrived -> released"
  double ns_per_step = 0;  // mean over the steps after the first and over the role's CTAs
  double max_ns = 0;       // the largest per-CTA mean
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

  // One forward launch of `args` with per-phase timing (clock64 and the global timer at each phase
  // boundary, recorded by every CTA; docs/e23.md "Where the time goes"), synchronized, summarized per
  // role and span. For measurement only: the stores of the timing slow the launch a little.
  std::vector<E23ProfileSpan> profile_forward(const E23ForwardArgs& args, Stream stream = nullptr);

  // The backward through time of a forward_sequence call that saved its state (args.saved). One
  // persistent launch, like the forward: it replays the tape segment by segment from the checkpoints
  // and undoes the steps from the last to the first (docs/e23.md).
  void backward_sequence(const E23BackwardArgs& args, Stream stream = nullptr);
  // One backward launch with per-phase timing, as profile_forward (roles "tape", "tile", "grid", and
  // "launch (...)" for the prologue, the steps and dW of the launch as a whole).
  std::vector<E23ProfileSpan> profile_backward(const E23BackwardArgs& args, Stream stream = nullptr);
  // Compiles and loads the backward kernel; with batch > 0 also allocates the own backward workspace.
  void prepare_backward(std::int64_t batch = 0, std::int64_t steps = 0, std::int64_t checkpoint_every = 0);

  // K for `steps` steps: checkpoint_every when > 0, else ceil(sqrt(steps)) (at least 1).
  static std::int64_t checkpoint_interval(std::int64_t steps, std::int64_t checkpoint_every = 0);
  // Bytes the forward saves for the backward (the activation memory kept between the two calls):
  // 4 ((2 T + 1) B D + ceil(T / K) B N D), each part rounded up to 256 bytes.
  std::size_t saved_bytes(std::int64_t batch, std::int64_t steps, std::int64_t checkpoint_every = 0) const;
  // Bytes of the backward's workspace (needed during the backward only): 4 ((K + 1) B N D + 2 K B N +
  // 2 T B D + 3 B D) plus both weights transposed (2 D^2 elements), each part rounded up to 256 bytes.
  std::size_t backward_workspace_bytes(std::int64_t batch, std::int64_t steps, std::int64_t checkpoint_every = 0) const;
  // CTAs of a launch for this batch on the current device (at most what can be resident at once).
  int grid_size(std::int64_t batch);
  int backward_grid_size(std::int64_t batch);
  // Whether a forward launch for this batch keeps each batch row's tape in its CTA's shared memory (when
  // a row's N x D fp32 tape fits next to the kernel's own shared memory and every row gets a CTA of its
  // own; else the tape lives in the workspace). docs/e23.md "How a launch works".
  bool tape_on_chip(std::int64_t batch);

  const E23Spec& spec() const;

 private:
  void launch_forward(const E23ForwardArgs& args, Stream stream, unsigned long long* profile);
  void launch_backward(const E23BackwardArgs& args, Stream stream, unsigned long long* profile);
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace sjit

// Checks of E23 launch arguments: every error names the argument, its value and what is allowed.
#pragma once

#include <cstddef>

#include "sparsejit/e23.h"

namespace sjit::e23 {

// Byte offsets of the workspace's parts for `batch` rows (each part 256-byte aligned).
struct WorkspaceLayout {
  std::size_t barrier = 0, h = 0, z = 0, w = 0, m = 0, q = 0, b = 0, total = 0;
};
WorkspaceLayout workspace_layout(const E23Spec& spec, std::int64_t batch);
// The counters of both kernels (E23ForwardParams::barrier, E23BackwardParams::barrier): the grid barrier
// and two per 32-row batch group, a 128-byte line each; zeroed before every launch.
std::size_t forward_counter_bytes(std::int64_t batch);

// What the forward saves for the backward (fp32): h_0 .. h_T, w_0 .. w_{T-1}, the tape every K steps.
struct SavedLayout {
  std::size_t h = 0, w = 0, m = 0, total = 0;
};
SavedLayout saved_layout(const E23Spec& spec, std::int64_t batch, std::int64_t steps, std::int64_t k);

// The backward's workspace (see E23BackwardParams in e23_params.cuh).
struct BackwardLayout {
  std::size_t barrier = 0, w_h_t = 0, w_w_t = 0, g_m = 0, seg_m = 0, seg_a = 0, seg_b = 0, g_w = 0, g_z = 0,
              g_h_tape = 0, g_h_gemm = 0, g_h_write = 0, g_z_tagged = 0, total = 0;
};
BackwardLayout backward_layout(const E23Spec& spec, std::int64_t batch, std::int64_t steps, std::int64_t k);

// K: checkpoint_every when > 0, else ceil(sqrt(steps)), and never more than steps (at least 1).
std::int64_t checkpoint_interval(std::int64_t steps, std::int64_t checkpoint_every);

// Throws InvalidArgument for a bad size, a missing or misaligned pointer, an output overlapping an
// input, or sizes that disagree with the spec.
void check_forward_args(const E23Spec& spec, const E23ForwardArgs& args);
void check_backward_args(const E23Spec& spec, const E23BackwardArgs& args);

}  // namespace sjit::e23

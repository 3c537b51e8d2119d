// The warps of the Hopper backward kernels that hand their copies to a warpgroup of their own (the
// dK/dV pass, attention_backward_sm90.cuh, and at d = 256 the dQ pass, attention_backward_dq_sm90.cuh):
// two math warpgroups, then a helper warpgroup whose first warp issues the copies. The helpers give
// their registers to the math warps (setmaxnreg), out of the share the launch gives every thread.
#pragma once

namespace sjit_kernels {

struct BackwardWarpRoles {
  static constexpr int math_threads = 256, math_warps = 8, helper_threads = 128;
  static constexpr int math_registers = 232, helper_registers = 40;
  static constexpr int copy_warp = math_warps;
  static constexpr int math_barrier = 3;  // named (0 is __syncthreads', 1 and 2 warpgroup_barrier's)
  // 2 x 128 x 232 + 128 x 40: the 384 x 168 registers the launch gives the CTA (setmaxnreg.inc would
  // wait forever for more).
  static constexpr int launch_share = 65536 / (math_threads + helper_threads) / 8 * 8;
  // Whether a split of registers between the math and helper warps is all the launch gives the CTA.
  static constexpr bool takes_launch_share(int math, int helper) {
    return math_threads * math + helper_threads * helper == (math_threads + helper_threads) * launch_share;
  }
};
static_assert(BackwardWarpRoles::takes_launch_share(BackwardWarpRoles::math_registers,
                                                   BackwardWarpRoles::helper_registers),
              "the math and helper warps' registers: all the launch gives the CTA");

}  // namespace sjit_kernels

// A barrier across every CTA of a persistent launch, built from one global counter.
//
// It is correct only when every CTA of the grid is resident at once (a CTA spinning here would
// otherwise wait for one that can never start): the front end launches at most the number of CTAs
// the occupancy calculator allows on all SMs together. The counter is zeroed before the launch and
// only ever grows, so barrier k waits until the counter reaches (k + 1) * gridDim.x.
#pragma once

namespace sjit_kernels {

__device__ __forceinline__ unsigned load_acquire_gpu(const unsigned* p) {
  unsigned value;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(value) : "l"(p) : "memory");
  return value;
}

// Every thread of every CTA calls it. The fences on either side make the CTA's writes before the
// barrier visible to every CTA after it (the pattern of cooperative_groups::grid_group::sync).
__device__ __forceinline__ void grid_sync(unsigned* counter) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    const unsigned ticket = atomicAdd(counter, 1u);
    const unsigned target = (ticket / gridDim.x + 1) * gridDim.x;
    while (int(load_acquire_gpu(counter) - target) < 0) {
    }
    __threadfence();
  }
  __syncthreads();
}

}  // namespace sjit_kernels

// Signals between the CTAs of one launch through counters in global memory: a producer adds to a
// counter with release semantics once its stores are done; a consumer polls it with acquiring loads,
// after which it sees those stores.
#pragma once

namespace sjit_kernels {

__device__ __forceinline__ unsigned load_acquire_gpu(const unsigned* p) {
  unsigned value;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(value) : "l"(p) : "memory");
  return value;
}

}  // namespace sjit_kernels

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

// One more on `counter`, with release semantics: the caller's stores before it (and those ordered
// before them, as by a barrier) are visible to whoever acquires the new count.
__device__ __forceinline__ void add_release_gpu(unsigned* counter) {
  asm volatile("red.release.gpu.global.add.u32 [%0], 1;\n" ::"l"(counter) : "memory");
}

}  // namespace sjit_kernels

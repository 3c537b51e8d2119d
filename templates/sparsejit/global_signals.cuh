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

// Global memory written through the async proxy (bulk copies and reductions, once waited for) ordered
// with this thread's generic accesses: before a release that publishes those writes, or after an
// acquire, before bulk copies that read what other CTAs' bulk writes published.
__device__ __forceinline__ void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;\n" ::: "memory"); }

// add_release_gpu for this thread's bulk writes to global memory, waited for (cp.async.bulk.wait_group 0).
__device__ __forceinline__ void add_release_after_bulk_writes(unsigned* counter) {
  fence_proxy_async_global();
  add_release_gpu(counter);
}

}  // namespace sjit_kernels

// A barrier across every CTA of a persistent launch, built from one global counter.
//
// It is correct only when every CTA of the grid is resident at once (a CTA spinning here would
// otherwise wait for one that can never start): the front end launches at most the number of CTAs
// the occupancy calculator allows on all SMs together. The counter is zeroed before the launch and
// only ever grows, so barrier k (counted from 0) ends once it reaches (k + 1) * gridDim.x. Each CTA
// counts its own barriers, so the arrival needs no answer from the atomic: it is a fire-and-forget
// reduction (RED), and the only round trips a CTA waits for are its fence and the polling loads.
#pragma once

#include "sparsejit/global_signals.cuh"

namespace sjit_kernels {

// Point-to-point signals between CTAs: a counter that producers add to once their stores are done and
// consumers wait on until it reaches a target. The release on the add (after __syncthreads) makes every
// store of the CTA before it visible to a CTA whose acquiring load sees the new count.
__device__ __forceinline__ void signal_counter(unsigned* counter) {
  __syncthreads();
  if (threadIdx.x == 0) add_release_gpu(counter);
}
// Every thread of the CTA; the CTA's later loads see what the producers stored before their adds.
__device__ __forceinline__ void wait_counter(const unsigned* counter, unsigned target) {
  if (threadIdx.x == 0)
    while (int(load_acquire_gpu(counter) - target) < 0) {
    }
  __syncthreads();
}

// Tagged words: a value and the phase that wrote it in one naturally aligned 64-bit word, which a load
// sees whole or not at all. A consumer that polls the words themselves until their tags match needs no
// counter and no fence on the producer's side: the data is its own signal (one L2 round trip from store
// to sight instead of fence, add, poll and load). The words are zeroed before the launch and tags start
// at 1, so a stale word never matches.
__device__ __forceinline__ void store_tagged(unsigned long long* p, float value, unsigned tag) {
  const unsigned long long word = (static_cast<unsigned long long>(tag) << 32) | __float_as_uint(value);
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(word) : "memory");
}
// Four consecutive tagged words (16-byte aligned) as a float4, once every one carries `tag`.
__device__ __forceinline__ float4 poll_tagged4(const unsigned long long* p, unsigned tag) {
  unsigned long long w0, w1, w2, w3;
  do {
    asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(w0), "=l"(w1) : "l"(p) : "memory");
    asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(w2), "=l"(w3) : "l"(p + 2) : "memory");
  } while (unsigned(w0 >> 32) != tag || unsigned(w1 >> 32) != tag || unsigned(w2 >> 32) != tag ||
           unsigned(w3 >> 32) != tag);
  return make_float4(__uint_as_float(unsigned(w0)), __uint_as_float(unsigned(w1)), __uint_as_float(unsigned(w2)),
                     __uint_as_float(unsigned(w3)));
}

// One per launch, constructed by every thread of every CTA with the launch's zeroed counter; every
// thread calls sync() at the same points.
struct GridBarrier {
  unsigned* counter;
  unsigned target = 0;  // the count that ends the next barrier (only thread 0's copy is used)

  // The fence before the arrival makes the CTA's writes (ordered before it by __syncthreads) visible
  // to every CTA that sees the arrival; the acquiring load orders what the CTA reads afterwards.
  // arrive() and wait() are the two halves of sync(), split so that a profile can time each.
  __device__ __forceinline__ void arrive() {
    __syncthreads();
    target += gridDim.x;
    if (threadIdx.x == 0) {
      __threadfence();
      atomicAdd(counter, 1u);  // result unused: compiled to a reduction, no round trip
    }
  }
  __device__ __forceinline__ void wait() {
    if (threadIdx.x == 0)
      while (int(load_acquire_gpu(counter) - target) < 0) {
      }
    __syncthreads();
  }
  // wait() for a CTA with nothing to do until then: it polls every `ns` nanoseconds instead of back to back.
  __device__ __forceinline__ void wait_sleeping(unsigned ns) {
    if (threadIdx.x == 0)
      while (int(load_acquire_gpu(counter) - target) < 0) __nanosleep(ns);
    __syncthreads();
  }
  __device__ __forceinline__ void sync() {
    arrive();
    wait();
  }
};

}  // namespace sjit_kernels

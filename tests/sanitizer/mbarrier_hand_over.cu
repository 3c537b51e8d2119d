// Does compute-sanitizer's racecheck take an mbarrier hand-over of plain shared-memory data as
// synchronized? A producer warp stores a slot and arrives on `full`; a consumer warp waits, reads the
// slot across lanes and hands it back on `empty`, four times. Two ways to hand it back:
//   every-lane: each consumer lane arrives (count 32);
//   one-lane:   the lanes meet at __syncwarp and lane 0 arrives (count 1), as the sm_90 backward's math
//               warps release a ring slot (attention_backward_sm90.cuh).
// Both are ordered by the PTX memory model (the warp barrier orders the lanes' reads before lane 0's
// release). On the lent H200 (CUDA 13.0, 2026-11-29) racecheck reported 0 hazards for every-lane and
// 2 (3 errors) for one-lane, both with the right result: the tool does not follow the one-lane form,
// which is why it reports the backward's hand-overs. Build and run on the GPU machine:
//   nvcc -arch=sm_90a -o /tmp/hand_over tests/sanitizer/mbarrier_hand_over.cu
//   compute-sanitizer --tool racecheck /tmp/hand_over every-lane; ... /tmp/hand_over one-lane
#include <cstdio>
#include <cstring>

__device__ void mbarrier_init(unsigned b, unsigned n) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(b), "r"(n) : "memory");
}
__device__ void mbarrier_arrive(unsigned b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(b) : "memory");
}
__device__ void mbarrier_wait(unsigned b, unsigned phase) {
  unsigned done = 0;
  do {
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(b), "r"(phase)
                 : "memory");
  } while (!done);
}

__global__ void hand_over(float* out, bool one_lane) {
  __shared__ alignas(8) unsigned long long barriers[2];
  __shared__ float slot[32];
  const unsigned full = unsigned(__cvta_generic_to_shared(&barriers[0])), empty = full + 8;
  const int lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    mbarrier_init(full, 32);
    mbarrier_init(empty, one_lane ? 1 : 32);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  float sum = 0;
  for (int round = 0; round < 4; ++round) {
    if (threadIdx.x < 32) {  // producer
      if (round > 0) mbarrier_wait(empty, (round - 1) & 1);
      slot[lane] = float(round + lane);
      mbarrier_arrive(full);
    } else {  // consumer: reads another lane's element
      mbarrier_wait(full, round & 1);
      sum += slot[31 - lane];
      if (one_lane) {
        __syncwarp();
        if (lane == 0) mbarrier_arrive(empty);
      } else {
        mbarrier_arrive(empty);
      }
    }
  }
  if (threadIdx.x >= 32) out[lane] = sum;
}

int main(int argc, char** argv) {
  const bool one_lane = argc > 1 && std::strcmp(argv[1], "one-lane") == 0;
  float* out = nullptr;
  cudaMalloc(&out, 32 * sizeof(float));
  hand_over<<<1, 64>>>(out, one_lane);
  const cudaError_t status = cudaDeviceSynchronize();
  float host[32] = {};
  cudaMemcpy(host, out, sizeof host, cudaMemcpyDeviceToHost);
  // Consumer lane 0 reads element 31 of rounds 0..3: 31 + 32 + 33 + 34.
  std::printf("%s (%s): out[0] = %g, expected 130\n", one_lane ? "one-lane" : "every-lane", cudaGetErrorString(status),
              host[0]);
  return status == cudaSuccess && host[0] == 130.0f ? 0 : 1;
}

// The Hopper backward kernels' hand-over at d = 256, where their two math warpgroups split a tile by
// role: warpgroup 0 computes P (the dK/dV pass: P^T) and hands it over in fp32; warpgroup 1 computes
// dP and dS and hands dS back as packed A fragments, which both then multiply. Each thread's values
// travel in 16-byte chunks, chunk c of the warpgroup's 128 threads side by side (conflict-free), so a
// thread of the other warpgroup at the same place in it reads the same fragment positions. One buffer
// each way suffices: a warpgroup writes its hand-over of tile j + 1 only after the other has met it
// past reading that of tile j.
#pragma once

#include "sparsejit/wgmma.cuh"  // named_barrier_arrive, named_barrier_sync

namespace sjit_kernels {

template <int N_TILES, int K_STEPS>
struct WarpgroupHandOver {
  static constexpr int p_bytes = N_TILES * 128 * 16, ds_bytes = K_STEPS * 128 * 16;
  // Named barriers (past the kernels' others) over both warpgroups: P written (warpgroup 0 arrives,
  // warpgroup 1 waits), dS written (both meet).
  static constexpr int p_ready = 7, ds_ready = 8, threads = 256;
  float4* p;
  uint4* ds;
  __device__ explicit WarpgroupHandOver(unsigned char* at)
      : p(reinterpret_cast<float4*>(at) + threadIdx.x % 128), ds(reinterpret_cast<uint4*>(at + p_bytes) + threadIdx.x % 128) {}

  // Warpgroup 0: its P, then on without waiting.
  __device__ void send_p(const float (&acc)[N_TILES][4]) const {
#pragma unroll
    for (int nt = 0; nt < N_TILES; ++nt) p[nt * 128] = make_float4(acc[nt][0], acc[nt][1], acc[nt][2], acc[nt][3]);
    named_barrier_arrive<p_ready, threads>();
  }
  // Warpgroup 1: waits for P, then reads it chunk by chunk (p_chunk).
  __device__ void wait_for_p() const { named_barrier_sync<p_ready, threads>(); }
  __device__ float4 p_chunk(int nt) const { return p[nt * 128]; }
  // Warpgroup 1: its dS.
  __device__ void put_ds(const unsigned (&a)[K_STEPS][4]) const {
#pragma unroll
    for (int kk = 0; kk < K_STEPS; ++kk) ds[kk * 128] = make_uint4(a[kk][0], a[kk][1], a[kk][2], a[kk][3]);
  }
  // Both: once warpgroup 1 has put dS, each thread takes it (warpgroup 1 reads back what it wrote, so
  // that the products after it are issued outside any branch on the warpgroup).
  __device__ void take_ds(unsigned (&a)[K_STEPS][4]) const {
    named_barrier_sync<ds_ready, threads>();
#pragma unroll
    for (int kk = 0; kk < K_STEPS; ++kk) {
      const uint4 v = ds[kk * 128];
      a[kk][0] = v.x, a[kk][1] = v.y, a[kk][2] = v.z, a[kk][3] = v.w;
    }
  }
};

}  // namespace sjit_kernels

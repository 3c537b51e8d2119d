// The part of one row that one thread owns, kept in fp32 on chip while the kernel works on it.
//
// Layout: the row is cut into packets of VEC consecutive elements; lane l of a team of TPR threads
// owns packets l, l + TPR, l + 2 TPR, ... so that a team's loads are contiguous and coalesced.
// Storage: registers for rows that fit (the compiler keeps v[][] in registers because every index
// is a compile-time constant after unrolling), or shared memory for long rows, where a register
// array would spill. A thread only ever touches its own elements, so neither needs a barrier.
#pragma once

#include "sparsejit/element.cuh"

namespace sjit_kernels {

template <class T, int N, int TPR, int VEC, bool IN_SMEM>
struct RowSlice;

// Registers. Elements past the end of the row are padding that holds `pad` (the forward uses -inf,
// neutral for max, exp, [x - tau]_+ and membership x > tau; the backward uses 0) and is never stored.
template <class T, int N, int TPR, int VEC>
struct RowSlice<T, N, TPR, VEC, false> {
  static constexpr int sweeps = (N + TPR * VEC - 1) / (TPR * VEC);
  float v[sweeps][VEC];
  int lane;

  __device__ __forceinline__ RowSlice(float*, int lane_in_team) : lane(lane_in_team) {}

  __device__ __forceinline__ static int index(int sweep, int lane) { return (sweep * TPR + lane) * VEC; }

  // `active` is false for teams past the last row: they read nothing and work on a harmless row of 0.
  __device__ __forceinline__ void load(const T* __restrict__ row, bool active, float pad) {
#pragma unroll
    for (int s = 0; s < sweeps; ++s) {
      const int i = index(s, lane);
      if (i < N && active) {
        load_packet<T, VEC>(row + i, v[s]);
      } else {
#pragma unroll
        for (int e = 0; e < VEC; ++e) v[s][e] = i < N ? 0.0f : pad;
      }
    }
  }

  __device__ __forceinline__ void store(T* __restrict__ row) const {
#pragma unroll
    for (int s = 0; s < sweeps; ++s)
      if (index(s, lane) < N) store_packet<T, VEC>(row + index(s, lane), v[s]);
  }

  // f(float& element) for every element this thread owns, padding included.
  template <class F>
  __device__ __forceinline__ void for_each(F f) {
#pragma unroll
    for (int s = 0; s < sweeps; ++s)
#pragma unroll
      for (int e = 0; e < VEC; ++e) f(v[s][e]);
  }

  // f(float& a, float& b) over the same positions of two slices (backward: y and dy).
  template <class F>
  __device__ __forceinline__ void for_each_with(RowSlice& other, F f) {
#pragma unroll
    for (int s = 0; s < sweeps; ++s)
#pragma unroll
      for (int e = 0; e < VEC; ++e) f(v[s][e], other.v[s][e]);
  }
};

// Shared memory: `base` points at N floats reserved for this row. Same ownership as the registers
// variant, real elements only. The two-slice loop unrolls by 4 only: unrolled fully, ptxas spilled
// in the general-alpha backward at n = 16384 (nothing here needs constant indices).
template <class T, int N, int TPR, int VEC>
struct RowSlice<T, N, TPR, VEC, true> {
  static constexpr int sweeps = (N + TPR * VEC - 1) / (TPR * VEC);
  float* base;
  int lane;

  __device__ __forceinline__ RowSlice(float* row_smem, int lane_in_team) : base(row_smem), lane(lane_in_team) {}

  __device__ __forceinline__ static int index(int sweep, int lane) { return (sweep * TPR + lane) * VEC; }

  __device__ __forceinline__ void load(const T* __restrict__ row, bool active, float /*pad: none here*/) {
#pragma unroll
    for (int s = 0; s < sweeps; ++s) {
      const int i = index(s, lane);
      if (i >= N) break;
      float packet[VEC];
      if (active) {
        load_packet<T, VEC>(row + i, packet);
      } else {
#pragma unroll
        for (int e = 0; e < VEC; ++e) packet[e] = 0.0f;
      }
#pragma unroll
      for (int e = 0; e < VEC; ++e) base[i + e] = packet[e];
    }
  }

  __device__ __forceinline__ void store(T* __restrict__ row) const {
#pragma unroll
    for (int s = 0; s < sweeps; ++s) {
      const int i = index(s, lane);
      if (i >= N) break;
      float packet[VEC];
#pragma unroll
      for (int e = 0; e < VEC; ++e) packet[e] = base[i + e];
      store_packet<T, VEC>(row + i, packet);
    }
  }

  template <class F>
  __device__ __forceinline__ void for_each(F f) {
#pragma unroll
    for (int s = 0; s < sweeps; ++s) {
      const int i = index(s, lane);
      if (i >= N) break;
#pragma unroll
      for (int e = 0; e < VEC; ++e) f(base[i + e]);
    }
  }

  template <class F>
  __device__ __forceinline__ void for_each_with(RowSlice& other, F f) {
#pragma unroll 4
    for (int s = 0; s < sweeps; ++s) {
      const int i = index(s, lane);
      if (i >= N) break;
#pragma unroll
      for (int e = 0; e < VEC; ++e) f(base[i + e], other.base[i + e]);
    }
  }
};

}  // namespace sjit_kernels

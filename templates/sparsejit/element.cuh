// Element types and vector memory access: every kernel reads T and computes in float.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace sjit_kernels {

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <class T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// VEC consecutive elements moved as one access of VEC * sizeof(T) bytes (16 at most): the alignment
// this needs is checked on the host before launch.
template <class T, int VEC>
struct alignas(sizeof(T) * VEC) Packet {
  T v[VEC];
};

template <class T, int VEC>
__device__ __forceinline__ void load_packet(const T* __restrict__ src, float (&dst)[VEC]) {
  const Packet<T, VEC> p = *reinterpret_cast<const Packet<T, VEC>*>(src);
#pragma unroll
  for (int e = 0; e < VEC; ++e) dst[e] = to_float(p.v[e]);
}

template <class T, int VEC>
__device__ __forceinline__ void store_packet(T* __restrict__ dst, const float (&src)[VEC]) {
  Packet<T, VEC> p;
#pragma unroll
  for (int e = 0; e < VEC; ++e) p.v[e] = from_float<T>(src[e]);
  *reinterpret_cast<Packet<T, VEC>*>(dst) = p;
}

__device__ __forceinline__ float quiet_nan() { return __int_as_float(0x7fffffff); }
__device__ __forceinline__ float infinity() { return __int_as_float(0x7f800000); }

}  // namespace sjit_kernels

// Tensor-core and asynchronous-copy primitives of sm_80 and later, as small named functions.
//
// Fragment layouts of mma.m16n8k16 (PTX ISA, "Matrix Fragments for mma.m16n8k16"), for the lane
// g = lane / 4, t = lane % 4 of a warp:
//   A (16 x 16, row-major), 4 registers of 2 elements: a0 = (g, 2t..2t+1)    a1 = (g+8, 2t..2t+1)
//                                                      a2 = (g, 2t+8..2t+9)  a3 = (g+8, 2t+8..2t+9)
//   B (16 x 8, k-major),    2 registers:               b0 = (k 2t..2t+1, n g) b1 = (k 2t+8..2t+9, n g)
//   C (16 x 8, fp32),       4 floats:                  c0,c1 = (g, 2t..2t+1)  c2,c3 = (g+8, 2t..2t+1)
// The C layout of two adjacent n-tiles is the A layout of one k-step: attention's probabilities go
// from the first GEMM to the second without leaving registers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace sjit_kernels {

// Two floats rounded to one 32-bit register of T pairs (low half = first).
template <class T> __device__ __forceinline__ unsigned pack2(float lo, float hi);
template <> __device__ __forceinline__ unsigned pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<unsigned*>(&v);
}
template <> __device__ __forceinline__ unsigned pack2<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<unsigned*>(&v);
}
// And back: the two T of a register as floats (x = the low half).
template <class T> __device__ __forceinline__ float2 unpack2(unsigned bits);
template <> __device__ __forceinline__ float2 unpack2<__nv_bfloat16>(unsigned bits) {
  return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&bits));
}
template <> __device__ __forceinline__ float2 unpack2<__half>(unsigned bits) {
  return __half22float2(*reinterpret_cast<__half2*>(&bits));
}

// The A fragment of k-step kk (16 columns) of a 16-row strip of accumulator fragments (acc[n]: its
// 8-column blocks, as mma m16n8 and wgmma leave them), rounded to T: two 8-column accumulator blocks
// have the layout of one A fragment, so a product's result feeds the next product from registers.
template <class T, int N>
__device__ __forceinline__ void pack_a_fragment(const float (&acc)[N][4], int kk, unsigned (&a)[4]) {
  a[0] = pack2<T>(acc[2 * kk][0], acc[2 * kk][1]);
  a[1] = pack2<T>(acc[2 * kk][2], acc[2 * kk][3]);
  a[2] = pack2<T>(acc[2 * kk + 1][0], acc[2 * kk + 1][1]);
  a[3] = pack2<T>(acc[2 * kk + 1][2], acc[2 * kk + 1][3]);
}

template <class T> struct IsBf16 { static constexpr bool value = false; };
template <> struct IsBf16<__nv_bfloat16> { static constexpr bool value = true; };

// d += a * b on a 16 x 8 x 16 tile, fp32 accumulation.
template <class T>
__device__ __forceinline__ void mma_16x8x16(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  if constexpr (IsBf16<T>::value) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

__device__ __forceinline__ unsigned smem_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// Four 8 x 8 matrices of 16-bit elements; lane 8j + r gives the address of row r of matrix j, and
// register j receives matrix j in the A/B fragment layout. The .trans form transposes each matrix.
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], unsigned address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

#if __CUDA_ARCH__ >= 900
// The store counterpart of ldmatrix_x4 (sm_90): lane 8j + r gives the address of row r of matrix j,
// and register j holds the lane's two elements of matrix j in the accumulator layout.
__device__ __forceinline__ void stmatrix_x4(unsigned address, unsigned r0, unsigned r1, unsigned r2, unsigned r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(address), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}
// The same with each matrix transposed: row r of matrix j in memory receives column r of the lane
// fragments (an accumulator tile of [m][n] stored as [n][m]).
__device__ __forceinline__ void stmatrix_x4_trans(unsigned address, unsigned r0, unsigned r1, unsigned r2,
                                                  unsigned r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(address), "r"(r0),
               "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}
#endif

// 16 bytes from global to shared memory without passing through registers. When `valid` is false
// the destination is zero-filled and nothing is read (src must still be a mapped address).
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(smem_dst)), "l"(gmem_src),
               "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most `pending` of this thread's committed groups are still in flight.
template <int pending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(pending));
}

__device__ __forceinline__ float fast_exp2(float x) {  // ex2.approx: exp2(-inf) = 0
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace sjit_kernels

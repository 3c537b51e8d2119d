// Tiles of attention in shared memory and the warp-level fragments that read them.
//
// A tile is ROWS rows of head_dim elements, each row padded by 8 elements (16 bytes). The padding
// shifts consecutive rows by 4 banks, so the 8 row addresses of one ldmatrix phase land on 8
// distinct 16-byte bank groups for every head dim (32 .. 256) without an XOR swizzle.
#pragma once

#include "sparsejit/mma.cuh"

namespace sjit_kernels {

template <int HEAD_DIM>
struct TileGeometry {
  static_assert(HEAD_DIM % 16 == 0, "head_dim must be a multiple of 16 (one mma k-step)");
  static constexpr int row_elems = HEAD_DIM + 8;  // padded row, in elements
  static constexpr int chunks_per_row = HEAD_DIM / 8;  // 16-byte chunks
};

// Copies rows [row0, row0 + ROWS) of a [rows_total, HEAD_DIM] matrix (row stride in elements) into
// a padded tile with cp.async. Rows past rows_total are zero-filled: a zero key scores 0, but it is
// masked anyway, and a zero value row keeps 0 * p finite (garbage could be NaN, and NaN * 0 = NaN).
template <class T, int HEAD_DIM, int ROWS, int THREADS>
__device__ __forceinline__ void load_tile_async(T* tile, const T* __restrict__ base, long long row_stride,
                                                int row0, int rows_total) {
  using G = TileGeometry<HEAD_DIM>;
  constexpr int chunks = ROWS * G::chunks_per_row;
#pragma unroll
  for (int step = 0; step < (chunks + THREADS - 1) / THREADS; ++step) {
    const int i = step * THREADS + int(threadIdx.x);
    if (chunks % THREADS != 0 && i >= chunks) break;
    const int r = i / G::chunks_per_row, c = i % G::chunks_per_row;
    const bool valid = row0 + r < rows_total;
    const T* src = base + (valid ? (row0 + r) * row_stride + c * 8 : 0);
    cp_async_16(tile + r * G::row_elems + c * 8, src, valid);
  }
}

// ldmatrix addresses. Lane 8j + r names row r of the 8 x 8 matrix j.

// A fragment of a 16 x 16 block at (row0, col0) of a row-major tile: matrices
// (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15).
template <int HEAD_DIM, class T>
__device__ __forceinline__ void load_a_fragment(unsigned (&a)[4], const T* tile, int row0, int col0) {
  const int lane = threadIdx.x % 32, j = lane / 8, r = lane % 8;
  const T* p = tile + (row0 + (j & 1) * 8 + r) * TileGeometry<HEAD_DIM>::row_elems + col0 + (j >> 1) * 8;
  ldmatrix_x4(a, smem_address(p));
}

// B fragments of two adjacent n-tiles of S = Q K^T: keys key0 .. key0+15, head dims col0 .. col0+15 of a
// K tile stored [key][dim]. b[0], b[1] serve keys key0..+7; b[2], b[3] keys key0+8..+15.
template <int HEAD_DIM, class T>
__device__ __forceinline__ void load_k_fragments(unsigned (&b)[4], const T* tile, int key0, int col0) {
  const int lane = threadIdx.x % 32, j = lane / 8, r = lane % 8;
  const T* p = tile + (key0 + (j >> 1) * 8 + r) * TileGeometry<HEAD_DIM>::row_elems + col0 + (j & 1) * 8;
  ldmatrix_x4(b, smem_address(p));
}

// B fragments of two adjacent n-tiles of O += P V: keys key0 .. key0+15 (the k dimension), head dims
// dim0 .. dim0+15 of a V tile stored [key][dim], transposed on the fly. b[0], b[1] serve dims dim0..+7.
template <int HEAD_DIM, class T>
__device__ __forceinline__ void load_v_fragments(unsigned (&b)[4], const T* tile, int key0, int dim0) {
  const int lane = threadIdx.x % 32, j = lane / 8, r = lane % 8;
  const T* p = tile + (key0 + (j & 1) * 8 + r) * TileGeometry<HEAD_DIM>::row_elems + dim0 + (j >> 1) * 8;
  ldmatrix_x4_trans(b, smem_address(p));
}

}  // namespace sjit_kernels

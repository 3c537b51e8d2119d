// The Tensor Memory Accelerator (sm_90): bulk tensor copies from global to shared memory, issued by
// one thread, that count their bytes into an mbarrier the consumers wait on (PTX ISA,
// "cp.async.bulk.tensor" and "mbarrier").
//
// Compared with cp.async from every thread, a tile costs one instruction per 64-column block
// instead of 16-byte copies with their address arithmetic and predicates in every thread, and the
// copy engine applies the 128-byte swizzle and zero-fills rows past the tensor's end itself.
#pragma once

#include "sparsejit/attention_params.cuh"
#include "sparsejit/mma.cuh"  // smem_address

namespace sjit_kernels {

// A barrier whose phase completes after `arrivals` arrivals (for a copy barrier: 1, the issuing
// thread's expect-bytes) and, with expect-bytes, the copies' bytes.
__device__ __forceinline__ void mbarrier_init(unsigned barrier, unsigned arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(barrier), "r"(arrivals) : "memory");
}

// Makes initialized barriers visible to the copy engine; a __syncthreads must follow before use.
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// `count` consecutive one-arrival barriers from `first` (8 bytes each), made visible to the copy engine;
// called by the one thread that issues the copies, before a __syncthreads.
__device__ __forceinline__ void init_copy_barriers(unsigned first, int count) {
  for (int b = 0; b < count; ++b) mbarrier_init(first + 8 * b, 1);
  fence_barrier_init();
}

// The issuing thread's arrival, announcing `bytes` to come from copies signalling this barrier.
__device__ __forceinline__ void mbarrier_expect_bytes(unsigned barrier, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(barrier), "r"(bytes) : "memory");
}

// Announces `bytes` to come from copies signalling this barrier, without arriving: the issuing thread
// arrives later, with the other producers of the phase (mbarrier_arrive).
__device__ __forceinline__ void mbarrier_expect_bytes_only(unsigned barrier, unsigned bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(barrier), "r"(bytes) : "memory");
}

// One arrival of the calling thread, no bytes: a consumer announcing it is done with a ring slot.
__device__ __forceinline__ void mbarrier_arrive(unsigned barrier) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(barrier) : "memory");
}

// Waits until the barrier's phase with parity `phase` has completed (all its bytes landed).
__device__ __forceinline__ void mbarrier_wait(unsigned barrier, unsigned phase) {
  unsigned done = 0;
  do {
    asm volatile(
        "{\n"
        "  .reg .pred ready;\n"
        "  mbarrier.try_wait.parity.shared::cta.b64 ready, [%1], %2;\n"
        "  selp.u32 %0, 1, 0, ready;\n"
        "}\n"
        : "=r"(done)
        : "r"(barrier), "r"(phase)
        : "memory");
  } while (!done);
}

// Brings a tensor map (kernel parameter space, __grid_constant__) into the SM's descriptor cache ahead of
// the first copy through it, so that copy does not wait for the descriptor as well.
__device__ __forceinline__ void prefetch_tensor_map(const TensorMap& map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<unsigned long long>(&map)) : "memory");
}

// Copies the box at coordinates (c0 fastest, .. c3) of a 4-d tensor map into shared memory at `dst`;
// its bytes count into `barrier`. The map lives in kernel parameter space (__grid_constant__).
__device__ __forceinline__ void tma_load_4d(unsigned dst, const TensorMap& map, unsigned barrier, int c0, int c1,
                                            int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], "
      "[%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<unsigned long long>(&map)), "r"(barrier), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

// Copies `bytes` (a multiple of 16, from a 16-byte aligned address) of global memory into shared
// memory at `dst`; the bytes count into `barrier`.
__device__ __forceinline__ void bulk_load(unsigned dst, const void* src, unsigned bytes, unsigned barrier) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(barrier)
               : "memory");
}

// Adds the box at `src` in shared memory to the box at coordinates (c0 fastest, .. c3) of a 4-d tensor
// map, element by element in the L2 (a bulk reduction: one instruction instead of an atomic per
// element from every thread; elements past the tensor's end are skipped). Its reads of `src` are done
// once bulk_wait_read says so; the adds themselves complete by bulk_wait_done.
__device__ __forceinline__ void tma_reduce_add_4d(const TensorMap& map, unsigned src, int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
          reinterpret_cast<unsigned long long>(&map)),
      "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}
// Copies the box at `src` in shared memory to coordinates (c0 fastest, .. c3) of a 4-d tensor map
// (elements past the tensor's end are not written). Completion as for tma_reduce_add_4d.
__device__ __forceinline__ void tma_store_4d(const TensorMap& map, unsigned src, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
                   reinterpret_cast<unsigned long long>(&map)),
               "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}
// Copies `bytes` (a multiple of 16, 16-byte aligned at both ends) of shared memory at `src` to global
// memory as they are. Completion as for tma_reduce_add_4d.
__device__ __forceinline__ void bulk_store(void* dst, unsigned src, unsigned bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst), "r"(src), "r"(bytes)
               : "memory");
}
// Closes this thread's bulk reductions and stores issued so far into one group.
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Waits until every group of this thread has read its shared-memory source (which may then be reused).
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
// Waits until every group of this thread has completed, its writes to global memory included.
__device__ __forceinline__ void bulk_wait_done() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
// Bytes of dynamic shared memory this launch was given.
__device__ __forceinline__ unsigned dynamic_shared_bytes() {
  unsigned bytes;
  asm("mov.u32 %0, %%dynamic_smem_size;\n" : "=r"(bytes));
  return bytes;
}
// CTAs of a layout of `used_bytes` that an SM's shared memory holds (228 KB; each CTA also 1 KB
// reserved and 1 KB for alignment), between 1 and `most`: for __launch_bounds__, so that ptxas keeps
// the registers of that many CTAs.
constexpr int ctas_per_sm_by_shared(int used_bytes, int most) {
  const int fit = 228 * 1024 / (used_bytes + 2048);
  return fit > most ? most : fit < 1 ? 1 : fit;
}
// The dynamic shared memory `raw` from its first 1024-byte boundary, where swizzle atoms must start
// (the launch asks for 1 KB more than a layout's `used_bytes`). No launch may give less than the
// layout: the host's figure (codegen) is written apart from it, so a mismatch traps here.
__device__ __forceinline__ unsigned char* swizzle_aligned_shared(unsigned char* raw, unsigned used_bytes) {
  const unsigned align = (1024 - (smem_address(raw) & 1023)) & 1023;
  if (dynamic_shared_bytes() < used_bytes + align) __trap();
  return raw + align;
}

// Rows [row0, row0 + ROWS) of matrix (batch, head) of a [B, H, S, HEAD_DIM] tensor map whose box is
// 64 columns x ROWS rows with the 128-byte swizzle: one copy per swizzle atom column block (the layout
// of wgmma.cuh), HEAD_DIM / 64 of them rounded up. Rows past S arrive as zeros, and so do the columns
// past HEAD_DIM of a last block that is not whole (d = 96: its second block is half zeros), since the
// map's extent is HEAD_DIM; the copy still counts the whole box's bytes into the barrier. They land in
// rows [at, at + ROWS) of a tile of TILE_ROWS rows in that layout (`at` a multiple of 8, so that the
// run starts on a swizzle atom); tma_load_tile fills a whole tile of ROWS rows.
template <int HEAD_DIM, int ROWS, int TILE_ROWS>
__device__ __forceinline__ void tma_load_rows(unsigned tile, int at, const TensorMap& map, unsigned barrier, int batch,
                                              int head, int row0) {
#pragma unroll
  for (int block = 0; block < (HEAD_DIM + 63) / 64; ++block)
    tma_load_4d(tile + block * TILE_ROWS * 128 + at * 128, map, barrier, block * 64, row0, head, batch);
}
template <int HEAD_DIM, int ROWS>
__device__ __forceinline__ void tma_load_tile(unsigned dst, const TensorMap& map, unsigned barrier, int batch, int head,
                                              int row0) {
  tma_load_rows<HEAD_DIM, ROWS, ROWS>(dst, 0, map, barrier, batch, head, row0);
}
// The reverse: rows [at, at + ROWS) of a tile of TILE_ROWS rows in that layout at `tile` to rows
// [row0, row0 + ROWS) (rows past S, and columns past HEAD_DIM, are dropped); tma_store_tile a whole
// tile of ROWS rows.
template <int HEAD_DIM, int ROWS, int TILE_ROWS>
__device__ __forceinline__ void tma_store_rows(const TensorMap& map, unsigned tile, int at, int batch, int head,
                                               int row0) {
#pragma unroll
  for (int block = 0; block < (HEAD_DIM + 63) / 64; ++block)
    tma_store_4d(map, tile + block * TILE_ROWS * 128 + at * 128, block * 64, row0, head, batch);
}
template <int HEAD_DIM, int ROWS>
__device__ __forceinline__ void tma_store_tile(const TensorMap& map, unsigned src, int batch, int head, int row0) {
  tma_store_rows<HEAD_DIM, ROWS, ROWS>(map, src, 0, batch, head, row0);
}

}  // namespace sjit_kernels

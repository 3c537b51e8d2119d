// Hopper (sm_90a) warpgroup matrix multiply-accumulate, as small named functions.
//
// wgmma.mma_async is issued by a warpgroup: 4 consecutive warps (128 threads) starting at a warp
// index divisible by 4, all of them executing the same instruction. It computes D[64 x N] (+)= A[64 x 16]
// B[16 x N] with fp32 accumulators in registers; B always comes from shared memory, through a 64-bit
// matrix descriptor, and A from shared memory (a second descriptor) or from registers.
//
// Accumulator layout (PTX ISA, "Matrix Fragments for wgmma .m64nNk16"): warp w of the warpgroup owns
// rows 16w .. 16w+15; for each 8-column chunk c, lane (g = lane / 4, t = lane % 4) holds
//   d[c][0], d[c][1] = (row g,     cols 8c + 2t, 8c + 2t + 1)
//   d[c][2], d[c][3] = (row g + 8, cols 8c + 2t, 8c + 2t + 1)
// which is the C layout of mma.m16n8k16 per 8-column tile; and the A register fragment of one k-step
// is the A layout of mma.m16n8k16. So attention's probabilities go from the first product to the
// second without leaving registers, exactly as on the mma.sync path.
//
// Shared-memory layout: every operand tile here is stored in the 128-byte swizzle the descriptors
// name (layout type 1). A tile of R rows and D 16-bit columns is cut into D / 64 column blocks
// ("atoms" 128 bytes wide; rounded up, the last one partly unused, where D is not a multiple of 64),
// each R rows of 128 bytes, one after the other. Inside a block, the
// 16-byte chunk c of row r sits at chunk position c ^ (r % 8): the 8 rows of a core matrix then
// hit 8 different bank groups. Blocks must start at 1024-byte boundaries (the swizzle is applied to
// address bits 4-6 with bits 7-9).
//   - K-major operand (Q as A, K as B: the reduction dimension is contiguous): a k-step of 16
//     elements is 32 bytes inside a 128-byte row; 8-row groups are 1024 bytes apart (stride byte
//     offset); the leading byte offset is unused.
//   - N-major operand (V as B of O += P V, transposed by the instruction): rows are keys (the
//     reduction dimension); 8-key groups are 1024 bytes apart (stride byte offset) and the 64-wide
//     column blocks R * 128 bytes apart (leading byte offset).
#pragma once

#include "sparsejit/mma.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "sparsejit/wgmma.cuh needs the sm_90a target (wgmma exists only on compute capability 9.0 with arch-specific features)"
#endif

namespace sjit_kernels {

// Columns of a tile stored in whole 64-column swizzle blocks (128 bytes of 16-bit elements a row): at
// d = 96 two blocks, the copies filling the last 32 columns with zeros (the host's wgmma_tile_dim).
constexpr int swizzled_tile_cols(int head_dim) { return (head_dim + 63) / 64 * 64; }

// The byte offset of element (row, col) in a 128-byte-swizzled tile of `rows` rows: column blocks of
// 128 bytes, one after the other, each row's 16-byte chunks permuted by the row (bf16/f16 operands,
// ELEMENT_BYTES = 2, or the fp32 dQ tiles of the backward, 4).
template <int ELEMENT_BYTES = 2>
__device__ __forceinline__ int swizzled_offset(int rows, int row, int col) {
  constexpr int per_block = 128 / ELEMENT_BYTES, per_chunk = 16 / ELEMENT_BYTES;
  const int chunk = (col % per_block) / per_chunk;
  return (col / per_block) * rows * 128 + row * 128 + ((chunk ^ (row % 8)) * 16) + (col % per_chunk) * ELEMENT_BYTES;
}

// A shared-memory matrix descriptor with the 128-byte swizzle (PTX ISA, "Matrix Descriptor Format"):
// bits 0-13 start address >> 4, 16-29 leading byte offset >> 4, 32-45 stride byte offset >> 4,
// 62-63 layout type (1 = 128-byte swizzle). The base offset (bits 49-51) stays 0: atoms are
// 1024-byte aligned.
__device__ __forceinline__ unsigned long long sw128_descriptor(unsigned address, unsigned leading_bytes,
                                                               unsigned stride_bytes) {
  return static_cast<unsigned long long>((address & 0x3FFFF) >> 4) |
         (static_cast<unsigned long long>((leading_bytes >> 4) & 0x3FFF) << 16) |
         (static_cast<unsigned long long>((stride_bytes >> 4) & 0x3FFF) << 32) | (1ull << 62);
}

// K-step `ks` (16 elements of the contiguous reduction dimension) of a K-major tile of `rows` rows at
// shared address `tile` (already offset to the operand's first row, a multiple of 8 rows).
__device__ __forceinline__ unsigned long long kmajor_descriptor(unsigned tile, int rows, int ks) {
  return sw128_descriptor(tile + (ks / 4) * rows * 128 + (ks % 4) * 32, 16, 1024);
}

// K-step `ks` (16 rows) of an N-major tile of `rows` rows: the instruction reads N columns across
// the 64-wide column blocks.
__device__ __forceinline__ unsigned long long nmajor_descriptor(unsigned tile, int rows, int ks) {
  return sw128_descriptor(tile + ks * 16 * 128, rows * 128, 1024);
}

// Orders this thread's earlier register writes (accumulators, A fragments) before the next wgmma.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
// Closes the wgmma operations issued so far into one group.
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most `pending` groups are in flight; their accumulators may be read after it.
template <int pending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(pending) : "memory");
}
// Pins accumulator registers at this point of the instruction stream. The compiler sees a wgmma's
// results as ready when the wgmma is issued, not when wgmma_wait returns: without this, it may move
// reads (or writes) of the accumulators across the wait.
template <int CHUNKS>
__device__ __forceinline__ void wgmma_fence_operands(float (&d)[CHUNKS][4]) {
#pragma unroll
  for (int c = 0; c < CHUNKS; ++c)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[c][e])::"memory");
}
template <int KSTEPS>
__device__ __forceinline__ void wgmma_fence_operands(unsigned (&a)[KSTEPS][4]) {
#pragma unroll
  for (int k = 0; k < KSTEPS; ++k)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(a[k][e])::"memory");
}
// Shared memory written through the generic proxy (ordinary stores, cp.async) becomes visible to the
// async proxy (wgmma operand reads) once each writer runs this before the barrier that publishes it.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Synchronizes the 128 threads of warpgroup `group` (named barrier 1 + group; 0 is __syncthreads').
__device__ __forceinline__ void warpgroup_barrier(int group) {
  asm volatile("bar.sync %0, 128;\n" ::"r"(1 + group) : "memory");
}
// Synchronizes `threads` threads (whole warps) on named barrier `id`: a barrier for some of the CTA's
// warps, where others (a warp-specialized kernel's) never arrive.
__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Named barrier ID, counting THREADS, with the id an immediate: an id in a register makes ptxas
// reserve all 16 named barriers of the SM for the CTA, which would keep a second CTA off it. A
// warpgroup handing shared-memory data to another arrives once its writes are done (bar.arrive does
// not wait), and the other syncs there before reading them.
template <int ID, int THREADS>
__device__ __forceinline__ void named_barrier_arrive() {
  asm volatile("bar.arrive %0, %1;\n" ::"n"(ID), "n"(THREADS) : "memory");
}
template <int ID, int THREADS>
__device__ __forceinline__ void named_barrier_sync() {
  asm volatile("bar.sync %0, %1;\n" ::"n"(ID), "n"(THREADS) : "memory");
}

// Two warpgroups taking turns (ping-pong) on named barriers FIRST and FIRST + 1, counting THREADS:
// warpgroup `group` waits for its turn on FIRST + group and hands it over on the other's (immediate
// ids in both branches, as above).
template <int FIRST, int THREADS>
__device__ __forceinline__ void take_turn(int group) {
  if (group == 0) named_barrier_sync<FIRST, THREADS>();
  else named_barrier_sync<FIRST + 1, THREADS>();
}
template <int FIRST, int THREADS>
__device__ __forceinline__ void pass_turn(int group) {
  if (group == 0) named_barrier_arrive<FIRST + 1, THREADS>();
  else named_barrier_arrive<FIRST, THREADS>();
}

// Warp specialization: a warpgroup that needs few registers (copies, bookkeeping) gives them back, and
// the warpgroups that do the math take them (every warp of the warpgroup executes it). The kernel is
// compiled for the launch's even share; these set each warpgroup's own limit from here on.
template <int REGISTERS>
__device__ __forceinline__ void warpgroup_release_registers() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGISTERS));
}
template <int REGISTERS>
__device__ __forceinline__ void warpgroup_claim_registers() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGISTERS));
}

// Generated operand lists: 64-row wgmma with N = 16, 32, 64, 96, 128 or 256 columns, fp32 accumulators.
// clang-format off
// The accumulator operands of one 64 x N tile: N / 8 chunks of 4 floats (see the layout above).
#define SJIT_WGMMA_ACC_N16 \
      "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), \
      "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3])
#define SJIT_WGMMA_ACC_N32 \
      SJIT_WGMMA_ACC_N16, \
      "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), \
      "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
#define SJIT_WGMMA_ACC_N64 \
      SJIT_WGMMA_ACC_N32, \
      "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), \
      "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
      "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), \
      "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
#define SJIT_WGMMA_ACC_N96 \
      SJIT_WGMMA_ACC_N64, \
      "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), \
      "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), \
      "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), \
      "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3])
#define SJIT_WGMMA_ACC_N128 \
      SJIT_WGMMA_ACC_N64, \
      "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), \
      "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), \
      "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), \
      "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), \
      "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), \
      "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), \
      "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), \
      "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
#define SJIT_WGMMA_ACC_N256 \
      SJIT_WGMMA_ACC_N128, \
      "+f"(d[16][0]), "+f"(d[16][1]), "+f"(d[16][2]), "+f"(d[16][3]), \
      "+f"(d[17][0]), "+f"(d[17][1]), "+f"(d[17][2]), "+f"(d[17][3]), \
      "+f"(d[18][0]), "+f"(d[18][1]), "+f"(d[18][2]), "+f"(d[18][3]), \
      "+f"(d[19][0]), "+f"(d[19][1]), "+f"(d[19][2]), "+f"(d[19][3]), \
      "+f"(d[20][0]), "+f"(d[20][1]), "+f"(d[20][2]), "+f"(d[20][3]), \
      "+f"(d[21][0]), "+f"(d[21][1]), "+f"(d[21][2]), "+f"(d[21][3]), \
      "+f"(d[22][0]), "+f"(d[22][1]), "+f"(d[22][2]), "+f"(d[22][3]), \
      "+f"(d[23][0]), "+f"(d[23][1]), "+f"(d[23][2]), "+f"(d[23][3]), \
      "+f"(d[24][0]), "+f"(d[24][1]), "+f"(d[24][2]), "+f"(d[24][3]), \
      "+f"(d[25][0]), "+f"(d[25][1]), "+f"(d[25][2]), "+f"(d[25][3]), \
      "+f"(d[26][0]), "+f"(d[26][1]), "+f"(d[26][2]), "+f"(d[26][3]), \
      "+f"(d[27][0]), "+f"(d[27][1]), "+f"(d[27][2]), "+f"(d[27][3]), \
      "+f"(d[28][0]), "+f"(d[28][1]), "+f"(d[28][2]), "+f"(d[28][3]), \
      "+f"(d[29][0]), "+f"(d[29][1]), "+f"(d[29][2]), "+f"(d[29][3]), \
      "+f"(d[30][0]), "+f"(d[30][1]), "+f"(d[30][2]), "+f"(d[30][3]), \
      "+f"(d[31][0]), "+f"(d[31][1]), "+f"(d[31][2]), "+f"(d[31][3])
#define SJIT_WGMMA_REGS_N16 "{%0, %1, %2, %3, %4, %5, %6, %7},\n"
#define SJIT_WGMMA_REGS_N32 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15},\n"
#define SJIT_WGMMA_REGS_N64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31},\n"
#define SJIT_WGMMA_REGS_N96 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47},\n"
#define SJIT_WGMMA_REGS_N128 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63},\n"

#define SJIT_WGMMA_REGS_N256 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127},\n"
// D[64 x 16] and D[64 x 32] (+)= A[64 x 16] B[16 x N], A and B from shared memory: both K-major
// (TRANS "0, 0": the scores of 16- and 32-key tiles), or A M-major ("1, 0": the gathered-key forward's
// O^T = V^T P^T, attention_forward_sm90_gather.cuh).
#define SJIT_WGMMA_SS_N16(TY, TRANS)                                                                       \
  asm volatile(                                                                                    \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"                                                 \
      "wgmma.mma_async.sync.aligned.m64n16k16.f32." TY "." TY "\n"                                  \
      SJIT_WGMMA_REGS_N16                                                    \
      "%8, %9, p, 1, 1, " TRANS ";\n}\n"                                                                 \
      : SJIT_WGMMA_ACC_N16 \
      : "l"(desc_a), "l"(desc_b), "r"(accumulate))
#define SJIT_WGMMA_SS_N32(TY, TRANS)                                                                       \
  asm volatile(                                                                                    \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"                                                 \
      "wgmma.mma_async.sync.aligned.m64n32k16.f32." TY "." TY "\n"                                  \
      SJIT_WGMMA_REGS_N32                                                    \
      "%16, %17, p, 1, 1, " TRANS ";\n}\n"                                                               \
      : SJIT_WGMMA_ACC_N32 \
      : "l"(desc_a), "l"(desc_b), "r"(accumulate))

// D[64 x 64] (+)= A[64 x 16] B[16 x 64], A and B from shared memory. TRANS is "0, 0" (both K-major) or
// "1, 1" (A M-major and B N-major: both transposed by the instruction).
#define SJIT_WGMMA_SS_N64(TY, TRANS)                                                                \
  asm volatile(                                                                                    \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                                 \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY "\n"                                  \
      SJIT_WGMMA_REGS_N64                                                    \
      "%32, %33, p, 1, 1, " TRANS ";\n}\n"                                                          \
      : SJIT_WGMMA_ACC_N64 \
      : "l"(desc_a), "l"(desc_b), "r"(accumulate))

// D[64 x 64] += A[64 x 16] B[16 x 64], A from registers, B from shared memory (N-major: transposed).
#define SJIT_WGMMA_RS_N64(TY)                                                                       \
  asm volatile(                                                                                    \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                                 \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY "\n"                                  \
      SJIT_WGMMA_REGS_N64                                                    \
      "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"                                                   \
      : SJIT_WGMMA_ACC_N64 \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate))

// D[64 x 96] += A[64 x 16] B[16 x 96], A from registers, B from shared memory (N-major: transposed).
#define SJIT_WGMMA_RS_N96(TY)                                                                        \
  asm volatile(                                                                                    \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %53, 0;\n"                                                 \
      "wgmma.mma_async.sync.aligned.m64n96k16.f32." TY "." TY "\n"                                   \
      SJIT_WGMMA_REGS_N96                                                    \
      "{%48, %49, %50, %51}, %52, p, 1, 1, 1;\n}\n"                                                   \
      : SJIT_WGMMA_ACC_N96 \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate))

// D[64 x 128] (+)= A[64 x 16] B[16 x 128], A and B from shared memory (both K-major).
#define SJIT_WGMMA_SS_N128(TY)                                                                       \
  asm volatile(                                                                                    \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                                 \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY "\n"                                  \
      SJIT_WGMMA_REGS_N128                                                    \
      "%64, %65, p, 1, 1, 0, 0;\n}\n"                                                               \
      : SJIT_WGMMA_ACC_N128 \
      : "l"(desc_a), "l"(desc_b), "r"(accumulate))

// D[64 x 128] += A[64 x 16] B[16 x 128], A from registers, B from shared memory (N-major: transposed).
#define SJIT_WGMMA_RS_N128(TY)                                                                       \
  asm volatile(                                                                                    \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                                 \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY "\n"                                  \
      SJIT_WGMMA_REGS_N128                                                    \
      "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"                                                   \
      : SJIT_WGMMA_ACC_N128 \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate))
// D[64 x 256] += A[64 x 16] B[16 x 256], A from registers, B from shared memory (N-major: transposed).
#define SJIT_WGMMA_RS_N256(TY)                                                                       \
  asm volatile(                                                                                    \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"                                                \
      "wgmma.mma_async.sync.aligned.m64n256k16.f32." TY "." TY "\n"                                  \
      SJIT_WGMMA_REGS_N256                                                    \
      "{%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"                                               \
      : SJIT_WGMMA_ACC_N256 \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate))
// clang-format on

// d (+)= A B for one k-step: A and B from shared memory (descriptors), both K-major. With
// accumulate = 0 the old contents of d are ignored (d = A B).
template <class T, int N>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 8][4], unsigned long long desc_a, unsigned long long desc_b,
                                         int accumulate) {
  static_assert(N == 16 || N == 32 || N == 64 || N == 128, "wgmma_ss: N must be 16, 32, 64 or 128");
  if constexpr (N == 16) {
    if constexpr (IsBf16<T>::value) SJIT_WGMMA_SS_N16("bf16", "0, 0"); else SJIT_WGMMA_SS_N16("f16", "0, 0");
  } else if constexpr (N == 32) {
    if constexpr (IsBf16<T>::value) SJIT_WGMMA_SS_N32("bf16", "0, 0"); else SJIT_WGMMA_SS_N32("f16", "0, 0");
  } else if constexpr (N == 64) {
    if constexpr (IsBf16<T>::value) SJIT_WGMMA_SS_N64("bf16", "0, 0"); else SJIT_WGMMA_SS_N64("f16", "0, 0");
  } else {
    if constexpr (IsBf16<T>::value) SJIT_WGMMA_SS_N128("bf16"); else SJIT_WGMMA_SS_N128("f16");
  }
}

// d (+)= A B for one k-step, N = 64, both operands from shared memory and read transposed: A M-major
// (stored [k][m]), B N-major (stored [k][n]); the attention backward's dQ = dS K with dS stored by key.
template <class T>
__device__ __forceinline__ void wgmma_ss_transposed(float (&d)[8][4], unsigned long long desc_a,
                                                    unsigned long long desc_b, int accumulate) {
  if constexpr (IsBf16<T>::value) SJIT_WGMMA_SS_N64("bf16", "1, 1"); else SJIT_WGMMA_SS_N64("f16", "1, 1");
}

// d (+)= A B for one k-step, N = 16, 32 or 64: A from shared memory read transposed (M-major, stored
// [k][m]), B K-major; the gathered-key forward's O^T = V^T P^T with V stored by key and P^T by query.
template <class T, int N>
__device__ __forceinline__ void wgmma_ss_a_transposed(float (&d)[N / 8][4], unsigned long long desc_a,
                                                      unsigned long long desc_b, int accumulate) {
  static_assert(N == 16 || N == 32 || N == 64, "wgmma_ss_a_transposed: N must be 16, 32 or 64");
  if constexpr (N == 16) {
    if constexpr (IsBf16<T>::value) SJIT_WGMMA_SS_N16("bf16", "1, 0"); else SJIT_WGMMA_SS_N16("f16", "1, 0");
  } else if constexpr (N == 32) {
    if constexpr (IsBf16<T>::value) SJIT_WGMMA_SS_N32("bf16", "1, 0"); else SJIT_WGMMA_SS_N32("f16", "1, 0");
  } else {
    if constexpr (IsBf16<T>::value) SJIT_WGMMA_SS_N64("bf16", "1, 0"); else SJIT_WGMMA_SS_N64("f16", "1, 0");
  }
}

// d (+)= A B for one k-step: A from registers (the mma.m16n8k16 A layout, rows of this warp), B from
// shared memory, N-major (transposed by the instruction).
template <class T, int N>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 8][4], const unsigned (&a)[4], unsigned long long desc_b,
                                         int accumulate) {
  static_assert(N == 64 || N == 96 || N == 128 || N == 256, "wgmma_rs: N must be 64, 96, 128 or 256");
  if constexpr (N == 64) {
    if constexpr (IsBf16<T>::value) SJIT_WGMMA_RS_N64("bf16"); else SJIT_WGMMA_RS_N64("f16");
  } else if constexpr (N == 96) {
    if constexpr (IsBf16<T>::value) SJIT_WGMMA_RS_N96("bf16"); else SJIT_WGMMA_RS_N96("f16");
  } else if constexpr (N == 128) {
    if constexpr (IsBf16<T>::value) SJIT_WGMMA_RS_N128("bf16"); else SJIT_WGMMA_RS_N128("f16");
  } else {
    if constexpr (IsBf16<T>::value) SJIT_WGMMA_RS_N256("bf16"); else SJIT_WGMMA_RS_N256("f16");
  }
}

// d (+)= A B over K_STEPS k-steps of 16, both from K-major tiles: A the 64 rows at `a_tile` of a tile of
// `a_rows` rows, B the N rows of `b_tile` (S = Q K^T and its kin); d is overwritten by the first step.
// Issued, not committed.
template <class T, int N, int K_STEPS>
__device__ __forceinline__ void wgmma_ss_steps(float (&d)[N / 8][4], unsigned a_tile, int a_rows, unsigned b_tile) {
#pragma unroll
  for (int ks = 0; ks < K_STEPS; ++ks)
    wgmma_ss<T, N>(d, kmajor_descriptor(a_tile, a_rows, ks), kmajor_descriptor(b_tile, N, ks), ks > 0);
}

// d += A B over K_STEPS k-steps of 16: A from registers (one fragment a k-step), B read transposed
// from the N-major tile of `b_rows` rows at `b_tile` (O += P V and its kin); with kOverwrite, d = A B.
// Issued, not committed.
template <class T, int N, int K_STEPS, bool kOverwrite = false>
__device__ __forceinline__ void wgmma_rs_steps(float (&d)[N / 8][4], const unsigned (&a)[K_STEPS][4], unsigned b_tile,
                                               int b_rows) {
#pragma unroll
  for (int kk = 0; kk < K_STEPS; ++kk)
    wgmma_rs<T, N>(d, a[kk], nmajor_descriptor(b_tile, b_rows, kk), kOverwrite && kk == 0 ? 0 : 1);
}

// A warpgroup's 64 x N accumulator tile, each element times factor(chunk, column parity), stored
// transposed as N rows of a 128-byte-swizzled tile of `tile_rows` rows at `tile`, its 64 rows as columns
// col0 .. col0 + 63: four 8 x 8 matrices a stmatrix.trans (this warp's 16 rows, chunks c and c + 1).
// The gathered kernels' P^T (a K-major B of the next product) and their transposed outputs.
template <class T, int N, class Factor>
__device__ __forceinline__ void stmatrix_transposed(unsigned tile, int tile_rows, int col0, const float (&acc)[N / 8][4],
                                                    Factor factor) {
  static_assert(N % 16 == 0, "stmatrix_transposed: whole pairs of 8-column chunks");
  const int warp = threadIdx.x / 32 % 4, lane = threadIdx.x % 32;
#pragma unroll
  for (int c = 0; c < N / 8; c += 2)
    stmatrix_x4_trans(tile + swizzled_offset(tile_rows, 8 * (c + lane / 16) + (lane & 7), col0 + 16 * warp + (lane & 8)),
                      pack2<T>(acc[c][0] * factor(c, 0), acc[c][1] * factor(c, 1)),
                      pack2<T>(acc[c][2] * factor(c, 0), acc[c][3] * factor(c, 1)),
                      pack2<T>(acc[c + 1][0] * factor(c + 1, 0), acc[c + 1][1] * factor(c + 1, 1)),
                      pack2<T>(acc[c + 1][2] * factor(c + 1, 0), acc[c + 1][3] * factor(c + 1, 1)));
}
// The same, unscaled.
template <class T, int N>
__device__ __forceinline__ void stmatrix_transposed(unsigned tile, int tile_rows, int col0, const float (&acc)[N / 8][4]) {
  stmatrix_transposed<T, N>(tile, tile_rows, col0, acc, [](int, int) { return 1.f; });
}

#undef SJIT_WGMMA_SS_N16
#undef SJIT_WGMMA_SS_N32
#undef SJIT_WGMMA_SS_N64
#undef SJIT_WGMMA_RS_N64
#undef SJIT_WGMMA_RS_N96
#undef SJIT_WGMMA_SS_N128
#undef SJIT_WGMMA_RS_N128
#undef SJIT_WGMMA_RS_N256
#undef SJIT_WGMMA_ACC_N16
#undef SJIT_WGMMA_ACC_N32
#undef SJIT_WGMMA_ACC_N64
#undef SJIT_WGMMA_ACC_N96
#undef SJIT_WGMMA_ACC_N128
#undef SJIT_WGMMA_ACC_N256
#undef SJIT_WGMMA_REGS_N16
#undef SJIT_WGMMA_REGS_N32
#undef SJIT_WGMMA_REGS_N64
#undef SJIT_WGMMA_REGS_N96
#undef SJIT_WGMMA_REGS_N128
#undef SJIT_WGMMA_REGS_N256

}  // namespace sjit_kernels

// Does compute-sanitizer's initcheck count global memory written by bulk copies from shared memory as
// initialized? A first kernel writes a 4 KB buffer from shared memory one of three ways, a second
// reads it with ordinary loads:
//   plain:  ordinary stores;
//   bulk:   cp.async.bulk.global.shared::cta (as the split last round's pieces stage their outputs);
//   tensor: cp.async.bulk.tensor.2d.global.shared::cta through a tensor map (as the Hopper forward
//           stores O, which the backward's pre-pass then reads).
// Every way is waited for (cp.async.bulk.wait_group 0) before the kernel ends, so the reads that follow
// in stream order see the data: the probe checks the sum. Build and run on the GPU machine:
//   nvcc -arch=sm_90a -o /tmp/bulk_store tests/sanitizer/bulk_store_initcheck.cu -lcuda
//   compute-sanitizer --tool initcheck /tmp/bulk_store plain; ... bulk; ... tensor
#include <cuda.h>

#include <cstdio>
#include <cstring>

constexpr int kRows = 16, kCols = 64;  // 16 x 64 floats: 4 KB
enum Way { plain, bulk, tensor };

__global__ void write_from_shared(float* out, const __grid_constant__ CUtensorMap map, Way way) {
  __shared__ alignas(128) float tile[kRows * kCols];
  for (int i = threadIdx.x; i < kRows * kCols; i += blockDim.x) tile[i] = float(i % 7);
  __syncthreads();
  if (way == plain) {
    for (int i = threadIdx.x; i < kRows * kCols; i += blockDim.x) out[i] = tile[i];
    return;
  }
  if (threadIdx.x != 0) return;
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the generic stores, seen by the bulk copy
  const unsigned src = unsigned(__cvta_generic_to_shared(tile));
  if (way == bulk)
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(out), "r"(src),
                 "r"(unsigned(sizeof tile))
                 : "memory");
  else
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [%0, {%2, %3}], [%1];" ::"l"(&map),
                 "r"(src), "r"(0), "r"(0)
                 : "memory");
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

__global__ void sum(const float* in, float* total) {
  float s = 0;
  for (int i = threadIdx.x; i < kRows * kCols; i += blockDim.x) s += in[i];
  atomicAdd(total, s);
}

int main(int argc, char** argv) {
  const char* name = argc > 1 ? argv[1] : "plain";
  const Way way = std::strcmp(name, "bulk") == 0 ? bulk : std::strcmp(name, "tensor") == 0 ? tensor : plain;
  float *buffer = nullptr, *total = nullptr;
  cudaMalloc(&buffer, kRows * kCols * sizeof(float));  // not initialized: only the first kernel writes it
  cudaMalloc(&total, sizeof(float));
  cudaMemset(total, 0, sizeof(float));
  CUtensorMap map{};
  const cuuint64_t dims[2] = {kCols, kRows}, strides[1] = {kCols * sizeof(float)};
  const cuuint32_t box[2] = {kCols, kRows}, steps[2] = {1, 1};
  const CUresult encoded = cuTensorMapEncodeTiled(
      &map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, buffer, dims, strides, box, steps, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  write_from_shared<<<1, 128>>>(buffer, map, way);
  sum<<<1, 128>>>(buffer, total);
  const cudaError_t status = cudaDeviceSynchronize();
  float host = 0;
  cudaMemcpy(&host, total, sizeof host, cudaMemcpyDeviceToHost);
  float expected = 0;
  for (int i = 0; i < kRows * kCols; ++i) expected += float(i % 7);
  std::printf("%s (map %d, %s): sum %g, expected %g\n", name, int(encoded), cudaGetErrorString(status), host, expected);
  return encoded == CUDA_SUCCESS && status == cudaSuccess && host == expected ? 0 : 1;
}

// The CUDA driver, loaded at run time: libcuda.so.1 through dlopen, entry points through
// cuGetProcAddress. Nothing links against libcuda, so sparsejit starts on machines without a GPU and
// does everything but launch there. cuda.h is used for its types only.
#pragma once

#include <cuda.h>

#include <string>

namespace sjit::runtime {

#define SJIT_DRIVER_FUNCTIONS(X)                                                                 \
  X(cuInit) X(cuDriverGetVersion) X(cuGetErrorName) X(cuGetErrorString) X(cuDeviceGetCount)     \
  X(cuDeviceGet) X(cuDeviceGetName) X(cuDeviceGetAttribute) X(cuDeviceTotalMem)                 \
  X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease) X(cuCtxSetCurrent) X(cuCtxGetCurrent) X(cuCtxGetDevice) \
  X(cuCtxSynchronize) X(cuModuleLoadData) X(cuModuleUnload) X(cuModuleGetFunction)               \
  X(cuFuncGetAttribute) X(cuFuncSetAttribute) X(cuLaunchKernel) X(cuMemAlloc) X(cuMemFree)       \
  X(cuMemcpyHtoD) X(cuMemcpyDtoH) X(cuMemcpyDtoDAsync) X(cuMemsetD8Async) X(cuMemGetInfo)        \
  X(cuStreamCreate) X(cuStreamDestroy) X(cuStreamSynchronize) X(cuStreamIsCapturing)            \
  X(cuEventCreate) X(cuEventRecord) X(cuEventSynchronize) X(cuEventElapsedTime) X(cuEventDestroy) \
  X(cuOccupancyMaxActiveBlocksPerMultiprocessor) X(cuTensorMapEncodeTiled)                        \
  X(cuStreamBeginCapture) X(cuStreamEndCapture) X(cuGraphInstantiateWithFlags) X(cuGraphLaunch)  \
  X(cuGraphExecDestroy) X(cuGraphDestroy)

struct DriverApi {
#define SJIT_DECLARE(fn) decltype(&::fn) fn = nullptr;
  SJIT_DRIVER_FUNCTIONS(SJIT_DECLARE)
#undef SJIT_DECLARE
};

// The loaded driver, initialized once. Throws NoDevice (with the reason) if there is no driver or no
// device; every launch path goes through here, so that is the one error a GPU-less machine sees.
const DriverApi& driver();

// Whether driver() would succeed; `why` receives the reason when it would not. Never throws.
bool driver_available(std::string* why = nullptr);

// Turns a failed CUresult into DriverError naming the call and the error ("CUDA_ERROR_..."): every
// driver call goes through this.
void check(CUresult result, const char* call);

#define SJIT_CU(call_expr) ::sjit::runtime::check((call_expr), #call_expr)

}  // namespace sjit::runtime

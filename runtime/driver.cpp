#include "runtime/driver.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <mutex>

#include "sparsejit/error.h"

namespace sjit::runtime {
namespace {

// Entry points are requested at the 12.0 ABI: every function above has kept its signature since.
constexpr int kRequestedApiVersion = 12000;

struct LoadResult {
  DriverApi api;
  std::string failure;  // empty when the driver is usable
};

LoadResult load_driver() {
  LoadResult r;
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* err = dlerror();
    r.failure = fmt::format("no CUDA driver: libcuda.so.1 could not be loaded ({})", err ? err : "unknown reason");
    return r;
  }
  using GetProc = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
  auto get_proc = reinterpret_cast<GetProc>(dlsym(lib, "cuGetProcAddress_v2"));
  if (get_proc == nullptr) {
    r.failure = "the CUDA driver is too old: it has no cuGetProcAddress_v2 (driver 12.0 or newer is needed)";
    return r;
  }
#define SJIT_RESOLVE(fn)                                                                            \
  {                                                                                                 \
    void* pfn = nullptr;                                                                            \
    CUdriverProcAddressQueryResult status{};                                                        \
    if (get_proc(#fn, &pfn, kRequestedApiVersion, CU_GET_PROC_ADDRESS_DEFAULT, &status) != CUDA_SUCCESS || \
        pfn == nullptr) {                                                                           \
      r.failure = fmt::format("the CUDA driver has no entry point {} (status {})", #fn, int(status)); \
      return r;                                                                                     \
    }                                                                                               \
    r.api.fn = reinterpret_cast<decltype(r.api.fn)>(pfn);                                           \
  }
  SJIT_DRIVER_FUNCTIONS(SJIT_RESOLVE)
#undef SJIT_RESOLVE
  const CUresult init = r.api.cuInit(0);
  if (init != CUDA_SUCCESS) {
    const char* name = nullptr;
    r.api.cuGetErrorName(init, &name);
    r.failure = fmt::format("the CUDA driver found no usable GPU (cuInit: {})", name ? name : "unknown error");
    return r;
  }
  int count = 0;
  if (r.api.cuDeviceGetCount(&count) != CUDA_SUCCESS || count == 0) r.failure = "the CUDA driver reports no GPU";
  return r;
}

const LoadResult& loaded() {
  static const LoadResult result = load_driver();
  return result;
}

}  // namespace

const DriverApi& driver() {
  const LoadResult& r = loaded();
  if (!r.failure.empty())
    throw NoDevice(fmt::format("{}. Launching a kernel needs an NVIDIA GPU and its driver; generating, "
                               "compiling and caching kernels work without one.", r.failure));
  return r.api;
}

bool driver_available(std::string* why) {
  const LoadResult& r = loaded();
  if (why != nullptr) *why = r.failure;
  return r.failure.empty();
}

void check(CUresult result, const char* call) {
  if (result == CUDA_SUCCESS) return;
  const char* name = nullptr;
  const char* text = nullptr;
  const DriverApi& api = loaded().api;
  if (api.cuGetErrorName != nullptr) api.cuGetErrorName(result, &name);
  if (api.cuGetErrorString != nullptr) api.cuGetErrorString(result, &text);
  const std::string code_name = name ? name : fmt::format("CUresult {}", int(result));
  throw DriverError(fmt::format("{} failed: {} ({})", call, code_name, text ? text : "no description"), int(result),
                    code_name);
}

}  // namespace sjit::runtime

#include "runtime/context.h"

#include <fmt/format.h>

#include <deque>
#include <mutex>

#include "runtime/driver.h"
#include "sparsejit/error.h"

namespace sjit::runtime {
namespace {

DeviceFacts read_facts(int ordinal) {
  const DriverApi& cu = driver();
  DeviceFacts f;
  f.ordinal = ordinal;
  SJIT_CU(cu.cuDeviceGet(&f.device, ordinal));
  SJIT_CU(cu.cuDevicePrimaryCtxRetain(&f.context, f.device));
  char name[256] = {};
  SJIT_CU(cu.cuDeviceGetName(name, sizeof(name), f.device));
  f.name = name;
  auto attribute = [&](CUdevice_attribute a) {
    int v = 0;
    SJIT_CU(cu.cuDeviceGetAttribute(&v, a, f.device));
    return v;
  };
  f.cc_major = attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
  f.cc_minor = attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
  f.multiprocessors = attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
  f.l2_bytes = attribute(CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE);
  f.max_shared_per_block_optin = attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
  f.max_threads_per_multiprocessor = attribute(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR);
  SJIT_CU(cu.cuDeviceTotalMem(&f.memory_bytes, f.device));
  // Two transfers a clock (the clock is in kHz, the bus width in bits). Not every driver still reports
  // these two, so a failure leaves the bandwidth unknown rather than the device unusable.
  int memory_khz = 0, bus_bits = 0;
  if (cu.cuDeviceGetAttribute(&memory_khz, CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE, f.device) == CUDA_SUCCESS &&
      cu.cuDeviceGetAttribute(&bus_bits, CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH, f.device) == CUDA_SUCCESS)
    f.memory_bandwidth = 2.0 * memory_khz * 1e3 * bus_bits / 8.0;
  f.arch = arch_for(f.cc_major, f.cc_minor);
  return f;
}

std::mutex facts_mutex;
std::deque<DeviceFacts> facts_by_ordinal;  // deque: references stay valid as it grows

}  // namespace

std::string arch_for(int cc_major, int cc_minor) {
  const bool arch_specific = (cc_major == 9 || cc_major == 10) && cc_minor == 0;
  return fmt::format("sm_{}{}{}", cc_major, cc_minor, arch_specific ? "a" : "");
}

int device_count() {
  int count = 0;
  SJIT_CU(driver().cuDeviceGetCount(&count));
  return count;
}

const DeviceFacts& device_facts(int ordinal) {
  const int count = device_count();
  if (ordinal < 0 || ordinal >= count)
    throw InvalidArgument(fmt::format("device {} does not exist: this machine has {} GPU(s)", ordinal, count));
  std::lock_guard lock(facts_mutex);
  if (facts_by_ordinal.empty()) facts_by_ordinal.resize(count);
  DeviceFacts& f = facts_by_ordinal[ordinal];
  if (f.context == nullptr) f = read_facts(ordinal);
  return f;
}

const DeviceFacts& current_device_facts() {
  const DriverApi& cu = driver();
  CUcontext ctx = nullptr;
  SJIT_CU(cu.cuCtxGetCurrent(&ctx));
  if (ctx == nullptr) {
    const DeviceFacts& f = device_facts(0);
    SJIT_CU(cu.cuCtxSetCurrent(f.context));
    return f;
  }
  CUdevice dev = 0;
  SJIT_CU(cu.cuCtxGetDevice(&dev));
  for (int i = 0, n = device_count(); i < n; ++i) {
    CUdevice candidate = 0;
    SJIT_CU(cu.cuDeviceGet(&candidate, i));
    if (candidate == dev) return device_facts(i);
  }
  throw Error("the current CUDA context belongs to no device the driver lists");
}

}  // namespace sjit::runtime

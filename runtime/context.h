// Which device a call runs on, and that device's facts. sparsejit uses each device's primary context,
// the one the CUDA runtime uses too, so pointers and streams from either API work with the other.
#pragma once

#include <cuda.h>

#include <string>

namespace sjit::runtime {

struct DeviceFacts {
  int ordinal = 0;
  CUdevice device = 0;
  CUcontext context = nullptr;  // primary context, retained for the life of the process
  std::string name, arch;
  int cc_major = 0, cc_minor = 0, multiprocessors = 0, l2_bytes = 0, max_shared_per_block_optin = 0;
  int max_threads_per_multiprocessor = 0;
  size_t memory_bytes = 0;
  // Peak DRAM bandwidth in bytes a second, from the memory clock and bus width (0 where the driver
  // reports neither).
  double memory_bandwidth = 0;
};

// The device of the calling thread's current context; with none current, device 0's primary context
// is made current. Throws NoDevice without a GPU.
const DeviceFacts& current_device_facts();
const DeviceFacts& device_facts(int ordinal);
int device_count();

// "sm_90a" for compute capability 9.0 (arch-specific features), "sm_100a" for 10.0, else "sm_XY".
std::string arch_for(int cc_major, int cc_minor);

}  // namespace sjit::runtime

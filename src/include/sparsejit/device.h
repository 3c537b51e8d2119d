// Devices, memory and timing through the driver sparsejit loads at run time. Enough for tests,
// benchmarks and small programs; larger programs pass their own device pointers and streams.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

struct CUstream_st;  // the type behind both CUstream and cudaStream_t

namespace sjit {

using Stream = CUstream_st*;  // nullptr: the legacy default stream

struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  std::string arch;             // what kernels are compiled for: "sm_90a" on Hopper, else "sm_XY"
  int multiprocessors = 0;
  std::size_t memory_bytes = 0;
  int l2_bytes = 0;
  int max_shared_per_block = 0; // opt-in maximum, bytes
  double memory_bandwidth = 0;  // peak DRAM bytes a second (memory clock x bus width); 0 if unknown
};

struct SystemInfo {
  std::string library_version;
  std::string nvrtc_version;
  int driver_version = 0;       // e.g. 13000; 0 without a driver
  bool gpu_available = false;
  std::string no_gpu_reason;    // why not, when not
  std::vector<DeviceInfo> devices;
  std::string cuda_include_dir; // where NVRTC finds cuda_fp16.h / cuda_bf16.h
};

SystemInfo system_info();      // never throws for a missing GPU
bool gpu_available();
DeviceInfo current_device();   // the device of the calling thread's current context, else device 0

// Device memory. Throws NoDevice without a GPU.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return reinterpret_cast<void*>(ptr_); }
  template <class T> T* as() const { return reinterpret_cast<T*>(ptr_); }
  std::size_t bytes() const { return bytes_; }

  void upload(const void* host, std::size_t bytes, std::size_t offset = 0);
  void download(void* host, std::size_t bytes, std::size_t offset = 0) const;
  void fill_bytes(unsigned char value, Stream stream = nullptr);  // e.g. 0xFF poisons floats with NaN

 private:
  std::uint64_t ptr_ = 0;
  std::size_t bytes_ = 0;
};

// A non-blocking stream of the current device, destroyed with the object.
class OwnedStream {
 public:
  OwnedStream();
  ~OwnedStream();
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;
  Stream get() const { return stream_; }

 private:
  Stream stream_ = nullptr;
};

void copy_device_to_device(void* dst, const void* src, std::size_t bytes, Stream stream = nullptr);
void synchronize(Stream stream = nullptr);
bool stream_is_capturing(Stream stream);

// CUDA graphs: the work enqueued on a stream between begin_capture and end_capture, recorded once and
// replayed by launch() with little host work (a training step's kernels, say). Capture runs in the
// driver's global mode: until it ends, a call on any thread that would allocate or synchronize fails
// rather than break the graph, so make sparsejit objects ready first (Attention::prepare(pattern),
// Attention::prepare_backward(args, stream)). A graph reads and writes the device memory its calls
// named when captured: keep it, and the objects whose calls it recorded, alive while it runs.
class CudaGraph {
 public:
  CudaGraph() = default;
  ~CudaGraph();
  CudaGraph(CudaGraph&& other) noexcept;
  CudaGraph& operator=(CudaGraph&& other) noexcept;
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  void launch(Stream stream = nullptr) const;  // enqueues one replay on `stream`

 private:
  friend CudaGraph end_capture(Stream stream);
  void* exec_ = nullptr;
};

// Begins capturing `stream`, which must not be the legacy default stream (nullptr), e.g. an OwnedStream.
void begin_capture(Stream stream);
// Ends the capture begun on `stream` and instantiates what it recorded. Throws DriverError where a call
// during the capture invalidated it, and InvalidArgument where `stream` is not being captured.
CudaGraph end_capture(Stream stream);

// Times GPU work with events: median of many runs after warm-up.
class EventTimer {
 public:
  EventTimer();
  ~EventTimer();
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  void start(Stream stream = nullptr);
  float stop_ms(Stream stream = nullptr);  // waits for the stop event
  void stop(Stream stream = nullptr);      // records the stop event and returns at once
  float elapsed_ms() const;                // waits for the stop event stop() recorded

 private:
  void* begin_ = nullptr;
  void* end_ = nullptr;
};

}  // namespace sjit

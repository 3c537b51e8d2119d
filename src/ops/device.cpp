// The public face of runtime/: devices, buffers, events.
#include "sparsejit/device.h"

#include <fmt/format.h>

#include "jit/jit.h"
#include "runtime/context.h"
#include "runtime/driver.h"
#include "runtime/nvrtc_program.h"
#include "sparsejit/error.h"

namespace sjit {
namespace {

const runtime::DriverApi& cu() { return runtime::driver(); }

// Makes the right context current before a driver call that needs one.
void enter_context() { (void)jit::current_target(); }

DeviceInfo to_info(const runtime::DeviceFacts& f) {
  return {f.ordinal, f.name, f.cc_major, f.cc_minor, f.arch, f.multiprocessors, f.memory_bytes, f.l2_bytes,
          f.max_shared_per_block_optin, f.memory_bandwidth};
}

}  // namespace

SystemInfo system_info() {
  SystemInfo info;
  info.library_version = SJIT_VERSION;
  info.nvrtc_version = runtime::nvrtc_version();
  info.cuda_include_dir = runtime::cuda_include_dir();
  info.gpu_available = runtime::driver_available(&info.no_gpu_reason);
  if (info.gpu_available) {
    SJIT_CU(cu().cuDriverGetVersion(&info.driver_version));
    for (int i = 0, n = runtime::device_count(); i < n; ++i) info.devices.push_back(to_info(runtime::device_facts(i)));
  }
  return info;
}

bool gpu_available() { return runtime::driver_available(); }

DeviceInfo current_device() { return to_info(*jit::current_target().device); }

DeviceBuffer::DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
  enter_context();
  CUdeviceptr p = 0;
  if (bytes > 0) SJIT_CU(cu().cuMemAlloc(&p, bytes));
  ptr_ = p;
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_ != 0) cu().cuMemFree(ptr_);  // no throwing from a destructor
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = 0, o.bytes_ = 0; }

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_ != 0) cu().cuMemFree(ptr_);
    ptr_ = o.ptr_, bytes_ = o.bytes_;
    o.ptr_ = 0, o.bytes_ = 0;
  }
  return *this;
}

void DeviceBuffer::upload(const void* host, std::size_t bytes, std::size_t offset) {
  if (offset + bytes > bytes_)
    throw InvalidArgument(fmt::format("upload of {} bytes at offset {} overruns a {}-byte buffer", bytes, offset, bytes_));
  enter_context();
  if (bytes > 0) SJIT_CU(cu().cuMemcpyHtoD(ptr_ + offset, host, bytes));
}

void DeviceBuffer::download(void* host, std::size_t bytes, std::size_t offset) const {
  if (offset + bytes > bytes_)
    throw InvalidArgument(fmt::format("download of {} bytes at offset {} overruns a {}-byte buffer", bytes, offset, bytes_));
  enter_context();
  if (bytes > 0) SJIT_CU(cu().cuMemcpyDtoH(host, ptr_ + offset, bytes));
}

void DeviceBuffer::fill_bytes(unsigned char value, Stream stream) {
  enter_context();
  if (bytes_ > 0) SJIT_CU(cu().cuMemsetD8Async(ptr_, value, bytes_, reinterpret_cast<CUstream>(stream)));
}

OwnedStream::OwnedStream() {
  enter_context();
  CUstream s = nullptr;
  SJIT_CU(cu().cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  stream_ = reinterpret_cast<Stream>(s);
}

OwnedStream::~OwnedStream() {
  if (stream_ != nullptr) cu().cuStreamDestroy(reinterpret_cast<CUstream>(stream_));
}

void copy_device_to_device(void* dst, const void* src, std::size_t bytes, Stream stream) {
  enter_context();
  SJIT_CU(cu().cuMemcpyDtoDAsync(reinterpret_cast<CUdeviceptr>(dst), reinterpret_cast<CUdeviceptr>(src), bytes,
                                 reinterpret_cast<CUstream>(stream)));
}

void synchronize(Stream stream) {
  enter_context();
  SJIT_CU(cu().cuStreamSynchronize(reinterpret_cast<CUstream>(stream)));
}

bool stream_is_capturing(Stream stream) {
  enter_context();
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  SJIT_CU(cu().cuStreamIsCapturing(reinterpret_cast<CUstream>(stream), &status));
  return status != CU_STREAM_CAPTURE_STATUS_NONE;
}

void begin_capture(Stream stream) {
  if (stream == nullptr)
    throw InvalidArgument("begin_capture: the legacy default stream (nullptr) cannot be captured into a graph; "
                          "capture a stream of your own, e.g. an OwnedStream");
  enter_context();
  SJIT_CU(cu().cuStreamBeginCapture(reinterpret_cast<CUstream>(stream), CU_STREAM_CAPTURE_MODE_GLOBAL));
}

CudaGraph end_capture(Stream stream) {
  if (!stream_is_capturing(stream))
    throw InvalidArgument("end_capture: the stream is not being captured (call begin_capture first)");
  CUgraph graph = nullptr;
  SJIT_CU(cu().cuStreamEndCapture(reinterpret_cast<CUstream>(stream), &graph));
  CUgraphExec exec = nullptr;
  const CUresult instantiated = cu().cuGraphInstantiateWithFlags(&exec, graph, 0);
  cu().cuGraphDestroy(graph);  // the executable graph keeps what it needs
  runtime::check(instantiated, "cuGraphInstantiateWithFlags(&exec, graph, 0)");
  CudaGraph g;
  g.exec_ = exec;
  return g;
}

CudaGraph::~CudaGraph() {
  if (exec_ != nullptr) cu().cuGraphExecDestroy(static_cast<CUgraphExec>(exec_));
}

CudaGraph::CudaGraph(CudaGraph&& o) noexcept : exec_(o.exec_) { o.exec_ = nullptr; }

CudaGraph& CudaGraph::operator=(CudaGraph&& o) noexcept {
  if (this != &o) {
    if (exec_ != nullptr) cu().cuGraphExecDestroy(static_cast<CUgraphExec>(exec_));
    exec_ = o.exec_;
    o.exec_ = nullptr;
  }
  return *this;
}

void CudaGraph::launch(Stream stream) const {
  if (exec_ == nullptr) throw InvalidArgument("CudaGraph::launch: an empty CudaGraph (made by default or moved from)");
  SJIT_CU(cu().cuGraphLaunch(static_cast<CUgraphExec>(exec_), reinterpret_cast<CUstream>(stream)));
}

EventTimer::EventTimer() {
  enter_context();
  CUevent a = nullptr, b = nullptr;
  SJIT_CU(cu().cuEventCreate(&a, CU_EVENT_DEFAULT));
  SJIT_CU(cu().cuEventCreate(&b, CU_EVENT_DEFAULT));
  begin_ = a, end_ = b;
}

EventTimer::~EventTimer() {
  cu().cuEventDestroy(static_cast<CUevent>(begin_));
  cu().cuEventDestroy(static_cast<CUevent>(end_));
}

void EventTimer::start(Stream stream) {
  SJIT_CU(cu().cuEventRecord(static_cast<CUevent>(begin_), reinterpret_cast<CUstream>(stream)));
}

float EventTimer::stop_ms(Stream stream) {
  stop(stream);
  return elapsed_ms();
}

void EventTimer::stop(Stream stream) {
  SJIT_CU(cu().cuEventRecord(static_cast<CUevent>(end_), reinterpret_cast<CUstream>(stream)));
}

float EventTimer::elapsed_ms() const {
  SJIT_CU(cu().cuEventSynchronize(static_cast<CUevent>(end_)));
  float ms = 0;
  SJIT_CU(cu().cuEventElapsedTime(&ms, static_cast<CUevent>(begin_), static_cast<CUevent>(end_)));
  return ms;
}

}  // namespace sjit

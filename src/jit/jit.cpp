#include "jit/jit.h"

#include <fmt/format.h>

#include <atomic>
#include <future>
#include <map>
#include <mutex>
#include <regex>

#include <xxhash.h>

#include "cache/disk_cache.h"
#include "cache/request_recorder.h"
#include "codegen/embedded_templates.h"
#include "runtime/driver.h"
#include "runtime/nvrtc_program.h"
#include "sparsejit/error.h"

namespace sjit::jit {
namespace {

std::atomic<std::uint64_t> compile_count{0}, disk_hit_count{0}, memory_hit_count{0}, load_count{0};

// Options that change the binary. The include folder does not (the headers come with this NVRTC),
// and it is an absolute path that differs between machines: leaving it out lets a cache warmed on
// one machine serve another with the same NVRTC.
std::vector<std::string> binary_options(const std::vector<std::string>& options) {
  std::vector<std::string> kept;
  for (const auto& o : options)
    if (o.rfind("--include-path=", 0) != 0) kept.push_back(o);
  return kept;
}

// The disk cache's content key: everything that changes the binary. Two requests with the same
// digest produce the same bytes, so any process may publish or use the entry.
std::string content_digest(const runtime::CompileRequest& request, const std::vector<std::string>& options,
                           const std::string& nvrtc_version) {
  std::string text = fmt::format("sparsejit-kernel-v1\nlibrary {}\nnvrtc {}\narch {}\nemit {}\ntemplates {:016x}\n",
                                 SJIT_VERSION, nvrtc_version, request.arch, request.ptx ? "ptx" : "cubin",
                                 codegen::templates_hash());
  for (const auto& o : options) text += "option " + o + "\n";
  text += "name " + request.name_expression + "\n" + request.source;
  const XXH128_hash_t h = XXH3_128bits(text.data(), text.size());
  return fmt::format("{:016x}{:016x}", h.high64, h.low64);
}

// Single flight: the first thread to ask for a key inserts a shared future and builds the kernel;
// the others wait on it. A failed build is removed so that a later call tries again.
struct MemoryCache {
  struct Slot {
    std::shared_future<std::shared_ptr<const LoadedKernel>> pending;  // set by the thread building it
    std::shared_ptr<const LoadedKernel> ready;                         // set once built: the fast path
  };
  std::mutex mutex;
  std::map<std::pair<CUcontext, std::string>, Slot, std::less<>> entries;
};

MemoryCache& memory_cache() {
  static MemoryCache* cache = new MemoryCache;  // never destroyed: kernels outlive static teardown
  return *cache;
}

std::shared_ptr<const LoadedKernel> load(const Target& target, const CompiledKernel& compiled,
                                         int dynamic_shared_bytes) {
  const runtime::DriverApi& cu = runtime::driver();
  SJIT_CU(cu.cuCtxSetCurrent(target.context));
  auto kernel = std::make_shared<LoadedKernel>();
  kernel->context = target.context;
  kernel->kernel_key = compiled.kernel_key;
  SJIT_CU(cu.cuModuleLoadData(&kernel->module, compiled.binary.data()));
  SJIT_CU(cu.cuModuleGetFunction(&kernel->function, kernel->module, compiled.lowered_name.c_str()));
  SJIT_CU(cu.cuFuncGetAttribute(&kernel->max_threads_per_block, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
                                kernel->function));
  SJIT_CU(cu.cuFuncGetAttribute(&kernel->registers, CU_FUNC_ATTRIBUTE_NUM_REGS, kernel->function));
  if (dynamic_shared_bytes > 48 * 1024) {  // above 48 KB a function must opt in
    SJIT_CU(cu.cuFuncSetAttribute(kernel->function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                  dynamic_shared_bytes));
  }
  kernel->dynamic_shared_bytes = dynamic_shared_bytes;
  ++load_count;
  return kernel;
}

}  // namespace

LoadedKernel::~LoadedKernel() {
  // Errors are ignored: at process exit the driver may already be shutting down.
  std::string why;
  if (module != nullptr && runtime::driver_available(&why)) runtime::driver().cuModuleUnload(module);
}

Target current_target() {
  const runtime::DriverApi& cu = runtime::driver();
  thread_local CUcontext last_context = nullptr;
  thread_local const runtime::DeviceFacts* last_device = nullptr;
  CUcontext ctx = nullptr;
  SJIT_CU(cu.cuCtxGetCurrent(&ctx));
  if (ctx != nullptr && ctx == last_context) return {ctx, last_device};
  const runtime::DeviceFacts& facts = runtime::current_device_facts();
  SJIT_CU(cu.cuCtxGetCurrent(&ctx));  // current_device_facts made one current if there was none
  last_context = ctx;
  last_device = &facts;
  return {ctx, &facts};
}

CompiledKernel compile(const codegen::KernelSource& source, const std::string& arch_in, Emit emit) {
  const std::string arch = arch_in.empty() ? current_target().device->arch : runtime::validate_arch(arch_in);
  runtime::CompileRequest request{source.source, source.source_name, codegen::template_headers(),
                                  source.name_expression, arch, emit == Emit::ptx};
  const std::vector<std::string> options = binary_options(runtime::nvrtc_options(request));
  static const std::string nvrtc_version = runtime::nvrtc_version();
  const std::string digest = content_digest(request, options, nvrtc_version);

  cache::record_request(source.kernel_key);  // SJIT_RECORD: every kernel this process asks for, once

  CompiledKernel out;
  out.kernel_key = source.kernel_key;
  out.arch = arch;
  out.source = source.source;
  out.source_name = source.source_name;
  out.name_expression = source.name_expression;
  out.emit = emit;

  cache::EntryMeta expected;
  expected.arch = arch;
  expected.emit = emit == Emit::ptx ? "ptx" : "cubin";
  expected.nvrtc_version = nvrtc_version;
  expected.library_version = SJIT_VERSION;
  cache::DiskCache& disk = cache::process_disk_cache();
  if (std::optional<cache::Entry> hit = disk.load(digest, expected)) {
    ++disk_hit_count;
    out.lowered_name = std::move(hit->meta.lowered_name);
    out.binary = std::move(hit->binary);
    out.log = std::move(hit->meta.log);
    out.compile_ms = hit->meta.compile_ms;
    out.from_cache = true;
    out.usage = parse_resource_usage(out.log);
    return out;
  }

  runtime::CompileResult result = runtime::nvrtc_compile(request);
  ++compile_count;
  out.lowered_name = std::move(result.lowered_name);
  out.binary = std::move(result.binary);
  out.log = std::move(result.log);
  out.compile_ms = result.compile_ms;
  out.usage = parse_resource_usage(out.log);

  cache::Entry entry;
  entry.meta = expected;
  entry.meta.key_text = out.kernel_key;
  entry.meta.options = options;
  entry.meta.lowered_name = out.lowered_name;
  entry.meta.compile_ms = out.compile_ms;
  entry.meta.log = out.log;
  entry.binary = out.binary;
  disk.store(digest, std::move(entry));
  return out;
}

std::shared_ptr<const LoadedKernel> get_kernel_impl(const Target& target, const std::string& kernel_key,
                                                    SourceFactory factory, const void* factory_context) {
  MemoryCache& cache = memory_cache();
  const auto cache_key = std::make_pair(target.context, kernel_key);
  std::promise<std::shared_ptr<const LoadedKernel>> promise;
  {
    std::unique_lock lock(cache.mutex);
    auto it = cache.entries.find(cache_key);
    if (it != cache.entries.end()) {
      ++memory_hit_count;
      if (it->second.ready) return it->second.ready;
      auto future = it->second.pending;
      lock.unlock();        // another thread is still building it: wait outside the lock
      return future.get();  // rethrows that thread's error if its build failed
    }
    cache.entries.emplace(cache_key, MemoryCache::Slot{promise.get_future().share(), nullptr});
  }
  try {
    const codegen::KernelSource source = factory(factory_context);
    const CompiledKernel compiled = compile(source, target.device->arch, Emit::cubin);
    auto kernel = load(target, compiled, source.dynamic_shared_bytes);
    promise.set_value(kernel);
    std::lock_guard lock(cache.mutex);
    if (auto it = cache.entries.find(cache_key); it != cache.entries.end()) it->second.ready = kernel;
    return kernel;
  } catch (...) {
    promise.set_exception(std::current_exception());
    std::lock_guard lock(cache.mutex);
    cache.entries.erase(cache_key);
    throw;
  }
}

void launch(const LoadedKernel& kernel, unsigned grid_x, unsigned block_x, CUstream stream, void** args) {
  SJIT_CU(runtime::driver().cuLaunchKernel(kernel.function, grid_x, 1, 1, block_x, 1, 1,
                                           unsigned(kernel.dynamic_shared_bytes), stream, args, nullptr));
}

}  // namespace sjit::jit

namespace sjit {

ResourceUsage parse_resource_usage(const std::string& log) {
  // Compiled once: compiling a std::regex on several threads at once (parallel warm-ups) races on
  // libstdc++'s locale caches (ThreadSanitizer reports it), and recompiling them each time costs more
  // than the search.
  static const std::regex registers(R"(Used (\d+) registers)"), smem(R"((\d+) bytes smem)"),
      frame(R"((\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads)");
  ResourceUsage u;
  std::smatch m;
  if (std::regex_search(log, m, registers)) u.registers = std::stoi(m[1]);
  if (std::regex_search(log, m, smem)) u.shared_bytes = std::stoi(m[1]);
  else if (u.registers >= 0) u.shared_bytes = 0;
  if (std::regex_search(log, m, frame)) {
    u.stack_frame_bytes = std::stoi(m[1]);
    u.spill_store_bytes = std::stoi(m[2]);
    u.spill_load_bytes = std::stoi(m[3]);
  }
  return u;
}

JitCounters jit_counters() {
  return {jit::compile_count.load(), jit::disk_hit_count.load(), jit::memory_hit_count.load(), jit::load_count.load()};
}

void clear_memory_cache() {
  auto& cache = jit::memory_cache();
  std::lock_guard lock(cache.mutex);
  cache.entries.clear();
}

}  // namespace sjit

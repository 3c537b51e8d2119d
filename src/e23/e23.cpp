// The E23 front end: the kernel for the spec, the workspace, the grid size, the launch.
#include "sparsejit/e23.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <string_view>
#include <vector>

#include "codegen/e23_codegen.h"
#include "e23/e23_args.h"
#include "e23/e23_profile.h"
#include "jit/jit.h"
#include "runtime/driver.h"
#include "sparsejit/error.h"
#include "templates/sparsejit/e23_params.cuh"

namespace sjit {
namespace {

// Work items (mirrors the kernels): a tape item per batch row, and product tiles of 16 weight rows and
// 32 batch rows: the forward has one per row tile of each of W_h and W_w (both products of a step take
// the same operand, so they run in the same pass), the backward one per row tile a phase.
std::int64_t forward_items(const E23Spec& spec, std::int64_t batch) {
  return batch + 2 * std::int64_t((spec.dim + 15) / 16) * ((batch + 31) / 32);
}
// The backward's grid also covers its dW tiles (64 x 64 outputs of each of dW_h and dW_w, after the
// steps), where resident CTAs allow: at B = 4 the 36 items would leave 96 SMs idle for them.
std::int64_t backward_items(const E23Spec& spec, std::int64_t batch) {
  const std::int64_t step_items = batch + std::int64_t((spec.dim + 15) / 16) * ((batch + 31) / 32);
  const std::int64_t outer_tiles = 2 * std::int64_t((spec.dim + 63) / 64) * ((spec.dim + 63) / 64);
  return std::max(step_items, outer_tiles);
}

// One of the two kernels (forward or backward), loaded for one context.
struct LoadedE23Kernel {
  std::shared_ptr<const jit::LoadedKernel> kernel;
  int resident_ctas = 0;  // CTAs that fit on the whole device at once
  // The shared memory of a launch that keeps each batch row's state on chip (forward: the tape;
  // backward: g_M and the tape being undone), and the CTAs that fit with it (0, 0 when it does not fit
  // in one CTA's shared memory).
  int tape_shared_bytes = 0;
  int tape_resident_ctas = 0;
};

int resident_ctas(const jit::Target& target, CUfunction function, int shared_bytes) {
  int per_sm = 0;
  SJIT_CU(runtime::driver().cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, function, codegen::kE23Threads,
                                                                        std::size_t(shared_bytes)));
  return per_sm * target.device->multiprocessors;
}

// SJIT_E23_TAPE=global keeps the state in the workspace even where it fits on chip (the forward's tape,
// the backward's g_M and undone tape; to measure what keeping it on chip gains, docs/e23.md).
bool tape_on_chip_allowed() {
  const char* v = std::getenv("SJIT_E23_TAPE");
  return v == nullptr || std::string_view(v) != "global";
}

// SJIT_E23_TILE_LAG_NS=n (tests only): the forward's z tile of row tile r waits r x n ns before reading
// h_t, from step 1 on (E23ForwardParams::tile_lag_ns). Unset or empty: 0.
unsigned tile_lag_ns() {
  const char* v = std::getenv("SJIT_E23_TILE_LAG_NS");
  if (v == nullptr || *v == '\0') return 0;
  char* end = nullptr;
  errno = 0;
  const long long ns = std::strtoll(v, &end, 10);
  if (*end != '\0' || errno == ERANGE || ns < 0 || ns > 1000000)
    throw InvalidArgument(fmt::format("SJIT_E23_TILE_LAG_NS='{}': use a whole number of nanoseconds from 0 to 1000000", v));
  return unsigned(ns);
}

LoadedE23Kernel load_e23_kernel(const jit::Target& target, const E23Spec& spec, bool backward) {
  LoadedE23Kernel out;
  out.kernel = backward ? jit::get_kernel(target, codegen::e23_backward_kernel_key(spec),
                                          [&] { return codegen::e23_backward_source(spec); })
                        : jit::get_kernel(target, codegen::e23_kernel_key(spec), [&] { return codegen::e23_source(spec); });
  out.resident_ctas = resident_ctas(target, out.kernel->function, out.kernel->dynamic_shared_bytes);
  if (out.resident_ctas < 1)
    throw InvalidArgument(fmt::format("e23: the {} kernel for '{}' cannot run on this device (no CTA fits on an SM)",
                                      backward ? "backward" : "forward", key(spec)));
  const long long tape_bytes = out.kernel->dynamic_shared_bytes + (backward ? 8LL : 4LL) * spec.n_slots * spec.dim;
  if (tape_bytes <= target.device->max_shared_per_block_optin) {
    SJIT_CU(runtime::driver().cuFuncSetAttribute(out.kernel->function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                 int(tape_bytes)));
    // All of the SM's unified memory as shared memory, so that launches get the residency the occupancy
    // calculator promises the grid barrier.
    SJIT_CU(runtime::driver().cuFuncSetAttribute(out.kernel->function,
                                                 CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, 100));
    out.tape_shared_bytes = int(tape_bytes);
    out.tape_resident_ctas = resident_ctas(target, out.kernel->function, out.tape_shared_bytes);
  }
  return out;
}

// How a launch runs: never more CTAs than can be resident at once (the waits need all of them); the
// state on chip (forward: each batch row's tape; backward: its g_M and the tape being undone) when it
// fits in a CTA's shared memory and every batch row then gets a CTA of its own (tape items are the first
// `batch` items, so CTA b owns row b).
struct Launch {
  unsigned grid = 0;
  int shared_bytes = 0;
  bool tape_in_shared = false;
};

Launch plan_launch(const LoadedE23Kernel& k, std::int64_t items, std::int64_t batch) {
  const std::int64_t grid_on_chip = std::min<std::int64_t>(items, k.tape_resident_ctas);
  if (k.tape_shared_bytes > 0 && grid_on_chip >= batch && tape_on_chip_allowed())
    return {unsigned(grid_on_chip), k.tape_shared_bytes, true};
  return {unsigned(std::min<std::int64_t>(items, k.resident_ctas)), k.kernel->dynamic_shared_bytes, false};
}
Launch plan_forward(const LoadedE23Kernel& k, const E23Spec& spec, std::int64_t batch) {
  return plan_launch(k, forward_items(spec, batch), batch);
}
Launch plan_backward(const LoadedE23Kernel& k, const E23Spec& spec, std::int64_t batch) {
  return plan_launch(k, backward_items(spec, batch), batch);
}

// Launches `k` as planned (its shared memory depends on where the state lives, so not jit::launch).
void run(const LoadedE23Kernel& k, const Launch& launch, CUstream stream, void** params) {
  SJIT_CU(runtime::driver().cuLaunchKernel(k.kernel->function, launch.grid, 1, 1, unsigned(codegen::kE23Threads), 1,
                                           1, unsigned(launch.shared_bytes), stream, params, nullptr));
}

// Makes sure `buffer` holds at least `bytes` (never allocating under graph capture) and returns it.
unsigned char* own_workspace(DeviceBuffer& buffer, std::size_t bytes, Stream stream, const char* prepare_call) {
  if (buffer.bytes() < bytes) {
    if (stream_is_capturing(stream))
      throw InvalidArgument(fmt::format("e23: the workspace must be allocated before capture: call {} first or pass "
                                        "args.workspace", prepare_call));
    buffer = DeviceBuffer(bytes);
  }
  return buffer.as<unsigned char>();
}

// One profiled launch: `words` 64-bit marks zeroed on the device, `launch(marks)`, then the marks on the
// host (synchronized).
template <class Launch>
std::vector<unsigned long long> record_marks(std::size_t words, Stream stream, Launch launch) {
  DeviceBuffer marks(words * 8);
  marks.fill_bytes(0, stream);
  launch(marks.as<unsigned long long>());
  synchronize(stream);
  std::vector<unsigned long long> host(words);
  marks.download(host.data(), words * 8);
  return host;
}

}  // namespace

struct E23::State {
  E23Spec spec;
  std::mutex mutex;
  struct PerContext {
    LoadedE23Kernel forward, backward;  // backward loaded on first use
    DeviceBuffer workspace, backward_workspace;
  };
  std::vector<std::pair<CUcontext, std::unique_ptr<PerContext>>> contexts;

  PerContext& on(const jit::Target& target, bool need_backward = false) {
    PerContext* found = nullptr;
    {
      std::lock_guard lock(mutex);
      for (auto& [context, per] : contexts)
        if (context == target.context) found = per.get();
    }
    if (found == nullptr) {
      auto per = std::make_unique<PerContext>();
      per->forward = load_e23_kernel(target, spec, false);
      std::lock_guard lock(mutex);
      for (auto& [context, existing] : contexts)
        if (context == target.context) found = existing.get();
      if (found == nullptr) {
        contexts.emplace_back(target.context, std::move(per));
        found = contexts.back().second.get();
      }
    }
    if (need_backward) {
      {
        std::lock_guard lock(mutex);
        if (found->backward.kernel) return *found;
      }
      LoadedE23Kernel backward = load_e23_kernel(target, spec, true);
      std::lock_guard lock(mutex);
      if (!found->backward.kernel) found->backward = std::move(backward);
    }
    return *found;
  }
};

E23::E23(const E23Spec& spec) : state_(std::make_unique<State>()) { state_->spec = canonical(spec); }
E23::~E23() = default;
E23::E23(E23&&) noexcept = default;
E23& E23::operator=(E23&&) noexcept = default;

const E23Spec& E23::spec() const { return state_->spec; }

std::size_t E23::workspace_bytes(std::int64_t batch) const {
  if (batch < 0) throw InvalidArgument(fmt::format("e23: batch = {} is not allowed: it must be >= 0", batch));
  return e23::workspace_layout(state_->spec, batch).total;
}

void E23::prepare(std::int64_t batch) {
  State::PerContext& per = state_->on(jit::current_target());
  const std::size_t bytes = workspace_bytes(batch);
  std::lock_guard lock(state_->mutex);
  if (batch > 0 && per.workspace.bytes() < bytes) per.workspace = DeviceBuffer(bytes);
}

int E23::grid_size(std::int64_t batch) {
  const State::PerContext& per = state_->on(jit::current_target());
  return int(plan_forward(per.forward, state_->spec, batch).grid);
}

bool E23::tape_on_chip(std::int64_t batch) {
  const State::PerContext& per = state_->on(jit::current_target());
  return plan_forward(per.forward, state_->spec, batch).tape_in_shared;
}

int E23::backward_grid_size(std::int64_t batch) {
  const State::PerContext& per = state_->on(jit::current_target(), true);
  return int(plan_backward(per.backward, state_->spec, batch).grid);
}

std::int64_t E23::checkpoint_interval(std::int64_t steps, std::int64_t checkpoint_every) {
  return e23::checkpoint_interval(steps, checkpoint_every);
}

std::size_t E23::saved_bytes(std::int64_t batch, std::int64_t steps, std::int64_t checkpoint_every) const {
  if (batch < 0 || steps < 0)
    throw InvalidArgument(fmt::format("e23: batch = {}, steps = {} are not allowed: both must be >= 0", batch, steps));
  return e23::saved_layout(state_->spec, batch, steps, checkpoint_interval(steps, checkpoint_every)).total;
}

std::size_t E23::backward_workspace_bytes(std::int64_t batch, std::int64_t steps, std::int64_t checkpoint_every) const {
  if (batch < 0 || steps < 0)
    throw InvalidArgument(fmt::format("e23: batch = {}, steps = {} are not allowed: both must be >= 0", batch, steps));
  return e23::backward_layout(state_->spec, batch, steps, checkpoint_interval(steps, checkpoint_every)).total;
}

void E23::prepare_backward(std::int64_t batch, std::int64_t steps, std::int64_t checkpoint_every) {
  State::PerContext& per = state_->on(jit::current_target(), true);
  const std::size_t bytes = backward_workspace_bytes(batch, steps, checkpoint_every);
  std::lock_guard lock(state_->mutex);
  if (batch > 0 && per.backward_workspace.bytes() < bytes) per.backward_workspace = DeviceBuffer(bytes);
}

void E23::step(const E23ForwardArgs& args, Stream stream) {
  if (args.steps != 1)
    throw InvalidArgument(fmt::format("e23: step() takes args.steps = 1, not {}: use forward_sequence", args.steps));
  forward_sequence(args, stream);
}

void E23::forward_sequence(const E23ForwardArgs& a, Stream stream) { launch_forward(a, stream, nullptr); }

std::vector<E23ProfileSpan> E23::profile_forward(const E23ForwardArgs& a, Stream stream) {
  e23::check_forward_args(state_->spec, a);
  if (a.batch == 0 || a.steps == 0) return {};
  const int grid = grid_size(a.batch);
  const std::size_t words = std::size_t(grid) * std::size_t(a.steps) * sjit_kernels::kE23Marks * 2;
  const auto marks = record_marks(words, stream, [&](unsigned long long* at) { launch_forward(a, stream, at); });
  return e23::summarize_profile(marks, grid, a.batch, a.steps);
}

void E23::launch_forward(const E23ForwardArgs& a, Stream stream, unsigned long long* profile) {
  const E23Spec& spec = state_->spec;
  e23::check_forward_args(spec, a);
  if (a.batch == 0) return;
  const std::size_t elem = size_of(spec.dtype);
  if (a.steps == 0) {  // nothing happens: the final state is the initial one
    if (a.h_final) copy_device_to_device(a.h_final, a.h0, std::size_t(a.batch) * spec.dim * elem, stream);
    if (a.m_final)
      copy_device_to_device(a.m_final, a.m0, std::size_t(a.batch) * spec.n_slots * spec.dim * elem, stream);
    return;
  }

  State::PerContext& per = state_->on(jit::current_target());
  const e23::WorkspaceLayout layout = e23::workspace_layout(spec, a.batch);
  unsigned char* workspace = static_cast<unsigned char*>(a.workspace);
  if (workspace == nullptr) {
    std::lock_guard lock(state_->mutex);
    workspace = own_workspace(per.workspace, layout.total, stream, "prepare(batch)");
  }

  sjit_kernels::E23ForwardParams p{};
  p.u = a.u, p.h0 = a.h0, p.m0 = a.m0, p.w_h = a.w_h, p.w_w = a.w_w;
  p.y = a.y, p.h_final = a.h_final, p.m_final = a.m_final;
  p.read_support = a.read_support, p.write_support = a.write_support;
  p.barrier = reinterpret_cast<unsigned*>(workspace + layout.barrier);
  p.h = reinterpret_cast<float*>(workspace + layout.h);
  p.z = reinterpret_cast<unsigned long long*>(workspace + layout.z);
  p.w = reinterpret_cast<unsigned long long*>(workspace + layout.w);
  p.m = reinterpret_cast<float*>(workspace + layout.m);
  p.q = reinterpret_cast<float*>(workspace + layout.q);
  p.b = reinterpret_cast<float*>(workspace + layout.b);
  p.checkpoint_every = int(checkpoint_interval(a.steps, a.checkpoint_every));
  if (a.saved != nullptr) {
    const e23::SavedLayout saved = e23::saved_layout(spec, a.batch, a.steps, p.checkpoint_every);
    unsigned char* base = static_cast<unsigned char*>(a.saved);
    p.save_h = reinterpret_cast<float*>(base + saved.h);
    p.save_w = reinterpret_cast<float*>(base + saved.w);
    p.save_m = reinterpret_cast<float*>(base + saved.m);
  }
  p.batch = int(a.batch), p.steps = int(a.steps);
  const Launch launch = plan_forward(per.forward, spec, a.batch);
  p.tape_in_shared = launch.tape_in_shared ? 1 : 0;
  p.profile = profile;
  p.tile_lag_ns = tile_lag_ns();

  const CUstream s = reinterpret_cast<CUstream>(stream);
  const runtime::DriverApi& cu = runtime::driver();
  SJIT_CU(cu.cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(p.barrier), 0, e23::forward_counter_bytes(a.batch), s));
  // The tagged words of z and w (contiguous): no stale tag may match a phase of this launch.
  SJIT_CU(cu.cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(workspace + layout.z), 0, layout.m - layout.z, s));
  if (a.read_support) SJIT_CU(cu.cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(a.read_support), 0, 4 * a.steps, s));
  if (a.write_support) SJIT_CU(cu.cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(a.write_support), 0, 4 * a.steps, s));
  void* params[] = {&p};
  run(per.forward, launch, s, params);
}

void E23::backward_sequence(const E23BackwardArgs& a, Stream stream) { launch_backward(a, stream, nullptr); }

std::vector<E23ProfileSpan> E23::profile_backward(const E23BackwardArgs& a, Stream stream) {
  e23::check_backward_args(state_->spec, a);
  if (a.batch == 0 || a.steps == 0) return {};
  const int grid = backward_grid_size(a.batch);
  const std::size_t words = std::size_t(grid) * std::size_t(a.steps + 1) * sjit_kernels::kE23BackwardMarks * 2;
  const auto marks = record_marks(words, stream, [&](unsigned long long* at) { launch_backward(a, stream, at); });
  return e23::summarize_backward_profile(marks, grid, a.batch, a.steps);
}

void E23::launch_backward(const E23BackwardArgs& a, Stream stream, unsigned long long* profile) {
  const E23Spec& spec = state_->spec;
  e23::check_backward_args(spec, a);
  const std::size_t elem = size_of(spec.dtype);
  const std::size_t bd = std::size_t(a.batch) * spec.dim, bnd = bd * spec.n_slots;
  const CUstream s = reinterpret_cast<CUstream>(stream);
  const runtime::DriverApi& cu = runtime::driver();
  auto zero = [&](void* p, std::size_t bytes) {
    if (bytes > 0) SJIT_CU(cu.cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(p), 0, bytes, s));
  };
  if (a.batch == 0 || a.steps == 0) {  // nothing happened: the final state's gradients are the initial one's
    zero(a.dw_h, std::size_t(spec.dim) * spec.dim * elem);
    zero(a.dw_w, std::size_t(spec.dim) * spec.dim * elem);
    if (a.batch == 0) return;
    if (a.dh_final) copy_device_to_device(a.dh0, a.dh_final, bd * elem, stream);
    else zero(a.dh0, bd * elem);
    if (a.dm_final) copy_device_to_device(a.dm0, a.dm_final, bnd * elem, stream);
    else zero(a.dm0, bnd * elem);
    return;
  }

  State::PerContext& per = state_->on(jit::current_target(), true);
  const int k = int(checkpoint_interval(a.steps, a.checkpoint_every));
  const e23::BackwardLayout layout = e23::backward_layout(spec, a.batch, a.steps, k);
  unsigned char* workspace = static_cast<unsigned char*>(a.workspace);
  if (workspace == nullptr) {
    std::lock_guard lock(state_->mutex);
    workspace = own_workspace(per.backward_workspace, layout.total, stream, "prepare_backward(batch, steps)");
  }
  const e23::SavedLayout saved = e23::saved_layout(spec, a.batch, a.steps, k);
  const unsigned char* base = static_cast<const unsigned char*>(a.saved);
  auto ws = [&](std::size_t offset) { return reinterpret_cast<float*>(workspace + offset); };

  sjit_kernels::E23BackwardParams p{};
  p.w_h = a.w_h, p.w_w = a.w_w, p.dy = a.dy, p.dh_final = a.dh_final, p.dm_final = a.dm_final;
  p.save_h = reinterpret_cast<const float*>(base + saved.h);
  p.save_w = reinterpret_cast<const float*>(base + saved.w);
  p.save_m = reinterpret_cast<const float*>(base + saved.m);
  p.du = a.du, p.dh0 = a.dh0, p.dm0 = a.dm0, p.dw_h = a.dw_h, p.dw_w = a.dw_w;
  p.barrier = reinterpret_cast<unsigned*>(workspace + layout.barrier);
  p.w_h_t = workspace + layout.w_h_t, p.w_w_t = workspace + layout.w_w_t;
  p.g_m = ws(layout.g_m), p.seg_m = ws(layout.seg_m), p.seg_a = ws(layout.seg_a), p.seg_b = ws(layout.seg_b);
  p.g_w = ws(layout.g_w), p.g_z = ws(layout.g_z);
  p.g_h_tape = ws(layout.g_h_tape), p.g_h_gemm = ws(layout.g_h_gemm), p.g_h_write = ws(layout.g_h_write);
  p.g_z_tagged = reinterpret_cast<unsigned long long*>(workspace + layout.g_z_tagged);
  p.checkpoint_every = k;
  p.batch = int(a.batch), p.steps = int(a.steps);

  const Launch launch = plan_backward(per.backward, spec, a.batch);
  p.state_in_shared = launch.tape_in_shared ? 1 : 0;
  p.profile = profile;

  SJIT_CU(cu.cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(p.barrier), 0, e23::forward_counter_bytes(a.batch), s));
  // The tagged g_z words: no stale tag may match a step of this launch.
  SJIT_CU(cu.cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(p.g_z_tagged), 0, 8 * std::size_t(a.batch) * spec.dim, s));
  void* params[] = {&p};
  run(per.backward, launch, s, params);
}

}  // namespace sjit

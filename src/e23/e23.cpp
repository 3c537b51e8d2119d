// The E23 front end: the kernel for the spec, the workspace, the grid size, the launch.
#include "sparsejit/e23.h"

#include <fmt/format.h>

#include <algorithm>
#include <mutex>
#include <vector>

#include "codegen/e23_codegen.h"
#include "e23/e23_args.h"
#include "jit/jit.h"
#include "runtime/driver.h"
#include "sparsejit/error.h"
#include "templates/sparsejit/e23_params.cuh"

namespace sjit {
namespace {

// Work items of one phase (mirrors e23_forward.cuh): a tape item per batch row, and one product tile
// per 16 weight rows and 32 batch rows.
std::int64_t items_per_phase(const E23Spec& spec, std::int64_t batch) {
  return batch + std::int64_t((spec.dim + 15) / 16) * ((batch + 31) / 32);
}

}  // namespace

struct E23::State {
  E23Spec spec;
  std::mutex mutex;
  struct PerContext {
    std::shared_ptr<const jit::LoadedKernel> kernel;
    int resident_ctas = 0;  // CTAs that fit on the whole device at once
    DeviceBuffer workspace;
  };
  std::vector<std::pair<CUcontext, std::unique_ptr<PerContext>>> contexts;

  PerContext& on(const jit::Target& target) {
    {
      std::lock_guard lock(mutex);
      for (auto& [context, per] : contexts)
        if (context == target.context) return *per;
    }
    auto per = std::make_unique<PerContext>();
    per->kernel = jit::get_kernel(target, codegen::e23_kernel_key(spec), [&] { return codegen::e23_source(spec); });
    int per_sm = 0;
    SJIT_CU(runtime::driver().cuOccupancyMaxActiveBlocksPerMultiprocessor(
        &per_sm, per->kernel->function, codegen::kE23Threads, std::size_t(per->kernel->dynamic_shared_bytes)));
    if (per_sm < 1)
      throw InvalidArgument(fmt::format("e23: the kernel for '{}' cannot run on this device (no CTA fits on an SM)",
                                        key(spec)));
    per->resident_ctas = per_sm * target.device->multiprocessors;
    std::lock_guard lock(mutex);
    for (auto& [context, existing] : contexts)
      if (context == target.context) return *existing;
    contexts.emplace_back(target.context, std::move(per));
    return *contexts.back().second;
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
  return int(std::min<std::int64_t>(items_per_phase(state_->spec, batch), per.resident_ctas));
}

void E23::step(const E23ForwardArgs& args, Stream stream) {
  if (args.steps != 1)
    throw InvalidArgument(fmt::format("e23: step() takes args.steps = 1, not {}: use forward_sequence", args.steps));
  forward_sequence(args, stream);
}

void E23::forward_sequence(const E23ForwardArgs& a, Stream stream) {
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

  const jit::Target target = jit::current_target();
  State::PerContext& per = state_->on(target);
  const e23::WorkspaceLayout layout = e23::workspace_layout(spec, a.batch);
  unsigned char* workspace = static_cast<unsigned char*>(a.workspace);
  if (workspace == nullptr) {
    std::lock_guard lock(state_->mutex);
    if (per.workspace.bytes() < layout.total) {
      if (stream_is_capturing(stream))
        throw InvalidArgument(fmt::format("e23: the workspace for batch = {} must be allocated before capture: call "
                                          "prepare({}) first or pass args.workspace", a.batch, a.batch));
      per.workspace = DeviceBuffer(layout.total);
    }
    workspace = per.workspace.as<unsigned char>();
  }

  sjit_kernels::E23ForwardParams p{};
  p.u = a.u, p.h0 = a.h0, p.m0 = a.m0, p.w_h = a.w_h, p.w_w = a.w_w;
  p.y = a.y, p.h_final = a.h_final, p.m_final = a.m_final;
  p.read_support = a.read_support, p.write_support = a.write_support;
  p.barrier = reinterpret_cast<unsigned*>(workspace + layout.barrier);
  p.h = reinterpret_cast<float*>(workspace + layout.h);
  p.z = reinterpret_cast<float*>(workspace + layout.z);
  p.v = reinterpret_cast<float*>(workspace + layout.v);
  p.w = reinterpret_cast<float*>(workspace + layout.w);
  p.m = reinterpret_cast<float*>(workspace + layout.m);
  p.b = reinterpret_cast<float*>(workspace + layout.b);
  p.batch = int(a.batch), p.steps = int(a.steps);

  const CUstream s = reinterpret_cast<CUstream>(stream);
  const runtime::DriverApi& cu = runtime::driver();
  SJIT_CU(cu.cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(p.barrier), 0, 4, s));
  if (a.read_support) SJIT_CU(cu.cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(a.read_support), 0, 4 * a.steps, s));
  if (a.write_support) SJIT_CU(cu.cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(a.write_support), 0, 4 * a.steps, s));
  // Never more CTAs than can be resident at once: the grid barrier waits for all of them.
  const unsigned grid = unsigned(std::min<std::int64_t>(items_per_phase(spec, a.batch), per.resident_ctas));
  void* params[] = {&p};
  jit::launch(*per.kernel, grid, unsigned(codegen::kE23Threads), s, params);
}

}  // namespace sjit

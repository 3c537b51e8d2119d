// The row normalizers' front end: argument checks, the kernel for each call, the launch shape.
#include "sparsejit/rownorm.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <deque>
#include <mutex>
#include <optional>
#include <vector>

#include "codegen/rownorm_codegen.h"
#include "jit/jit.h"
#include "ops/rownorm_args.h"
#include "tune/tuned_configs.h"
#include "sparsejit/error.h"
#include "sparsejit/jit.h"

namespace sjit {
namespace {

RowNormSpec with_pass(RowNormSpec spec, Pass pass) {
  spec.pass = pass;
  return spec;
}

// One compiled layout of one pass, loaded in one context.
struct Prepared {
  CUcontext context;
  const runtime::DeviceFacts* device;
  Pass pass;
  int widest_vec;       // the alignment class of the call it was made for
  std::int64_t bucket;  // rows rounded up to a power of two (tuned layouts depend on it), 0 if untuned
  RowNormConfig config;
  std::shared_ptr<const jit::LoadedKernel> kernel;
};

unsigned grid_for(const RowNormConfig& c, std::int64_t rows, const runtime::DeviceFacts& device) {
  const std::int64_t rows_per_block = c.block_threads / c.threads_per_row;
  const std::int64_t needed = (rows + rows_per_block - 1) / rows_per_block;
  // Enough blocks for several full waves; the kernels walk the remaining rows in a grid-stride loop.
  const std::int64_t waves = std::int64_t(device.multiprocessors) * (2048 / c.block_threads) * 8;
  return unsigned(std::clamp<std::int64_t>(std::min(needed, waves), 1, 0x7fffffff));
}

}  // namespace

struct RowNorm::State {
  RowNormSpec spec;
  RowNormConfig requested;
  std::mutex mutex;
  std::deque<Prepared> prepared;  // a deque: references handed out stay valid as it grows

  // The kernel for this pass in the current context, for matrices that allow `widest` packets and
  // `rows` rows. A layout left to sparsejit comes from the tuning database when it has one.
  const Prepared& get(Pass pass, const ops::MatrixArg* matrices, int count, std::int64_t rows, Stream stream) {
    const RowNormSpec pass_spec = with_pass(spec, pass);
    const int widest = ops::widest_vec(spec, matrices, count);
    if (requested.vec != 0) ops::check_vec_alignment(pass_spec, requested.vec, matrices, count);
    const jit::Target target = jit::current_target();
    const bool tunable = requested == RowNormConfig{} && rows > 0;
    const std::int64_t bucket = tunable ? std::int64_t(std::bit_ceil(std::uint64_t(rows))) : 0;
    {
      std::lock_guard lock(mutex);
      for (const Prepared& p : prepared)
        if (p.context == target.context && p.pass == pass && p.widest_vec == widest && p.bucket == bucket) return p;
    }
    RowNormConfig wanted = requested;
    if (tunable)
      if (std::optional<RowNormConfig> tuned = tuning::tuned_config(pass_spec, rows, *target.device, stream))
        wanted = *tuned;
    // Narrow the access to what these pointers allow, unless the caller chose it (checked above).
    if (requested.vec == 0) wanted.vec = std::min(wanted.vec ? wanted.vec : default_config(pass_spec).vec, widest);
    const RowNormConfig config = resolve(pass_spec, wanted);
    auto kernel = jit::get_kernel(target, codegen::rownorm_kernel_key(pass_spec, config),
                                  [&] { return codegen::rownorm_source(pass_spec, config); });
    std::lock_guard lock(mutex);
    prepared.push_back({target.context, target.device, pass, widest, bucket, config, std::move(kernel)});
    return prepared.back();
  }
};

RowNorm::RowNorm(const RowNormSpec& spec, const RowNormConfig& config) : state_(std::make_unique<State>()) {
  state_->spec = canonical(spec);
  state_->requested = config;
  resolve(state_->spec, config);  // refuse a bad config now rather than at the first launch
}
RowNorm::~RowNorm() = default;
RowNorm::RowNorm(RowNorm&&) noexcept = default;
RowNorm& RowNorm::operator=(RowNorm&&) noexcept = default;

void RowNorm::prepare() {
  // A fake, fully aligned address stands for dense matrices: only alignment is looked at.
  const void* aligned = reinterpret_cast<const void*>(std::uintptr_t(256));
  const std::int64_t n = state_->spec.n;
  const ops::MatrixArg m[] = {{"x", aligned, n}, {"y", aligned, n}, {"dy", aligned, n}};
  state_->get(Pass::forward, m, 2, 0, nullptr);
  state_->get(Pass::backward, m, 3, 0, nullptr);
}

const RowNormSpec& RowNorm::spec() const { return state_->spec; }

RowNormConfig RowNorm::config_for(const RowNormForwardArgs& args) const {
  const ops::MatrixArg m[] = {{"x", args.x, args.ld_x ? args.ld_x : state_->spec.n},
                              {"y", args.y, args.ld_y ? args.ld_y : state_->spec.n}};
  return state_->get(Pass::forward, m, 2, args.rows, nullptr).config;
}

void RowNorm::forward(const RowNormForwardArgs& a, Stream stream) {
  const RowNormSpec& spec = state_->spec;
  const ops::MatrixArg in{"x", a.x, a.ld_x ? a.ld_x : spec.n};
  const ops::MatrixArg out{"y", a.y, a.ld_y ? a.ld_y : spec.n};
  ops::check_matrices(spec, a.rows, &in, 1, out);
  ops::check_temperature(a.temperature);
  if (a.support != nullptr && reinterpret_cast<std::uintptr_t>(a.support) % 4 != 0)
    throw InvalidArgument(fmt::format("rownorm: support = {} is not aligned to 4 bytes", static_cast<void*>(a.support)));
  if (a.rows == 0) return;
  const ops::MatrixArg both[] = {in, out};
  const Prepared& p = state_->get(Pass::forward, both, 2, a.rows, stream);

  const void* x = a.x;
  void* y = a.y;
  std::int32_t* support = a.support;
  long long rows = a.rows, ld_x = in.ld, ld_y = out.ld;
  float inv_temperature = 1.0f / a.temperature;
  void* params[] = {&x, &y, &support, &rows, &ld_x, &ld_y, &inv_temperature};
  jit::launch(*p.kernel, grid_for(p.config, a.rows, *p.device), unsigned(p.config.block_threads),
              reinterpret_cast<CUstream>(stream), params);
}

void RowNorm::backward(const RowNormBackwardArgs& a, Stream stream) {
  const RowNormSpec& spec = state_->spec;
  const ops::MatrixArg ins[] = {{"y", a.y, a.ld_y ? a.ld_y : spec.n}, {"dy", a.dy, a.ld_dy ? a.ld_dy : spec.n}};
  const ops::MatrixArg out{"dx", a.dx, a.ld_dx ? a.ld_dx : spec.n};
  ops::check_matrices(spec, a.rows, ins, 2, out);
  ops::check_temperature(a.temperature);
  if (a.rows == 0) return;
  const ops::MatrixArg all[] = {ins[0], ins[1], out};
  const Prepared& p = state_->get(Pass::backward, all, 3, a.rows, stream);

  const void* y = a.y;
  const void* dy = a.dy;
  void* dx = a.dx;
  long long rows = a.rows, ld_y = ins[0].ld, ld_dy = ins[1].ld, ld_dx = out.ld;
  float inv_temperature = 1.0f / a.temperature;
  void* params[] = {&y, &dy, &dx, &rows, &ld_y, &ld_dy, &ld_dx, &inv_temperature};
  jit::launch(*p.kernel, grid_for(p.config, a.rows, *p.device), unsigned(p.config.block_threads),
              reinterpret_cast<CUstream>(stream), params);
}

void rownorm_forward(const RowNormSpec& spec, const RowNormForwardArgs& args, Stream stream) {
  RowNorm(spec).forward(args, stream);  // the kernel itself comes from the process-wide cache
}

void rownorm_backward(const RowNormSpec& spec, const RowNormBackwardArgs& args, Stream stream) {
  RowNorm(spec).backward(args, stream);
}

std::string generate_source(const RowNormSpec& spec, const RowNormConfig& config) {
  const RowNormSpec s = canonical(spec);
  return codegen::rownorm_source(s, resolve(s, config)).source;
}

CompiledKernel compile(const RowNormSpec& spec, const RowNormConfig& config, const std::string& arch, Emit emit) {
  const RowNormSpec s = canonical(spec);
  return jit::compile(codegen::rownorm_source(s, resolve(s, config)), arch, emit);
}

}  // namespace sjit

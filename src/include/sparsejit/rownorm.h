// Row normalizers on the GPU: y = normalize(x / temperature) row by row, and the backward pass.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "sparsejit/device.h"
#include "sparsejit/rownorm_spec.h"

namespace sjit {

// How a kernel is laid out (the tuner's knobs). Zero fields are filled by the heuristic default.
struct RowNormConfig {
  int threads_per_row = 0;  // a power of two, 1..1024; over 32 means one row per block
  int vec = 0;              // elements per memory access (16 bytes at most), dividing n
  int block_threads = 0;    // a multiple of 32, at most 1024
  int row_in_smem = -1;     // 1: keep the row in shared memory (long rows); 0: registers; -1: choose
  // Test-only: a layout that computes a slightly wrong result, so tests can check that the tuner
  // refuses candidates whose output differs from the default's. Key text ",wrong=1" when set.
  bool wrong_result_for_tests = false;

  friend bool operator==(const RowNormConfig&, const RowNormConfig&) = default;
};

std::string key(const RowNormConfig& config);            // "tpr=8,vec=4,block=256,smem=0"
RowNormConfig parse_rownorm_config(std::string_view text);

// The heuristic default for a spec, for rows whose pointers and stride allow `max_vec`-wide access.
RowNormConfig default_config(const RowNormSpec& spec, int max_vec = 16);

// Fills the zero fields of `config` and checks the result against the spec; throws InvalidArgument.
RowNormConfig resolve(const RowNormSpec& spec, RowNormConfig config);

struct RowNormForwardArgs {
  const void* x = nullptr;   // [rows, n] of spec.dtype, row stride ld_x elements
  void* y = nullptr;         // [rows, n] of spec.dtype, row stride ld_y (may equal x: in place)
  std::int64_t rows = 0;
  std::int64_t ld_x = 0;     // 0 means n
  std::int64_t ld_y = 0;
  float temperature = 1.0f;  // y = normalize(x / temperature), temperature > 0
  std::int32_t* support = nullptr;  // optional [rows]: number of nonzero outputs of each row
};

struct RowNormBackwardArgs {
  const void* y = nullptr;   // the forward's output
  const void* dy = nullptr;  // gradient with respect to y
  void* dx = nullptr;        // gradient with respect to x (may equal dy)
  std::int64_t rows = 0;
  std::int64_t ld_y = 0, ld_dy = 0, ld_dx = 0;  // 0 means n
  float temperature = 1.0f;  // the forward's temperature
};

// A prepared normalizer: compiles (or finds) its kernels once, then launches with little host work.
// Thread-safe. The spec's pass field is ignored: a RowNorm does both passes.
class RowNorm {
 public:
  explicit RowNorm(const RowNormSpec& spec, const RowNormConfig& config = {});
  ~RowNorm();
  RowNorm(RowNorm&&) noexcept;
  RowNorm& operator=(RowNorm&&) noexcept;

  // Compiles and loads both passes for 16-byte-aligned matrices now (warm-up), on the current device.
  void prepare();

  void forward(const RowNormForwardArgs& args, Stream stream = nullptr);
  void backward(const RowNormBackwardArgs& args, Stream stream = nullptr);

  const RowNormSpec& spec() const;
  // The layout a forward launch with these arguments uses (vec narrows to what the alignment allows;
  // a tuned layout where the tuning database has one). Loads the kernel: needs a GPU.
  RowNormConfig config_for(const RowNormForwardArgs& args) const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// One-shot forms: look the kernel up in the process cache on every call.
void rownorm_forward(const RowNormSpec& spec, const RowNormForwardArgs& args, Stream stream = nullptr);
void rownorm_backward(const RowNormSpec& spec, const RowNormBackwardArgs& args, Stream stream = nullptr);

}  // namespace sjit

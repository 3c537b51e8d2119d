// Shared by the parts of `sjit demo`: a check of one op against its float64 reference, and the few
// helpers the checks have in common.
#pragma once

#include <functional>
#include <random>
#include <string>
#include <vector>

#include "commands.h"

namespace sjit::tool::demo {

// How far a GPU result is from the reference: the largest error, and the largest error as a share of
// what the GPU tests allow at that element (the check passes when worst <= 1). A NaN counts as infinite.
struct Outcome {
  double max_error = 0;
  double worst = 0;
  std::string note;  // anything else worth a look, e.g. the mean support size
  void add(double error, double allowed);
  bool ok() const { return worst <= 1.0; }
};

// One row of the demo's op table: a spec, the kernels it needs on `arch`, and its check on the GPU.
struct Case {
  std::string spec;                      // the spec's key text
  std::string run;                       // what runs, in a few words: "fwd B1 H2 S512"
  std::vector<std::string> kernel_keys;  // compiled up front (in parallel) before anything runs
  std::string tolerance;                 // the GPU tests' bound, in words
  std::function<Outcome()> check;        // runs on the GPU against the float64 reference
};

// Attention checked on random inputs against the float64 reference (the GPU tests' bounds): the forward,
// or the forward then the backward, of `spec` with `config` (a baked spec around `pattern`) on `shape`.
struct AttentionCheckShape {
  std::int64_t batch = 1, heads_q = 2, heads_kv = 2, seq_q = 512, seq_k = 512;
};
Outcome check_attention_forward(const AttentionSpec& spec, const AttentionCheckShape& shape,
                                const BlockPattern* pattern, const AttentionConfig& config, std::mt19937_64& rng);
Outcome check_attention_backward(const AttentionSpec& spec, const AttentionCheckShape& shape,
                                 const BlockPattern* pattern, const AttentionConfig& config, std::mt19937_64& rng);
std::string attention_bound(DType dtype, bool backward);  // "2e-2 + 1e-2 |o|": their bound, in words

// The E23 cell at the demo's shape (B2 T4): the forward, or the backward through time.
Outcome check_e23_forward(const E23Spec& spec, std::mt19937_64& rng);
Outcome check_e23_backward(const E23Spec& spec, std::mt19937_64& rng);
std::string e23_check_run();                         // "B2 T4"
std::string e23_bound(DType dtype, bool backward);  // "1e-2 x row scale": the checks' bound, in words

// A row normalizer's forward and backward of `rows` random rows: the largest error against the float64
// reference, the worst |sum(y) - 1|, the mean support; ok() with the demo's bounds (f32 1e-4 and 1e-5,
// half precision 2e-2).
struct RowNormOutcome {
  double max_error = 0, worst_sum = 0, mean_support = 0;
  bool ok(DType dtype) const;
};
RowNormOutcome check_rownorm(const RowNormSpec& spec, std::int64_t rows, std::mt19937_64& rng);
std::string rownorm_bound(DType dtype);  // "1e-4, |sum-1| 1e-5": ok()'s bounds, in words

// The attention and E23 cases. `gpu`: whether they will run here (the kernel keys are then those of
// the current device; without one, those of `arch`, sm_90a). `rng` must outlive the cases.
std::vector<Case> attention_cases(bool gpu, const std::string& arch, std::mt19937_64& rng);
std::vector<Case> e23_cases(std::mt19937_64& rng);

// A device tensor of N(0, scale^2) values rounded to dtype, and the values it holds (what the
// reference must be given).
struct Tensor {
  DeviceBuffer device;
  std::vector<double> values;
};
Tensor random_tensor(std::int64_t elements, DType dtype, std::mt19937_64& rng, float scale = 1.0f);
// A bound as the checks' tables print it: 0.025 as "2.5e-2", 1e-05 as "1e-5".
std::string compact(double value);
// A device buffer of `bytes` filled with 0xFF (NaN in every dtype), so an element a kernel forgets to
// write fails its check.
DeviceBuffer poisoned(std::size_t bytes);
std::vector<float> download(const DeviceBuffer& buffer, DType dtype, std::size_t elements);

}  // namespace sjit::tool::demo

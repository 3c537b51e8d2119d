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
// A device buffer of `bytes` filled with 0xFF (NaN in every dtype), so an element a kernel forgets to
// write fails its check.
DeviceBuffer poisoned(std::size_t bytes);
std::vector<float> download(const DeviceBuffer& buffer, DType dtype, std::size_t elements);

}  // namespace sjit::tool::demo

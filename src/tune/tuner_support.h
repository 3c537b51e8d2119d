// What every tuner does the same way: compile candidates on all cores, compare a candidate's output with
// the default's, and time a launch with events.
#pragma once

#include <cstddef>
#include <functional>
#include <span>
#include <string>

#include "sparsejit/dtype.h"

namespace sjit::tuning {

// Runs job(0) .. job(count - 1) on as many threads as the machine has cores (at least 2). Each job
// handles its own errors: an exception that escapes one is rethrown here after all have finished.
void run_in_parallel(std::size_t count, const std::function<void(std::size_t)>& job);

// Candidates add in different orders, so outputs differ by rounding: an element may differ from the
// default's by a few units in the last place of `dtype`, relative to itself plus the largest magnitude
// of its row (rows of `row_length` elements). Equal values (infinities included) always match; NaN never
// does, so a poisoned element that was not written fails. Returns "" or what differs, with the place.
std::string compare_rows(DType dtype, std::size_t row_length, std::span<const float> got, std::span<const float> want);

// Median time of run(i) in microseconds: `warmup` untimed calls, then `iterations` calls each timed
// alone with events on the default stream.
double median_launch_us(int warmup, int iterations, const std::function<void(int)>& run);

}  // namespace sjit::tuning

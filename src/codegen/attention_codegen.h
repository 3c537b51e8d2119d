// The generated unit of an attention kernel: an include, the Cfg struct, and for baked patterns the
// tile schedule as constant arrays.
#pragma once

#include <string>

#include "attention/tile_schedule.h"
#include "codegen/kernel_source.h"
#include "sparsejit/attention.h"

namespace sjit::codegen {

std::string attention_kernel_key(const AttentionSpec& spec, const AttentionConfig& config);
// `baked` is the schedule of the baked pattern for this config's tiles (baked specs only).
KernelSource attention_source(const AttentionSpec& spec, const AttentionConfig& config,
                              const attention::TileSchedule* baked = nullptr);
// Bytes of dynamic shared memory a forward kernel of this shape needs.
int attention_forward_shared_bytes(const AttentionSpec& spec, const AttentionConfig& config);

}  // namespace sjit::codegen

// The generated unit of an attention kernel: an include, the Cfg struct, and for baked patterns the
// tile schedule as constant arrays.
#pragma once

#include <optional>
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

namespace sjit::codegen {

// Columns of the Hopper kernels' 128-byte-swizzled tiles: whole 64-column blocks (d = 96 takes two,
// the columns past it zero-filled by the copies and read by no product); swizzled_tile_cols in
// templates/sparsejit/wgmma.cuh on the device side.
inline int wgmma_tile_dim(int head_dim) { return (head_dim + 63) / 64 * 64; }

// The backward runs three kernels (see templates/sparsejit/attention_backward.cuh): prep, dkdv, and
// dq (deterministic specs) or dq_convert (atomic dQ).
enum class BackwardPart { prep, dkdv, dq, dq_convert };

// Whether the backward of `spec` sums dQ with atomics inside the dK/dV pass: unless the spec asks for
// determinism, and never at head_dim 256, where the dK and dV accumulators (256 floats a thread)
// leave no registers for the dQ product (it spills kilobytes a thread).
bool atomic_dq(const AttentionSpec& spec);

// Whether the Hopper backward kernels (BackwardTiling::wgmma) take `head_dim`: 64, 96, 128 and 256 (at
// 256 with 4 warps of rows, their two math warpgroups splitting the dims).
bool wgmma_backward_takes_head_dim(int head_dim);

struct BackwardTiling {
  BackwardPart part = BackwardPart::prep;
  int warps = 8;       // rows a CTA owns: 16 * warps (keys for dkdv, queries for dq); the Hopper kernels
                       // at d = 256 have 4 (64 rows, their two math warpgroups on half the dims each)
  int block_cols = 64; // columns a tile holds (queries for dkdv, keys for dq)
  int stages = 2;
  bool wgmma = false;  // dkdv and dq: the Hopper kernels (attention_backward_sm90.cuh, _dq_sm90.cuh), sm_90a
  // path=wgmma_gather (wgmma too; warps=4, cols=64, stages=2): the pattern block a CTA owns, 16 or 32
  // keys (dkdv) or queries (dq), with one warpgroup that gathers the blocks its block sees 64 rows a
  // step (attention_backward_sm90_gather.cuh); 0 elsewhere.
  int gathered_block = 0;
  int block_rows() const { return gathered_block > 0 ? gathered_block : 16 * warps; }
  // The Hopper kernels run two math warpgroups (splitting the rows, or at d = 256 the dims); the dK/dV
  // one a third that issues the copies and adds dQ to the accumulator (attention_backward_sm90.cuh),
  // and the dQ pass one that issues the copies at d = 256 (4 warps of rows: attention_backward_dq_sm90.cuh).
  int threads() const {
    if (!wgmma || gathered_block > 0) return 32 * warps;
    return part == BackwardPart::dkdv || warps == 4 ? 384 : 256;
  }
  friend bool operator==(const BackwardTiling&, const BackwardTiling&) = default;
};

// "part=dkdv,warps=8,cols=64,stages=2" (",path=wgmma", ",path=wgmma_gather,block=16"), and back (throws
// InvalidArgument naming the field).
std::string key(const BackwardTiling& tiling);
BackwardTiling parse_backward_tiling(std::string_view text);
// The tilings the backward uses for a spec (H100-tuned defaults), and their checks. `sm90`: the device
// runs sm_90a code (the dK/dV pass then takes the wgmma kernel where it is faster: d = 128).
BackwardTiling default_backward_tiling(const AttentionSpec& spec, BackwardPart part, bool sm90 = false);
int attention_backward_shared_bytes(const AttentionSpec& spec, const BackwardTiling& tiling);
// The Hopper dK/dV pass with pattern blocks narrower than its query tiles (16 or 32 queries in 64;
// 16 or 32 in 128 at d = 64) may fill each tile with block_cols / block_size runs of one active query
// block each, wherever they lie (PackedQueries in attention_backward.cuh), where the schedule lists
// such runs (a choice made per pattern: attention/packed_queries.h); elsewhere 1.
int dkdv_query_runs(const AttentionSpec& spec, const BackwardTiling& tiling);
// The d = 64 Hopper dK/dV pass on 64-query tiles, for a spec with pattern blocks of 16 or 32 (whose
// default tiles are 128 queries): patterns whose CTAs walk few tiles run it (a choice made per pattern:
// attention/packed_queries.h, narrow_query_tiles_pay); nullopt elsewhere.
std::optional<BackwardTiling> narrow_query_backward_tiling(const AttentionSpec& spec);
// The gathered tiling (path=wgmma_gather) of `part` (dkdv or dq) for a spec with pattern blocks of 16,
// 32 or 64 at head_dim 64, 96 or 128 on sm_90a; nullopt elsewhere (blocks of 64: the dK/dV pass of
// attention_backward_sm90_key_block.cuh). Whether a pattern runs on it is chosen per pattern
// (attention/packed_queries.h).
std::optional<BackwardTiling> gathered_backward_tiling(const AttentionSpec& spec, BackwardPart part);
KernelSource attention_backward_source(const AttentionSpec& spec, const BackwardTiling& tiling);

}  // namespace sjit::codegen

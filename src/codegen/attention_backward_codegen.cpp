#include <fmt/format.h>

#include "codegen/cuda_names.h"

#include "codegen/attention_codegen.h"
#include "sparsejit/error.h"
#include "spec/key_text.h"

namespace sjit::codegen {
namespace {

std::string_view part_name(BackwardPart part) {
  switch (part) {
    case BackwardPart::prep: return "prep";
    case BackwardPart::dkdv: return "dkdv";
    case BackwardPart::dq: return "dq";
    case BackwardPart::dq_convert: return "dq_convert";
  }
  return "?";
}

}  // namespace

std::string key(const BackwardTiling& t) {
  const std::string path = t.gathered_block > 0 ? fmt::format(",path=wgmma_gather,block={}", t.gathered_block)
                           : t.wgmma            ? ",path=wgmma"
                                                : "";
  return fmt::format("part={},warps={},cols={},stages={}{}", part_name(t.part), t.warps, t.block_cols, t.stages, path);
}

BackwardTiling parse_backward_tiling(std::string_view text) {
  spec::KeyText kt = spec::split_key(fmt::format("tiling:{}", text));
  BackwardTiling t;
  const std::string part = spec::take(kt, "part");
  if (part == "prep") t.part = BackwardPart::prep;
  else if (part == "dkdv") t.part = BackwardPart::dkdv;
  else if (part == "dq") t.part = BackwardPart::dq;
  else if (part == "dq_convert") t.part = BackwardPart::dq_convert;
  else throw InvalidArgument(fmt::format("attention backward: part '{}' is unknown: use prep, dkdv, dq or dq_convert", part));
  t.warps = spec::parse_int("warps", spec::take_or(kt, "warps", "8"));
  t.block_cols = spec::parse_int("cols", spec::take_or(kt, "cols", "64"));
  t.stages = spec::parse_int("stages", spec::take_or(kt, "stages", "2"));
  const std::string path = spec::take_or(kt, "path", "mma");
  if (path != "mma" && path != "wgmma" && path != "wgmma_gather")
    throw InvalidArgument(fmt::format("attention backward: path '{}' is unknown: use mma, wgmma or wgmma_gather", path));
  t.wgmma = path != "mma";
  if (path == "wgmma_gather") {
    t.gathered_block = spec::parse_int("block", spec::take_or(kt, "block", "0"));
    if ((t.part != BackwardPart::dkdv && t.part != BackwardPart::dq) || t.warps != 4 || t.block_cols != 64 ||
        t.stages != 2 || (t.gathered_block != 16 && t.gathered_block != 32 && t.gathered_block != 64))
      throw InvalidArgument(fmt::format("attention backward: path=wgmma_gather exists for part=dkdv and part=dq with "
                                        "warps=4, cols=64, stages=2 and block=16, 32 or 64 (the pattern's), not '{}'",
                                        text));
    spec::reject_leftovers(kt, "part, warps, cols, stages, path, block");
    return t;
  }
  spec::reject_leftovers(kt, "part, warps, cols, stages, path");
  const bool dkdv_tile = t.part == BackwardPart::dkdv && (t.block_cols == 64 || t.block_cols == 128);
  const bool dq_tile = t.part == BackwardPart::dq && (t.block_cols == 64 || t.block_cols == 128);
  // Four warps (64 rows, d = 256) only with 64-column tiles.
  const bool wgmma_kernel_exists = (dkdv_tile || dq_tile) && (t.warps == 8 || (t.warps == 4 && t.block_cols == 64));
  if (t.wgmma && !wgmma_kernel_exists)
    throw InvalidArgument(fmt::format("attention backward: path=wgmma exists for part=dkdv with warps=8 (or 4 at "
                                      "head_dim 256) and cols=64 (or 128 at head_dim 64), and for part=dq with warps=8 and cols=64 or 128 (or "
                                      "warps=4 and cols=64 at head_dim 256), not '{}'", text));
  if (t.warps != 4 && t.warps != 8) throw InvalidArgument(fmt::format("attention backward: warps = {}: use 4 or 8", t.warps));
  if (t.block_cols != 32 && t.block_cols != 64 && t.block_cols != 128)
    throw InvalidArgument(fmt::format("attention backward: cols = {}: use 32, 64 or 128", t.block_cols));
  if (t.stages != 2 && t.stages != 3)
    throw InvalidArgument(fmt::format("attention backward: stages = {}: use 2 or 3", t.stages));
  return t;
}

// dK/dV: 8 warps own 128 keys (dK and dV accumulators are 2 x 64 floats a thread at d = 128) and walk
// 64-query tiles (on Hopper at d = 256, 4 warps of keys: 64 keys a CTA); the deterministic dQ pass: on
// Hopper 8 warps own 128 queries (wgmma), elsewhere 4 warps own 64, two CTAs an SM; it walks 64-key
// tiles (128 on Hopper at d = 128, below). d = 256 on mma.sync halves the column tiles to stay inside
// shared memory.
bool atomic_dq(const AttentionSpec& spec) { return !spec.deterministic && spec.head_dim < 256; }

// The Hopper backward kernels take d = 64, 96, 128 and 256. At 256 a CTA owns 64 rows and its two math
// warpgroups take half the dims each: the dK and dV accumulators of 64 keys x 256 dims, or the dQ ones
// with S, dP and dS beside them, would not fit one warpgroup's registers. d = 32 has no wgmma tiling.
bool wgmma_backward_takes_head_dim(int head_dim) {
  return head_dim == 64 || head_dim == 96 || head_dim == 128 || head_dim == 256;
}

namespace {
// The Hopper dK/dV pass takes 128-query tiles only at d = 64 (BackwardSm90Layout's static_assert says
// the same): at larger head dims the dK and dV accumulators leave no registers for 64 x 128 scores.
bool wgmma_dkdv_takes_128_queries(const AttentionSpec& spec) { return spec.head_dim == 64; }
}  // namespace

BackwardTiling default_backward_tiling(const AttentionSpec& spec, BackwardPart part, bool sm90) {
  BackwardTiling t;
  t.part = part;
  const bool hopper_head_dim = sm90 && wgmma_backward_takes_head_dim(spec.head_dim);
  const bool hopper_kernel = hopper_head_dim && (part == BackwardPart::dkdv || part == BackwardPart::dq);
  t.warps = part == BackwardPart::dq && !hopper_head_dim ? 4 : 8;
  // The Hopper kernels at d = 256: 64 rows a CTA (above), 64-column tiles (two slots of 64-key K and V
  // tiles, or of 64-query Q and dO tiles, take 128 KB).
  if (hopper_kernel && spec.head_dim == 256) t.warps = 4;
  t.block_cols = spec.head_dim >= 256 && !hopper_kernel ? 32 : 64;
  t.stages = 2;
  // At d = 128 (and 96, whose tiles take as much shared memory) the Hopper dQ pass walks 128-key tiles
  // where pattern blocks are that wide (or there is no pattern): S and dP read Q and dO from shared
  // memory once for 128 keys instead of twice, and the CTA meets half as often (3-7% faster backward on
  // the H100; at d = 64 it was 1-5% slower, see docs/attention-log.md, "Landed: the dQ pass on
  // 128-key tiles"). Narrower pattern blocks keep 64: a wider tile would cover more inactive blocks.
  if (part == BackwardPart::dq && sm90 && (spec.head_dim == 128 || spec.head_dim == 96) &&
      (spec.sparsity == Sparsity::dense || spec.block_size >= 128))
    t.block_cols = 128;
  // At d = 64 the wgmma dK/dV kernel splits dQ by keys (two adds per element). With per-element
  // atomics that made it slower than mma.sync (7.22 ms against 6.60, B4 H32 S4096 dense, H100); with
  // bulk reductions it is faster (4.71 ms against 6.55 dense, 0.79 against 0.94 at density 0.1).
  t.wgmma = hopper_head_dim && (part == BackwardPart::dkdv || part == BackwardPart::dq);
  // At d = 64 the Hopper dK/dV pass walks 128-query tiles: S^T and dP^T are m64n128 products, which
  // read the warpgroup's K and V rows once for 128 queries instead of twice (without atomic dQ 1-3%
  // faster backward on the H100, docs/attention-log.md, "Landed: 128-query tiles in the d = 64 dK/dV
  // pass"; with atomic dQ each warpgroup's dQ product then takes 64 of the queries over all 128 keys,
  // instead of all 64 queries over its own keys, so each element is added once, not twice). Pattern
  // blocks of 16 and 32 pack 8 or 4 query blocks into a tile (forty-third session, docs/attention.md,
  // "d = 64: pattern blocks of 16 and 32 on 128-query tiles"; narrow_query_backward_tiling below is
  // their 64-query tiling, for patterns whose walks are short). Blocks of 64 keep 64-query tiles: a
  // warpgroup's keys are one pattern block, and on 64-query tiles it skips the products of a tile its
  // block does not see, which 128-query tiles cannot (their walk spilled with the second copy); they
  // measured 2-14% slower.
  if (part == BackwardPart::dkdv && hopper_kernel && wgmma_dkdv_takes_128_queries(spec) &&
      (spec.sparsity == Sparsity::dense || spec.block_size != 64))
    t.block_cols = 128;
  return t;
}

std::optional<BackwardTiling> narrow_query_backward_tiling(const AttentionSpec& spec) {
  const bool small_blocks = spec.sparsity != Sparsity::dense && (spec.block_size == 16 || spec.block_size == 32);
  if (!small_blocks || !wgmma_dkdv_takes_128_queries(spec)) return std::nullopt;
  BackwardTiling t = default_backward_tiling(spec, BackwardPart::dkdv, true);
  t.block_cols = 64;
  return t;
}

std::optional<BackwardTiling> gathered_backward_tiling(const AttentionSpec& spec, BackwardPart part) {
  const bool small_blocks =
      spec.sparsity != Sparsity::dense && (spec.block_size == 16 || spec.block_size == 32 || spec.block_size == 64);
  const bool gathers = part == BackwardPart::dkdv || part == BackwardPart::dq;
  if (!gathers || !small_blocks || (spec.head_dim != 64 && spec.head_dim != 96 && spec.head_dim != 128))
    return std::nullopt;
  BackwardTiling t;
  t.part = part;
  t.warps = 4;
  t.block_cols = 64;
  t.stages = 2;
  t.wgmma = true;
  t.gathered_block = spec.block_size;
  return t;
}

int dkdv_query_runs(const AttentionSpec& spec, const BackwardTiling& t) {
  const bool narrow_blocks = spec.sparsity != Sparsity::dense && spec.block_size < t.block_cols;
  return t.wgmma && t.part == BackwardPart::dkdv && narrow_blocks ? t.block_cols / spec.block_size : 1;
}

namespace {

// Bytes of the Hopper kernels' hand-over between their warpgroups at d = 256 (WarpgroupHandOver in
// warpgroup_hand_over.cuh: a tile's P in fp32 and its dS in 16 bits), 0 at other head dims.
int hand_over_bytes(const AttentionSpec& spec, const BackwardTiling& t) {
  return spec.head_dim == 256 ? t.block_rows() * t.block_cols * (4 + 2) : 0;
}

}  // namespace

int attention_backward_shared_bytes(const AttentionSpec& spec, const BackwardTiling& t) {
  if (t.part == BackwardPart::prep || t.part == BackwardPart::dq_convert) return 0;
  const int row_bytes = (spec.head_dim + 8) * 2;
  const int tiles = (2 * t.block_rows() + 2 * t.stages * t.block_cols) * row_bytes;
  if (t.gathered_block > 0) {
    // BackwardGatherLayout (dkdv): K and V of the block, two ring slots of 64 rows of Q and dO each (a
    // step's dQ is staged over its own), the P^T and dS^T tiles, three mbarriers and 1 KB for the walk.
    // BackwardDqGatherLayout (dq): Q and dO of the block, two ring slots of 64 rows of K and V each, the
    // dS^T tile, three mbarriers. Plus 1 KB to align the base to a swizzle atom.
    // BackwardKeyBlockLayout (dkdv, blocks of 64): K and V of the block, two ring slots of Q and dO (a
    // step's dQ staged over its own), the dS^T tile, two steps' lse2 and delta, three mbarriers and
    // 1 KB for the walk.
    const int d = wgmma_tile_dim(spec.head_dim), block = t.gathered_block;
    if (t.part == BackwardPart::dq) return 1024 + 2 * block * d * 2 + 4 * 64 * d * 2 + block * 128 + 8 * 3;
    if (block == 64) return 1024 + 2 * 64 * d * 2 + 4 * 64 * d * 2 + 64 * 128 + 2 * 2 * 64 * 4 + 8 * 3 + 1024;
    return 1024 + 2 * block * d * 2 + 4 * 64 * d * 2 + 2 * block * 128 + 8 * 3 + 1024;
  }
  if (t.part == BackwardPart::dq && t.wgmma) {
    // BackwardDqSm90Layout: unpadded swizzled Q and dO, the K and V rings, at d = 256 the warpgroups'
    // hand-over of P (fp32) and dS, the rows' lse2 and delta, the mbarriers (Q and dO's, a full one per
    // slot and, where a copy warp fills the ring (4 warps of rows, d = 256), an empty one); plus 1 KB to
    // align the base to a swizzle atom.
    const int d = wgmma_tile_dim(spec.head_dim), rows = t.block_rows(), cols = t.block_cols;
    const int slot_barriers = t.threads() > 256 ? 2 * t.stages : t.stages;
    return 1024 + 2 * rows * d * 2 + 2 * t.stages * cols * d * 2 + hand_over_bytes(spec, t) + 2 * rows * 4 +
           8 * (slot_barriers + 1);
  }
  if (t.part == BackwardPart::dq) return tiles + t.block_rows() * 8;
  if (t.wgmma) {
    // BackwardSm90Layout: unpadded swizzled K, V, the Q and dO rings, two dS tiles (at d = 256 instead
    // the warpgroups' hand-over of P^T in fp32 and dS^T), with atomic dQ the
    // two warpgroups' fp32 dQ tiles (64 x 64) and two 8 KB conversion buffers, the lse2 and delta
    // rings, the mbarriers (K/V's, a full and an empty one per slot, a full and an empty one per dQ
    // tile, one per conversion buffer, a full and an empty one per dS tile), and 1 KB for the walk and the slots' tiles
    // (BackwardSm90Layout::Indices); plus 1 KB to align the base to a swizzle atom.
    const int d = wgmma_tile_dim(spec.head_dim), rows = t.block_rows(), cols = t.block_cols;
    const int dq_tiles = atomic_dq(spec) ? 2 * 64 * 64 * 4 + 2 * 8192 : 0;
    const int ds_region = spec.head_dim == 256 ? hand_over_bytes(spec, t) : 2 * rows * cols * 2;
    return 1024 + 2 * rows * d * 2 + 2 * t.stages * cols * d * 2 + ds_region + dq_tiles +
           2 * t.stages * cols * 4 + 8 * (2 * t.stages + 11) + 1024;
  }
  // dK/dV: lse2 and delta rings, and with atomic dQ the dS^T tile ([rows][cols + 8] elements of T).
  const int ds_tile = !atomic_dq(spec) ? 0 : t.block_rows() * (t.block_cols + 8) * 2;
  return tiles + t.stages * t.block_cols * 8 + ds_tile;
}

KernelSource attention_backward_source(const AttentionSpec& spec, const BackwardTiling& t) {
  KernelSource out;
  out.kernel_key = key(spec) + "|" + key(t);
  const int sparsity = spec.sparsity == Sparsity::dense ? 0 : 1;  // baked patterns run from device memory here
  if (atomic_dq(spec) && t.part == BackwardPart::dkdv && t.warps % (t.block_cols / 16) != 0)
    throw InvalidArgument(fmt::format("attention backward: atomic dQ needs warps ({}) to be a multiple of cols / 16 ({})",
                                      t.warps, t.block_cols / 16));
  if (t.wgmma && !wgmma_backward_takes_head_dim(spec.head_dim))
    throw InvalidArgument(fmt::format("attention backward: path=wgmma takes head_dim 64, 96, 128 or 256, not {}",
                                      spec.head_dim));
  if (t.wgmma && t.part == BackwardPart::dkdv && t.block_cols == 128 && !wgmma_dkdv_takes_128_queries(spec))
    throw InvalidArgument(fmt::format("attention backward: path=wgmma part=dkdv takes cols=128 only at head_dim 64, "
                                      "not at head_dim {}", spec.head_dim));
  if (t.wgmma && t.gathered_block == 0 && (t.warps == 4) != (spec.head_dim == 256))
    throw InvalidArgument(fmt::format("attention backward: path=wgmma takes warps={} at head_dim {}, not {}",
                                      spec.head_dim == 256 ? 4 : 8, spec.head_dim, t.warps));
  const int causal = spec.causal == Causal::none ? 0 : spec.causal == Causal::top_left ? 1 : 2;
  if (t.gathered_block > 0 && gathered_backward_tiling(spec, t.part) != t)
    throw InvalidArgument(fmt::format("attention backward: path=wgmma_gather takes pattern blocks of 16, 32 or 64 at "
                                      "head_dim 64, 96 or 128, block = the pattern's ({}), not '{}' for '{}'",
                                      spec.sparsity == Sparsity::dense ? 0 : spec.block_size, key(t), key(spec)));
  // Blocks of 64 fill a product's rows: their dK/dV pass keeps keys as rows (a kernel of its own).
  const bool key_block = t.gathered_block == 64 && t.part == BackwardPart::dkdv;
  const std::string_view header = !t.wgmma                      ? "attention_backward"
                                  : key_block                  ? "attention_backward_sm90_key_block"
                                  : t.gathered_block > 0       ? "attention_backward_sm90_gather"
                                  : t.part == BackwardPart::dq ? "attention_backward_dq_sm90"
                                                               : "attention_backward_sm90";
  out.source = fmt::format(
      "// {}\n"
      "#include \"sparsejit/{}.cuh\"\n"
      "\n"
      "struct Cfg {{\n"
      "  using T = {};\n"
      "  static constexpr int head_dim = {};\n"
      "  static constexpr int warps = {};\n"
      "  static constexpr int block_cols = {};\n"
      "  static constexpr int stages = {};\n"
      "  static constexpr int causal = {};  // {}\n"
      "  static constexpr int sparsity = {};\n"
      "  static constexpr int pattern_block = {};\n"
      "  static constexpr bool atomic_dq = {};\n"
      "  static constexpr int query_runs = {};\n"
      "}};\n",
      out.kernel_key, header, cuda_type(spec.dtype), spec.head_dim, t.warps, t.block_cols,
      t.stages, causal, name(spec.causal), sparsity, spec.sparsity == Sparsity::dense ? 1 << 20 : spec.block_size,
      atomic_dq(spec) ? "true" : "false", dkdv_query_runs(spec, t));
  const std::string_view suffix = key_block ? "_sm90_key_block" : t.gathered_block > 0 ? "_sm90_gather" : t.wgmma ? "_sm90" : "";
  out.source_name = fmt::format("attention_backward_{}{}.cu", part_name(t.part), suffix);
  out.name_expression = fmt::format("sjit_kernels::attention_backward_{}{}<Cfg>", part_name(t.part), suffix);
  out.dynamic_shared_bytes = attention_backward_shared_bytes(spec, t);
  if (out.dynamic_shared_bytes > kMaxDynamicSharedBytes)
    throw InvalidArgument(fmt::format("attention backward: '{}' at head_dim {} needs {} bytes of shared memory, more "
                                      "than the {} a block may have: use fewer stages or narrower cols",
                                      key(t), spec.head_dim, out.dynamic_shared_bytes, kMaxDynamicSharedBytes));
  return out;
}

}  // namespace sjit::codegen

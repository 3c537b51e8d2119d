// Attention tilings: key text, the heuristic default, and the checks every tiling must pass.
#include <fmt/format.h>

#include <algorithm>

#include "codegen/attention_codegen.h"
#include "sparsejit/attention.h"
#include "sparsejit/error.h"
#include "spec/key_text.h"

namespace sjit {

std::string_view name(AttentionPath path) {
  switch (path) {
    case AttentionPath::automatic: return "auto";
    case AttentionPath::mma: return "mma";
    case AttentionPath::wgmma: return "wgmma";
    case AttentionPath::wgmma_ws: return "wgmma_ws";
    case AttentionPath::wgmma_gather: return "wgmma_gather";
  }
  return "?";
}

bool on_wgmma(AttentionPath path) {
  return path == AttentionPath::wgmma || path == AttentionPath::wgmma_ws || path == AttentionPath::wgmma_gather;
}

std::string key(const AttentionConfig& c) {
  std::string text = fmt::format("warps={},mt={},bn={},stages={},qreg={}", c.warps, c.m_tiles, c.block_n, c.stages,
                                 c.q_in_registers);
  if (c.path != AttentionPath::automatic) text += fmt::format(",path={}", name(c.path));
  return text;
}

AttentionConfig parse_attention_config(std::string_view text) {
  spec::KeyText kt = spec::split_key(fmt::format("config:{}", text));
  AttentionConfig c;
  c.warps = spec::parse_int("warps", spec::take(kt, "warps"));
  c.m_tiles = spec::parse_int("mt", spec::take(kt, "mt"));
  c.block_n = spec::parse_int("bn", spec::take(kt, "bn"));
  c.stages = spec::parse_int("stages", spec::take(kt, "stages"));
  c.q_in_registers = spec::parse_int("qreg", spec::take_or(kt, "qreg", "-1"));
  const std::string path = spec::take_or(kt, "path", "auto");
  if (path == "auto") c.path = AttentionPath::automatic;
  else if (path == "mma") c.path = AttentionPath::mma;
  else if (path == "wgmma") c.path = AttentionPath::wgmma;
  else if (path == "wgmma_ws") c.path = AttentionPath::wgmma_ws;
  else if (path == "wgmma_gather") c.path = AttentionPath::wgmma_gather;
  else
    throw InvalidSpec(
        fmt::format("attention config: path = '{}': use mma, wgmma, wgmma_ws, wgmma_gather or auto", path));
  spec::reject_leftovers(kt, "warps, mt, bn, stages, qreg, path");
  return c;
}

namespace {

// The head dims each Hopper kernel takes (AttentionSm90Layout), and their list for a refusal. d = 256
// runs on the one-item kernel only: the persistent kernel's two Q buffers leave room for one math
// warpgroup (warps = 4), which spills there even with 255 registers a thread (ptxas: 108 bytes).
bool kernel_takes_head_dim(AttentionPath path, int d) {
  const bool takes_256 = path == AttentionPath::wgmma || path == AttentionPath::wgmma_gather;
  return d == 64 || d == 96 || d == 128 || (d == 256 && takes_256);
}
std::string_view head_dims_taken(AttentionPath path) {
  return path == AttentionPath::wgmma_ws ? "64, 96 or 128" : "64, 96, 128 or 256";
}

// A d = 64 causal spec with a pattern: one warpgroup of 64 rows and 64-key tiles on the wgmma path,
// the tuner's winner at B4 H32 S4096, blocks of 128, density 0.1 (sixteenth session, docs/tuning.md:
// 0.141 ms against 0.161 for wgmma_ws, whose 128-row items visit more of the causal edge's masked work).
bool causal_d64(const AttentionSpec& spec) {
  return spec.sparsity != Sparsity::dense && spec.head_dim == 64 && spec.causal != Causal::none;
}

// The wgmma path's tiling (Hopper), measured on the H100 (docs/attention.md, "Hopper path"):
// - two warpgroups (128 query rows) and 64-key tiles, two stages: 97 KB of shared memory at d = 128,
//   so two CTAs an SM, whose loads and stores overlap each other's math (dense 578 TFLOP/s; 128-key
//   tiles, one CTA an SM: 579 with two stages, 562 with three; at density 0.1 0.224 ms against 0.243
//   and 0.254), causal or not;
// - pattern blocks of 64 or less: one warpgroup of 64 rows, for the reason given for the mma.sync
//   path below, and tiles one key block wide (16, 32 or 64 keys): with blocks of 32 and 16 the CTA then
//   loads only the blocks its rows see (thirty-first session, B2 H16 S8192 d = 128, against mma.sync's
//   64 x 32 and 64 x 16 tiles: blocks of 32 0.647 ms at density 0.1 against 0.902, 2.225 at 0.5
//   against 3.284; blocks of 16 1.405 against 1.596, 3.790 against 4.552; 64 x 64 tiles: 0.983 and
//   2.157 at 0.1; docs/attention-log.md, "Small pattern blocks on wgmma");
// - dense at d = 64, causal or not: one warpgroup of 64 rows and 128-key tiles (73 KB: three CTAs an
//   SM). The tuner found it the fastest of 144 mixes at B4 H32 S4096 (sixteenth session,
//   docs/tuning.md): 1.119 ms against 1.269-1.281 for two warpgroups and 64-key tiles (491 TFLOP/s,
//   cuDNN 464), causal 0.621 against 0.761. With a pattern (blocks of 128) wgmma_ws stays faster
//   (0.152 ms at density 0.1 against 0.165);
// - d = 64 causal with a pattern: one warpgroup of 64 rows and 64-key tiles (causal_d64).
AttentionConfig wgmma_default_config(const AttentionSpec& spec, AttentionPath path = AttentionPath::wgmma) {
  AttentionConfig c;
  c.path = path;
  c.m_tiles = 1;
  c.q_in_registers = 0;
  c.stages = 2;
  // Two CTAs of 128 rows an SM (64-key tiles, two stages): one CTA's copies and stores run under the
  // other's products. With tiles by TMA this also beats 128-key tiles with three stages on causal
  // specs (H100, d = 128: 1.026 ms dense against 1.057, 0.167 at density 0.1 against 0.202).
  // The persistent kernel has one CTA an SM with 240 registers a math thread: 128-key tiles fit
  // without spilling and halve the barriers a row of tiles costs. Dense d = 64 on wgmma: one
  // warpgroup and 128-key tiles (above).
  const bool sparse = spec.sparsity != Sparsity::dense;
  if (path == AttentionPath::wgmma_gather) {
    // One warpgroup a query block of the pattern; its key tiles are the pattern's blocks, 64 keys of
    // them a step (attention_forward_sm90_gather.cuh).
    c.warps = 4;
    c.block_n = sparse ? spec.block_size : 0;
    return c;
  }
  const bool dense_d64 = path == AttentionPath::wgmma && !sparse && spec.head_dim == 64;
  const bool small_blocks = path == AttentionPath::wgmma && sparse && spec.block_size <= 32;
  c.block_n = path == AttentionPath::wgmma_ws || dense_d64 ? 128 : small_blocks ? spec.block_size : 64;
  c.warps = (sparse && (spec.block_size <= 64 || causal_d64(spec))) || dense_d64 ? 4 : 8;
  return c;
}

// Where the wgmma path is the default on compute capability 9.0: where it passed every GPU test and was
// measured faster than mma.sync on the H100 (B2 H16 S8192 at d = 128, B4 H32 S4096 at d = 64; with TMA
// copies, session of 2026-11-23):
// - d = 128 or 64, causal or not, dense or pattern blocks of 128 (d = 128: 1.90 ms dense against 3.46,
//   0.224 ms at density 0.1 against 0.406; d = 64: 1.29 ms against 1.78; d = 64 causal: 0.727 ms
//   against 0.944, 0.162 at 0.1 against 0.239);
// - pattern blocks of 64 (d = 64: 0.170 ms at 0.1 against 0.325, causal 0.138 against 0.231; d = 128
//   causal: 0.199 against 0.345).
// - d = 256 (B2 H16 S4096, session of 2026-11-24, twenty-fourth), on the one-item kernel with 64-key
//   tiles: dense 0.902 ms (610 TFLOP/s) against 2.109, causal 0.621 against 1.055; blocks of 128 at
//   density 0.1 0.152 against 0.267; blocks of 64 at 0.5 0.738 against 1.130, at 0.1 0.189 against
//   0.269, causal 0.152 against 0.189.
// - d = 96 (B2 H16 S8192, same session), its tiles in whole swizzle blocks: dense 1.485 ms (555
//   TFLOP/s) on wgmma_ws against 2.751, causal 0.800 against 1.399; blocks of 128 at 0.1 0.171
//   against 0.325; blocks of 64 at 0.1 0.282 against 0.398 (one warpgroup, as at d = 128).
// - pattern blocks of 32 and 16 (thirty-first session), on tiles one key block wide (above): at d = 128
//   26-32% faster than mma.sync with blocks of 32 and 12-17% with blocks of 16, at d = 96 and 256
//   16-31% and 0-10%, causal top-left 43-46% and 7-16% (at d = 96 and 256, blocks of 16 at density
//   0.1, 1-2% slower: 1.330 against 1.302 ms, 0.883 against 0.875).
// d = 32 has no wgmma kernel: mma.sync stays.
bool wgmma_is_default(const AttentionSpec& spec) { return kernel_takes_head_dim(AttentionPath::wgmma, spec.head_dim); }

// Which Hopper kernel: the persistent, warp-specialized one (wgmma_ws, 128-key tiles) where it was
// measured faster on the H100 (same-run A/B, session of 2026-11-23, sixth; docs/attention-log.md):
// - d = 128 (B2 H16 S8192), dense or pattern blocks of 128, causal or not: dense 1.698 ms against
//   1.864-1.891 (648 TFLOP/s), density 0.1 0.201 ms against 0.230-0.248, causal dense 0.981 against
//   1.015-1.029, causal 0.1 0.159 against 0.173-0.184;
// - d = 64 (B4 H32 S4096), pattern blocks of 128: 0.166 ms at 0.1 against 0.178-0.181. Dense d = 64
//   stays on wgmma (1.284-1.292 ms against 1.329);
// - d = 96 (twenty-fourth session), dense and blocks of 128: 1.485 ms against 1.514 for the one-item
//   kernel, causal 0.800 against 0.847, 0.171 at density 0.1 against 0.202.
// Pattern blocks of 64 (one math warpgroup) measured slower: 0.353 ms at 0.1 against 0.343. A d = 64
// causal spec with a pattern stays on wgmma (see causal_d64), and so does a head dim the persistent
// kernel does not take (256: see kernel_takes_head_dim).
AttentionPath hopper_default_path(const AttentionSpec& spec) {
  if (!kernel_takes_head_dim(AttentionPath::wgmma_ws, spec.head_dim)) return AttentionPath::wgmma;
  const bool sparse = spec.sparsity != Sparsity::dense;
  const bool ws = sparse ? spec.block_size >= 128 && !causal_d64(spec) : spec.head_dim >= 96;
  return ws ? AttentionPath::wgmma_ws : AttentionPath::wgmma;
}

}  // namespace

// The heuristic, from the register budget of one thread (255) and shared-memory bandwidth:
// - 4 warps of 32 rows each (m_tiles = 2) make every K and V fragment read from shared memory serve
//   two mma tiles; with 16-row warps the kernel is bound by ldmatrix traffic, not the tensor cores.
// - The output accumulator is 16 * m_tiles * head_dim / 32 floats a thread (128 at d = 128, m_tiles = 2),
//   so Q stays in shared memory above d = 64 and d = 256 drops to one mma tile a warp.
// - 32-key tiles with two stages fit two CTAs an SM at d = 128 and keep S at 32 floats a thread.
// - Pattern blocks of 64 or less: 64-row tiles, so that a tile spans few pattern blocks and work on
//   inactive blocks inside an active tile stays small.
AttentionConfig default_config(const AttentionSpec& in, int compute_capability) {
  const AttentionSpec spec = canonical(in);
  if (compute_capability == 90 && wgmma_is_default(spec)) return wgmma_default_config(spec, hopper_default_path(spec));
  AttentionConfig c;
  c.path = AttentionPath::mma;
  c.warps = 4;
  c.stages = 2;
  c.block_n = spec.head_dim >= 96 ? 32 : 64;  // H100, d = 128: 309 TFLOP/s with 32, 297 with 64
  c.m_tiles = spec.head_dim >= 256 ? 1 : 2;
  c.q_in_registers = spec.head_dim <= 64 ? 1 : 0;
  if (spec.sparsity == Sparsity::dense && spec.causal == Causal::none && spec.head_dim == 128) {
    // One 256-row tile per CTA and a third stage: 318 TFLOP/s dense at B2 H16 S8192 (causal masks
    // and patterns lose more to the larger tile than it gains).
    c.warps = 8;
    c.stages = 3;
  }
  if (spec.sparsity != Sparsity::dense && spec.block_size <= 64) {
    // A query tile taller than a pattern block visits the union of its rows' key blocks: with random
    // patterns that doubles the work (measured: block 64 under 128-row tiles ran 3.1x over
    // proportional at density 0.1; 64-row tiles: 1.27x). 32-key tiles (0.537 ms vs 0.574 with 64),
    // 16-key ones for blocks of 16: a tile is then one key block, so the CTA loads only the blocks
    // its four rows see (H100, B2 H16 S8192 d = 128: 2.11-2.16 ms against 3.35-3.39 at density 0.1,
    // 0.52-0.53 against 0.86-0.91 at 0.02, 5.95-6.12 against 5.9-6.3 at 0.5; docs/attention-log.md,
    // "Landed: small pattern blocks").
    c.m_tiles = 1;
    c.block_n = std::min(32, spec.block_size);
    c.q_in_registers = spec.head_dim <= 128 ? 1 : 0;
  }
  return c;
}

AttentionConfig resolve(const AttentionSpec& in, AttentionConfig c, int compute_capability) {
  const AttentionSpec spec = canonical(in);
  if (c.path == AttentionPath::automatic) {
    const bool tiling_set = c.warps != 0 || c.m_tiles != 0 || c.block_n != 0 || c.stages != 0;
    c.path = tiling_set ? AttentionPath::mma : default_config(spec, compute_capability).path;
  }
  const AttentionConfig d = on_wgmma(c.path) ? wgmma_default_config(spec, c.path) : default_config(spec);
  if (c.warps == 0) c.warps = d.warps;
  if (c.m_tiles == 0) c.m_tiles = d.m_tiles;
  if (c.block_n == 0) c.block_n = d.block_n;
  if (c.stages == 0) c.stages = d.stages;
  if (c.q_in_registers == -1) c.q_in_registers = d.q_in_registers;
  auto refuse = [&](std::string_view what) {
    throw InvalidArgument(fmt::format("attention config '{}' for '{}': {}", key(c), key(spec), what));
  };
  const bool small_pattern_blocks =
      spec.sparsity != Sparsity::dense && (spec.block_size == 16 || spec.block_size == 32);
  if (c.path == AttentionPath::wgmma_gather && !small_pattern_blocks)
    refuse(fmt::format("path = wgmma_gather takes patterns of blocks of 16 or 32, not {}",
                       spec.sparsity == Sparsity::dense ? std::string("a dense spec")
                                                        : fmt::format("blocks of {}", spec.block_size)));
  if (c.warps != 4 && c.warps != 8) refuse(fmt::format("warps = {}: use 4 or 8", c.warps));
  if (c.m_tiles != 1 && c.m_tiles != 2 && c.path != AttentionPath::wgmma_gather)  // (its mt: checked below)
    refuse(fmt::format("mt = {}: use 1 or 2 (16-row tiles per warp)", c.m_tiles));
  if (c.block_n != 16 && c.block_n != 32 && c.block_n != 64 && c.block_n != 128)
    refuse(fmt::format("bn = {}: use 16, 32, 64 or 128 keys per tile", c.block_n));
  // The persistent kernel hands K and V back apart, so deeper rings are worth a try there (shared
  // memory permitting: 64-key tiles).
  const int max_stages = c.path == AttentionPath::wgmma_ws ? 4 : 3;
  if (c.stages < 2 || c.stages > max_stages)
    refuse(fmt::format("stages = {}: use 2 to {} on path {}", c.stages, max_stages, name(c.path)));
  if (c.q_in_registers != 0 && c.q_in_registers != 1) refuse(fmt::format("qreg = {}: use 0 or 1", c.q_in_registers));
  if (on_wgmma(c.path)) {
    const std::string_view path = name(c.path);
    if (!kernel_takes_head_dim(c.path, spec.head_dim))
      refuse(fmt::format("path = {} takes head_dim {}, not {}{}", path, head_dims_taken(c.path), spec.head_dim,
                         c.path == AttentionPath::wgmma_ws ? " (path = wgmma takes 256)" : ""));
    if (c.path == AttentionPath::wgmma_gather) {
      // mt: the query heads of a K/V group a CTA takes together, their query blocks the columns.
      if ((c.m_tiles != 1 && c.m_tiles != 2 && c.m_tiles != 4) || c.m_tiles * spec.block_size > 64)
        refuse(fmt::format("mt = {}: path = wgmma_gather takes 1, 2 or 4 query heads a CTA, at most 64 queries "
                           "(here {} for blocks of {})",
                           c.m_tiles, 64 / spec.block_size == 4 ? "1, 2 or 4" : "1 or 2", spec.block_size));
      if (c.block_n != spec.block_size)
        refuse(fmt::format("bn = {}: path = wgmma_gather needs the pattern's block size, {}", c.block_n,
                           spec.block_size));
      if (c.warps != 4) refuse(fmt::format("warps = {}: path = wgmma_gather runs one warpgroup (4)", c.warps));
      if (c.stages != 2)
        refuse(fmt::format("stages = {}: path = wgmma_gather has two ring slots for K and two for V (2)", c.stages));
    } else if (c.m_tiles != 1) {
      refuse(fmt::format("mt = {}: path = {} needs 1 (a warpgroup owns 64 rows)", c.m_tiles, path));
    }
    const bool takes_small_tiles = c.path == AttentionPath::wgmma || c.path == AttentionPath::wgmma_gather;
    const bool small_tile = takes_small_tiles && (c.block_n == 16 || c.block_n == 32);
    if (c.block_n != 64 && c.block_n != 128 && !small_tile)
      refuse(fmt::format("bn = {}: path = {} takes {}", c.block_n, path,
                         c.path == AttentionPath::wgmma ? "16, 32, 64 or 128" : "64 or 128"));
    if (c.q_in_registers != 0)
      refuse(fmt::format("qreg = {}: path = {} reads Q from shared memory (0)", c.q_in_registers, path));
  }
  if (spec.sparsity != Sparsity::dense) {
    const int bs = spec.block_size;
    const int groups = (c.block_m() / std::min(bs, c.block_m())) * (c.block_n / std::min(bs, c.block_n));
    if (groups > 64)
      refuse(fmt::format("a {} x {} tile holds {} pattern blocks of {}: at most 64 fit the tile mask", c.block_m(),
                         c.block_n, groups, bs));
  }
  const int shared = codegen::attention_forward_shared_bytes(spec, c);
  if (shared > codegen::kMaxDynamicSharedBytes)
    refuse(fmt::format("needs {} bytes of shared memory, more than the {} a block may have", shared,
                       codegen::kMaxDynamicSharedBytes));
  return c;
}

Strides Strides::bhsd(std::int64_t heads, std::int64_t seq, std::int64_t head_dim) {
  return {heads * seq * head_dim, seq * head_dim, head_dim};
}

Strides Strides::bshd(std::int64_t heads, std::int64_t seq, std::int64_t head_dim) {
  return {seq * heads * head_dim, head_dim, heads * head_dim};
}

}  // namespace sjit

// Pattern blocks of 16 and 32 on Hopper: whether the backward's dK/dV pass packs its query tiles from
// runs of one active block each (PackedQueries in templates/sparsejit/attention_backward.cuh) or walks
// contiguous tiles. Packing visits only the blocks a CTA's keys see, but a packed tile whose runs do
// not lie end to end moves a run at a time (a copy and a reduction per run instead of per tile), so it
// pays only where it visits clearly fewer tiles: on 64-query tiles random blocks of 32 below a density
// of about 0.45 and of 16 below about 0.27 (0.18 at d = 64; on 128-query ones about 0.57 and 0.35), not
// a sliding window or a dense-ish pattern, whose blocks fill the contiguous tiles already
// (docs/attention.md, "Small pattern blocks in the backward" and "Packing counts whole tiles").
//
// Or, on the gathered-query pass (path=wgmma_gather, attention_backward_sm90_gather.cuh): a CTA a key
// block, its query blocks gathered 64 queries a step, so that it computes only the blocks the pattern
// keeps, but reads Q and dO once a key block (the 128-key CTAs: once for 4 or 8 blocks); it pays where
// the 128-key CTAs would compute several times the active scores. Pattern blocks of 64 have it too
// (attention_backward_sm90_key_block.cuh: a CTA a key block, a query block a step), where a 128-key
// CTA would walk the union of its two blocks' query tiles.
#pragma once

#include <optional>
#include <string_view>

#include "sparsejit/attention.h"
#include "sparsejit/pattern.h"

namespace sjit::attention {

// How the Hopper dK/dV pass walks a pattern's query blocks of 16 or 32: contiguous tiles, packed tiles
// (both 128 keys a CTA), or gathered (a key block a CTA). The public BackwardWalk, which reports it.
using QueryWalk = BackwardWalk;

// The walk for `pattern` on a 128-key pass of `key_rows` keys and `tile_cols` queries a tile, whose
// CTAs walk the query blocks of `group` query heads (a K/V head's), where the spec has a gathered-query
// pass (`gathers`), which would sum dQ by its dQ pass (`gathered_sums_by_pass`) or atomically. The
// first that applies decides:
//   - `forced`, SJIT_BACKWARD_WALK's value: "tiles", "packed" or "gathered" forces that walk where it
//     exists for the spec (packed: blocks narrower than the tiles; gathered: `gathers` and blocks
//     narrower than key_rows); "" or "auto" does not; anything else is refused (InvalidArgument);
//   - gathering_queries_pays, then packing_queries_pays.
// (A call that asks for query tiles but no walk passes `gathers` false: the rules then choose between
// the walks that have them.)
QueryWalk choose_query_walk(const AttentionSpec& spec, const BlockPattern& pattern, int key_rows, int tile_cols,
                            std::int64_t group, bool gathers, bool gathered_sums_by_pass, std::string_view forced);
// The 128-key dK/dV pass's walks of `pattern` on contiguous tiles of `key_rows` keys by `tile_cols`
// queries (the tiles the dQ pass's rule counts, packed or not: backward_policy.h): how many tiles they
// hold, and whether they make a band, each CTA's walk one run of adjacent query tiles that meets the
// run of the CTA of the next key tile (a sliding window, local blocks). In a band the CTAs that run
// together add atomic dQ to the same rows, in the L2, and atomic dQ wins from fewer key tiles a row.
// With `tile_cols` the pattern's block size it says whether the packed runs lie end to end (a window's,
// not a random pattern's whose every tile is active), which packing_queries_pays asks.
struct ContiguousWalks {
  std::int64_t tiles = 0;
  bool banded = false;
};
ContiguousWalks contiguous_walks(const BlockPattern& pattern, int key_rows, int tile_cols);

// SJIT_BACKWARD_WALK's value, or "" when unset; any value but tiles, packed, gathered or auto is refused
// (InvalidArgument), also where no walk is to be chosen (blocks of 128), so that a typo never passes
// unnoticed.
std::string_view forced_query_walk();

// Whether the gathered backward is expected to beat the 128-key CTAs on `pattern`: the scores those
// compute (on the fewer of contiguous and packed tiles) over the gathered steps' scores, at least
// min_walk_over_gathered_scores, with kMinGatheredBlocksPerColumn blocks a key block; for blocks of 64
// at d = 128 only where it would sum dQ by its pass (gathered_sums_by_pass: with atomic dQ the 128-key
// CTAs, whose warpgroups skip each other's inactive tiles, tie it).
bool gathering_queries_pays(const AttentionSpec& spec, const BlockPattern& pattern, int key_rows, int tile_cols,
                            bool gathered_sums_by_pass);
// Whether the spec's gathered backward pays only where it sums dQ by its dQ pass: blocks of 64 at
// d = 128, where with atomic dQ the 128-key CTAs tie it (so its atomic dK/dV kernel never runs unforced).
bool gathers_only_with_dq_pass(const AttentionSpec& spec);
// The crossover measured on the H100 (packed_queries.cpp; blocks of 64, and d = 64 against its
// 128-query tiles, on the H200): a gathered score costs more where blocks are narrower (a step reads 64
// rows for 16 keys or 32) and less at d = 64, whose gathered steps are cheaper against the 128-key
// CTAs' products.
double min_walk_over_gathered_scores(int head_dim, int block);
// And the active blocks a key block's column holds on average, after a causal mask, at least.
constexpr double kMinGatheredBlocksPerColumn = 6;

// Whether a dK/dV pass of `key_rows` keys a CTA and `tile_cols` queries a tile should pack `pattern`'s
// query blocks (block_size < tile_cols) into its tiles: the tiles packed runs would fill, over the
// contiguous tiles holding an active block, at most packed_tiles_at_most. On 64-query tiles the packed
// tiles are whole, a CTA's last one counted full (a sliding window's runs fill as many tiles as its
// contiguous ones); on 128-query tiles they are the packed queries over 128 (see packed_queries.cpp),
// and a band (contiguous_walks) packs below a share that grows with `group`, the query heads a K/V
// head (the CTAs walk each one's blocks).
bool packing_queries_pays(int head_dim, const BlockPattern& pattern, int key_rows, int tile_cols,
                          std::int64_t group = 1);
// The crossover measured on 64-query tiles (the H100 at d = 128, the H200 at d = 64 for blocks of 16)
// and 128-query ones (d = 64, the H200; for bands by `group`): packed_queries.cpp.
double packed_tiles_at_most(int head_dim, int block, int tile_cols, std::int64_t group = 1, bool banded = false);

// Whether the d = 64 dK/dV pass should walk `pattern` (blocks of 16 or 32) on 64-query tiles
// (codegen::narrow_query_backward_tiling) rather than its default 128-query ones, for CTAs of `key_rows`
// keys that walk the query blocks of `group` query heads (a K/V head's): where a CTA's walk is short,
// below min_wide_tiles_a_walk tiles of 128 packed queries a query head on average (a sliding window
// of a few hundred keys), since 128-query tiles cost more at a walk's ends (a larger first load, the
// last dQ product after the walk) than they save in its middle.
bool narrow_query_tiles_pay(const BlockPattern& pattern, int key_rows, std::int64_t group);
// The crossover measured on the H200 (packed_queries.cpp), by pattern block and query heads a K/V
// head: lower for groups, whose CTAs spread their fixed costs over several heads' walks.
double min_wide_tiles_a_walk(int block, std::int64_t group);
// SJIT_BACKWARD_QUERY_TILES's value: 64 or 128 forces d = 64's dK/dV tiles of that many queries where
// the spec has both (pattern blocks of 16 and 32 on sm_90a), nullopt for "auto" or unset; anything else
// is refused (InvalidArgument), also where there is nothing to choose, so that a typo never passes.
std::optional<int> forced_query_tile_cols();

}  // namespace sjit::attention

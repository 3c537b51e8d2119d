#include "attention/packed_queries.h"

#include <algorithm>
#include <cstdlib>
#include <vector>

#include <fmt/format.h>

#include "attention/gathered_keys.h"
#include "attention/tile_schedule.h"
#include "sparsejit/error.h"

namespace sjit::attention {

namespace {
[[noreturn]] void refuse_query_walk(std::string_view forced) {
  throw InvalidArgument(fmt::format("SJIT_BACKWARD_WALK = '{}': use tiles, packed, gathered or auto", forced));
}

// contiguous_walks of the key-major walks `walks` (active_tile_spans_each_item of a transposed pattern
// of `heads` heads): their tiles, and whether each is one run meeting the last key tile's run.
ContiguousWalks walks_of(const std::vector<ItemTiles>& walks, int heads) {
  const std::size_t key_tiles = walks.size() / std::size_t(std::max(heads, 1));
  ContiguousWalks out;
  bool broken = false;
  const ItemTiles* last = nullptr;  // the last walk with tiles in this head
  for (std::size_t item = 0; item < walks.size(); ++item) {
    if (item % key_tiles == 0) last = nullptr;
    const ItemTiles& walk = walks[item];
    out.tiles += walk.count;
    if (walk.count == 0) continue;  // (a key tile no query sees: the band goes on past it)
    const bool one_run = walk.last - walk.first + 1 == walk.count;
    const bool meets_last = !last || (walk.first <= last->last + 1 && last->first <= walk.last + 1);
    broken = broken || !one_run || !meets_last;
    last = &walk;
  }
  out.banded = out.tiles > 0 && !broken;
  return out;
}
}  // namespace

QueryWalk choose_query_walk(const AttentionSpec& spec, const BlockPattern& pattern, int key_rows, int tile_cols,
                            std::int64_t group, bool gathers, bool gathered_sums_by_pass, std::string_view forced) {
  // Packing needs blocks narrower than the tiles; gathering, blocks narrower than a CTA's keys (blocks
  // of 64: a 128-key CTA walks the union of its two blocks' query tiles).
  const bool narrow = pattern.block_size() < tile_cols;
  const bool may_gather = gathers && pattern.block_size() < key_rows;
  const QueryWalk fallback = narrow ? QueryWalk::packed : QueryWalk::tiles;
  if (!forced.empty() && forced != "auto") {
    if (forced == "tiles") return QueryWalk::tiles;
    if (forced == "packed") return fallback;
    if (forced == "gathered") return may_gather ? QueryWalk::gathered : fallback;
    refuse_query_walk(forced);
  }
  if (may_gather && gathering_queries_pays(spec, pattern, key_rows, tile_cols, gathered_sums_by_pass))
    return QueryWalk::gathered;
  return narrow && packing_queries_pays(spec.head_dim, pattern, key_rows, tile_cols, group) ? QueryWalk::packed
                                                                                           : QueryWalk::tiles;
}

std::string_view forced_query_walk() {
  const char* env = std::getenv("SJIT_BACKWARD_WALK");
  const std::string_view forced = env == nullptr ? std::string_view() : std::string_view(env);
  if (!forced.empty() && forced != "auto" && forced != "tiles" && forced != "packed" && forced != "gathered")
    refuse_query_walk(forced);
  return forced;
}

// Measured on the H100 (thirty-fourth session, docs/attention-log.md, "Landed: the gathered backward"):
// backward ms, 128-key CTAs (their default) / gathered, random patterns; the ratio is the 128-key
// CTAs' scores over the gathered steps'.
//   d = 128 (B2 H16 S8192), blocks of 16: 0.25 (ratio 3.6) 4.59 / 6.55, 0.1 (5.6) 2.97 / 2.91,
//     0.05 (6.4) 1.97 / 1.70, 0.02 (6.6) 1.00 / 0.96; blocks of 32: 0.25 (2.7) 3.20 / 3.46,
//     0.1 (3.4) 1.87 / 1.57, 0.05 (3.6) 1.06 / 0.98, 0.02 (3.5) 0.61 / 0.58;
//   d = 64 (B4 H32 S4096), blocks of 16: 0.25 4.52 / 3.24, 0.1 3.46 / 1.55, 0.02 1.25 / 0.63; blocks
//     of 32: 0.25 3.05 / 1.74, 0.1 1.86 / 0.88, 0.02 0.69 / 0.49;
//   d = 128, 4 query heads a K/V head (the gathered dQ pass): blocks of 16 at 0.25 4.88 / 6.73, 0.1
//     3.19 / 2.90, 0.02 1.72 / 0.80; blocks of 32 at 0.25 3.23 / 3.22, 0.1 1.88 / 1.38, 0.02 0.65 / 0.45.
// d = 96 takes 128's crossovers: blocks of 16 at 0.1 2.46 against 2.69, blocks of 32 1.36 against
// 1.59. Causal top-left: blocks of 16 at 0.1 1.81 against 1.93, but at 0.02 (5 blocks a key block
// column) 0.72 against 0.68; blocks of 32 at 0.1 0.98 against 1.18: hence kMinGatheredBlocksPerColumn.
// Blocks of 64 (the thirty-seventh session, H200, B2 H16 S8192 random patterns, whose scores ratio is
// 1.5 at 0.5, 1.75 at 0.25 and 1.9 at 0.1; backward ms, 128-key CTAs / gathered): d = 128 with atomic
// dQ 0.5 3.010 / 3.268, 0.25 1.921 / 1.962, 0.1 0.903 / 0.909; with the dQ pass 0.25 2.304 / 1.972,
// 0.1 1.090 / 0.953, 0.02 0.424 / 0.376; d = 64 (B4 H32 S4096, 128-key CTAs with their default dQ
// pass, gathered atomic) 0.25 1.398 / 1.128, 0.1 0.707 / 0.598; d = 96 0.25 1.521 / 1.424, 0.1
// 0.771 / 0.719; four query heads a K/V head (gathered: the dQ pass) 0.25 1.980 / 1.934, 0.1 1.106 /
// 0.885; causal 0.1 0.596 / 0.584; a window of 8 blocks (ratio 1.1) 0.552 / 0.657, at d = 64 0.717 /
// 0.753. At 0.5 it wins where the 128-key CTAs would sum dQ by their pass (d = 128 with the pass 3.661
// / 3.400, d = 64 2.370 / 2.183), not at d = 96 (atomic 2.612 / 2.774).
// d = 64 again once its 128-key CTAs walked 128-query tiles with atomic dQ (forty-fourth session, H200,
// B4 H32 S4096, two rounds; backward ms, the better of contiguous and packed tiles / gathered, the
// ratio in brackets): blocks of 16 at 0.25 (3.5) 3.303-3.339 / 2.909-2.932, 0.3 (3.1) 3.396-3.421 /
// 3.457-3.476, 0.4 (2.4) 3.449 / 4.490; blocks of 32 at 0.3 (2.5) 2.522 / 1.841, 0.4 (2.2) 2.898 /
// 2.438, 0.5 (1.9) 3.092-3.172 / 2.895-2.991, 0.55 (1.7) 3.193-3.195 / 3.217-3.264, 0.6 (1.6)
// 3.259-3.266 / 3.542-3.561.
double min_walk_over_gathered_scores(int head_dim, int block) {
  if (block == 64) return head_dim == 96 ? 1.6 : 1.3;
  if (head_dim == 64) return block == 16 ? 3.3 : 1.8;
  return block == 16 ? 5.0 : 3.0;
}

bool gathers_only_with_dq_pass(const AttentionSpec& spec) { return spec.block_size == 64 && spec.head_dim == 128; }

bool gathering_queries_pays(const AttentionSpec& spec, const BlockPattern& pattern, int key_rows, int tile_cols,
                            bool gathered_sums_by_pass) {
  const int block = pattern.block_size();
  if (block >= key_rows || pattern.nnz() == 0) return false;
  if (gathers_only_with_dq_pass(spec) && !gathered_sums_by_pass) return false;
  const BlockPattern key_major = pattern.transposed();
  // The 128-key CTAs' scores, on the fewer of the contiguous and packed tiles.
  const double contiguous = double(count_active_tiles(key_major, key_rows, tile_cols));
  const double packed = double(count_active_tiles(key_major, key_rows, block)) * block / tile_cols;
  const double walk_scores = std::min(contiguous, packed) * key_rows * tile_cols;
  // The gathered dK/dV pass's: a key block's query blocks, 64 queries a step (whatever the 128-key
  // CTAs' tiles: 128 queries at d = 64), the last one padded. (Neither count cuts at a causal edge:
  // both passes drop the tiles past it.) And the blocks a causal mask leaves a key block: with few,
  // each CTA's fixed costs (K and V in, dK and dV out) dominate.
  constexpr int step_queries = 64;
  const GatheredWalk walk = gathered_walk(spec, key_major, std::max(step_queries / block, 1), true);
  const double columns = double(key_major.heads()) * double(key_major.block_rows());
  if (double(walk.seen) < kMinGatheredBlocksPerColumn * columns) return false;
  const double gathered_scores = double(walk.steps) * step_queries * block;
  return walk_scores >= min_walk_over_gathered_scores(spec.head_dim, block) * gathered_scores;
}

// 64-query tiles measured on the H100 (B2 H16 S8192 d = 128): random blocks of 16 at 0.25 (0.90 of the
// tiles) were 5-9% faster packed, blocks of 32 at 0.5 (0.94) and blocks of 16 at 0.5 (1.0) 0-2% and 5%
// slower, windows (1.0) 1-3% slower. 128-query tiles (d = 64) on the H200 (forty-fourth session, B4 H32
// S4096, backward ms packed / contiguous, two rounds): blocks of 16 at 0.25 (0.90) 3.303-3.339 /
// 3.416-3.440, 0.3 (0.945) 3.396-3.421 / 3.424-3.450, 0.4 (0.984) 3.534 / 3.449, 0.5 (0.996) 3.526 /
// 3.443; blocks of 32 at 0.5 (0.936) 3.092-3.172 / 3.279-3.384, 0.55 (0.958) 3.193-3.195 / 3.325-3.327,
// 0.6 (0.976) 3.259-3.266 / 3.326-3.334, 0.7 (0.994) 3.323-3.346 / 3.326-3.350: a packed run costs
// less against a tile of 128 queries.
// The short walks of windows on 64-query tiles (forty-fifth session, H200, forced onto each walk, two
// rounds; in brackets the whole packed tiles over the contiguous ones): at d = 128 (B2 H16 S8192)
// blocks of 16, 5 + 1 + 4 (1.0) 0.470 / 0.406-0.449, 6 + 1 + 5 (0.84) 0.493-0.498 / 0.411-0.444;
// blocks of 32, 2 + 1 + 1 (1.0) 0.414 / 0.372-0.400, 3 + 1 + 2 (1.0) 0.460 / 0.444-0.449, 4 + 1 + 3
// (1.0) 0.431-0.438 / 0.410-0.431. At d = 64 (B4 H32 S4096) blocks of 16, 5 + 1 + 4 (1.0) 0.557-0.568 /
// 0.513-0.514, 6 + 1 + 5 (0.84) 0.595-0.596 / 0.579-0.585, with four heads a K/V head 0.527-0.528 /
// 0.505-0.509; blocks of 32, 2 + 1 + 1 (1.0) 0.476-0.484 / 0.451-0.457, four heads 0.373-0.374 /
// 0.367-0.370, 3 + 1 + 2 (1.0) 0.529-0.534 / 0.504-0.505; and random patterns there, blocks of 16 at
// 0.1 (0.61) 3.468-3.475 / 3.773-3.857, 0.15 (0.73) 3.999-4.007 / 4.095-4.203, 0.2 (0.84) 4.375-4.390
// / 4.221-4.285; blocks of 32 at 0.1 (0.63) 1.759-1.785 / 1.894-2.014, 0.2 (0.73) 2.757-2.793 /
// 2.987-3.015, 0.3 (0.81) 3.378-3.418 / 3.614-3.627. So a 64-query walk counts the tiles it would
// really walk, each CTA's last one whole: a window's packed runs fill as many tiles as its contiguous
// ones (their share was 0.85-0.92 counted in queries, which packed them), and at d = 64 blocks of 16
// pack below 0.8. Blocks of 16 at d = 128 still pack 6 + 1 + 5 (0.84), 11-21% slower, but for the way
// dQ is summed then (the pass; packed with atomic dQ 0.412-0.413 ms, as fast as contiguous): the dQ
// rule counts a row's key tiles on the packed schedule (docs/attention.md, "Packing counts whole tiles").
// On 128-query tiles (d = 64, atomic dQ) the same windows gain packed though they walk as many tiles
// (blocks of 16, four heads a K/V head: 5 + 1 + 4 0.393-0.396 / 0.450-0.452, 6 + 1 + 5 0.418-0.423 /
// 0.452-0.453), so there the measure stays the packed queries over 128 (a part-full packed tile adds
// dQ for its runs' rows only, where a contiguous edge tile adds all of them).
// Windows on 128-query tiles by query heads a K/V head (forty-seventh session, H200, d = 64 B4 H32
// S4096, forced onto 128-query tiles, two rounds; backward ms contiguous / packed, the packed queries'
// share in brackets): one head, blocks of 32, 6 + 1 + 5 (0.76) 0.711-0.712 / 0.640-0.641, 4 + 1 + 3
// (0.92) 0.508-0.541 / 0.542-0.555, 8 + 1 + 7 (0.95) 0.711-0.716 / 0.729-0.740, 12 + 1 + 11 (0.97)
// 0.883-0.885 / 0.891-0.900; blocks of 16, 12 + 1 + 11 (0.78) 0.724-0.736 / 0.695, 4 + 1 + 3 (0.63) and
// 5 + 1 + 4 (0.71) 6% slower packed (those two take 64-query tiles unforced). Two heads: blocks of 16,
// 5 + 1 + 4 (0.71) 0.478-0.486 / 0.447-0.456, 6 + 1 + 5 (0.79) 0.485-0.494 / 0.454-0.463, 12 + 1 + 11
// (0.78) 0.645-0.662 / 0.590-0.591, 8 + 1 + 7 (0.96) 0.477-0.481 / 0.508-0.509; blocks of 32, 3 + 1 +
// 2 (0.75) 0.456-0.465 / 0.423-0.427, 4 + 1 + 3 (0.92) 0.459-0.462 / 0.468-0.470, 8 + 1 + 7 (0.95)
// 0.636-0.637 / 0.641. Four heads: blocks of 16, 4 + 1 + 3 (0.63) 0.456-0.462 / 0.429-0.430, 5 + 1 + 4
// 0.463-0.465 / 0.401-0.403, 6 + 1 + 5 0.455-0.458 / 0.427-0.428, 12 + 1 + 11 (0.78) 0.642-0.643 /
// 0.576-0.581, 8 + 1 + 7 (0.96) 0.448-0.455 / 0.485-0.491; blocks of 32, 2 + 1 + 1 (0.59) 0.438-0.443
// / 0.373-0.375, 6 + 1 + 5 (0.76) 0.624-0.627 / 0.510-0.514, 4 + 1 + 3 (0.92) 0.433-0.440 / 0.417,
// 8 + 1 + 7 (0.95) 0.622-0.628 / 0.607-0.608, 12 + 1 + 11 (0.97) 0.787-0.795 / 0.778-0.784. So a band
// packs below 0.85 with one or two heads a K/V head and below 0.94 with four or more (where blocks of
// 32 at 0.95-0.97 lose 1-3% contiguous, and blocks of 16 at 0.96 gain 8%). Random patterns keep 0.97
// whatever the group: with four heads blocks of 16 at 0.25 / 0.3 / 0.4 3.312-3.371 / 3.301-3.302,
// 3.314-3.316 / 3.368-3.399, 3.343-3.368 / 3.469-3.490, blocks of 32 at 0.5 / 0.6 / 0.7 3.222 /
// 2.988-2.990, 3.254-3.315 / 3.180-3.226, 3.263-3.314 / 3.212-3.278, as with one.
double packed_tiles_at_most(int head_dim, int block, int tile_cols, std::int64_t group, bool banded) {
  if (tile_cols >= 128) return !banded ? 0.97 : group >= 4 ? 0.94 : 0.85;
  return head_dim == 64 && block == 16 ? 0.8 : 0.92;
}

bool packing_queries_pays(int head_dim, const BlockPattern& pattern, int key_rows, int tile_cols,
                          std::int64_t group) {
  const int block = pattern.block_size();
  if (block >= tile_cols) return false;
  // The dK/dV pass walks the transposed pattern: its rows are keys, an item a CTA's.
  const BlockPattern key_major = pattern.transposed();
  const double contiguous = double(count_active_tiles(key_major, key_rows, tile_cols));
  if (contiguous == 0) return false;
  // The runs of one active block each a CTA walks, tile_cols / block to a tile: on 128-query tiles in
  // queries (see above), on 64-query ones in whole tiles.
  const std::vector<ItemTiles> runs = active_tile_spans_each_item(key_major, key_rows, block);
  const int runs_a_tile = tile_cols / block;
  double packed = 0;
  for (const ItemTiles& walk : runs) {
    const std::int32_t n = walk.count;
    packed += tile_cols >= 128 ? double(n) / runs_a_tile : double((n + runs_a_tile - 1) / runs_a_tile);
  }
  // On 128-query tiles a band of runs (each CTA's runs end to end, meeting the next CTA's: a window),
  // which packing only trims at its walks' ends, pays below a lower share than a random pattern's
  // runs, the lower the fewer query heads a K/V head (above).
  const bool banded = tile_cols >= 128 && walks_of(runs, key_major.heads()).banded;
  return packed <= packed_tiles_at_most(head_dim, block, tile_cols, group, banded) * contiguous;
}

// Measured on the H200 (forty-third session, docs/attention.md, "d = 64: pattern blocks of 16 and 32
// on 128-query tiles"; B4 H32 S4096, backward ms queued, 64-query tiles with their dQ pass / 128-query
// tiles with their rule's way, atomic here; in brackets the 128-query tiles a CTA walks a query head):
// blocks of 16, windows of 4 + 1 + 3 blocks (1.9) 0.423-0.446 / 0.635-0.657, 8 + 1 + 7 (2.9)
// 0.519-0.553 / 0.550, 12 + 1 + 11 (3.9) 0.641-0.651 / 0.688, 16 + 1 + 15 (4.9) 0.748-0.755 / 0.710,
// 24 + 1 + 23 (6.9) 0.974 / 0.842; blocks of 32, windows of 2 + 1 + 1 (1.75) 0.448-0.474 /
// 0.514-0.539, 4 + 1 + 3 (2.75) 0.553-0.568 / 0.513-0.546, 12 + 1 + 11 (6.75) 0.977 / 0.875; random
// patterns at 0.5 (long walks), blocks of 16 4.230 / 3.448, of 32 4.092 / 3.325.
// With several query heads a K/V head (forty-fourth session, same shape, two rounds; the 64-query
// tiles forced / the 128-query tiles forced, docs/attention-log.md): a CTA's fixed costs and the dQ
// pass's second S and dP spread over the group's walks, so the crossover falls, but far less than in
// proportion to the group. Blocks of 16, 2 heads: 6 + 1 + 5 (2.4) 0.513-0.548 / 0.461-0.462, 8 + 1 + 7
// (2.9) 0.499-0.500 / 0.474-0.475; 4 heads: 4 + 1 + 3 (1.9) 0.349-0.366 / 0.411-0.429, 6 + 1 + 5
// 0.524-0.526 / 0.421-0.428, 8 + 1 + 7 0.448-0.471 / 0.448-0.453, 12 + 1 + 11 0.585-0.589 /
// 0.574-0.578; 8 heads: 4 + 1 + 3 0.337-0.348 / 0.416-0.420, 8 + 1 + 7 0.459-0.460 / 0.430-0.437.
// Blocks of 32, 2 heads: 2 + 1 + 1 (1.75) 0.396-0.398 / 0.434-0.437, 3 + 1 + 2 (2.25) 0.434-0.460 /
// 0.418-0.422, 4 + 1 + 3 (2.75) 0.484-0.508 / 0.460-0.462; 4 heads: 2 + 1 + 1 0.355-0.372 /
// 0.359-0.370, 4 + 1 + 3 0.461-0.492 / 0.416-0.418; 8 heads: 2 + 1 + 1 0.369 / 0.351-0.354. And at
// the blocks of 16's crossover (a later call): 2 heads 4 + 1 + 3 (1.9) 0.374-0.388 / 0.455-0.476,
// 5 + 1 + 4 (2.1) 0.482-0.492 / 0.431-0.441; 4 heads 5 + 1 + 4 0.471-0.475 / 0.396-0.399.
double min_wide_tiles_a_walk(int block, std::int64_t group) {
  if (block == 16) return group <= 1 ? 4.5 : 2.0;
  return group <= 1 ? 2.25 : group == 2 ? 2.0 : 1.7;
}

bool narrow_query_tiles_pay(const BlockPattern& pattern, int key_rows, std::int64_t group) {
  const int block = pattern.block_size();
  const BlockPattern key_major = pattern.transposed();
  const std::int64_t key_tiles = (key_major.block_rows() * block + key_rows - 1) / key_rows;
  // The pattern's (head, key tile) columns (one pattern shared by all heads, or one a head); a CTA
  // walks its key tile's column in each of the group's query heads.
  const double columns = double(key_tiles) * double(key_major.heads());
  // Their runs of one active query block each, 128 queries a tile.
  const double wide_tiles = double(count_active_tiles(key_major, key_rows, block)) * block / 128;
  return columns > 0 && wide_tiles < min_wide_tiles_a_walk(block, group) * columns;
}

ContiguousWalks contiguous_walks(const BlockPattern& pattern, int key_rows, int tile_cols) {
  const BlockPattern key_major = pattern.transposed();
  return walks_of(active_tile_spans_each_item(key_major, key_rows, tile_cols), key_major.heads());
}

std::optional<int> forced_query_tile_cols() {
  const char* env = std::getenv("SJIT_BACKWARD_QUERY_TILES");
  const std::string_view forced = env == nullptr ? std::string_view() : std::string_view(env);
  if (forced.empty() || forced == "auto") return std::nullopt;
  if (forced == "64") return 64;
  if (forced == "128") return 128;
  throw InvalidArgument(fmt::format("SJIT_BACKWARD_QUERY_TILES = '{}': use 64, 128 or auto", forced));
}

}  // namespace sjit::attention

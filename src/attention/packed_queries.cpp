#include "attention/packed_queries.h"

#include <algorithm>
#include <cstdlib>

#include <fmt/format.h>

#include "attention/tile_schedule.h"
#include "sparsejit/error.h"

namespace sjit::attention {

std::string_view name(QueryWalk walk) {
  switch (walk) {
    case QueryWalk::tiles: return "tiles";
    case QueryWalk::packed: return "packed";
    case QueryWalk::gathered: return "gathered";
  }
  return "?";
}

QueryWalk choose_query_walk(const AttentionSpec& spec, const BlockPattern& pattern, int key_rows, int tile_cols,
                            bool gathers, std::string_view forced) {
  const bool narrow = pattern.block_size() < tile_cols;
  if (!forced.empty() && forced != "auto") {
    if (forced == "tiles" || !narrow) return QueryWalk::tiles;
    if (forced == "packed") return QueryWalk::packed;
    if (forced == "gathered") return gathers ? QueryWalk::gathered : QueryWalk::packed;
    throw InvalidArgument(fmt::format("SJIT_BACKWARD_WALK = '{}': use tiles, packed, gathered or auto", forced));
  }
  if (!narrow) return QueryWalk::tiles;
  if (gathers && gathering_queries_pays(spec, pattern, key_rows, tile_cols)) return QueryWalk::gathered;
  return packing_queries_pays(pattern, key_rows, tile_cols) ? QueryWalk::packed : QueryWalk::tiles;
}

std::string_view forced_query_walk() {
  const char* env = std::getenv("SJIT_BACKWARD_WALK");
  return env == nullptr ? std::string_view() : std::string_view(env);
}

bool gathering_queries_pays(const AttentionSpec& spec, const BlockPattern& pattern, int key_rows, int tile_cols) {
  const int block = pattern.block_size();
  if (block >= tile_cols || pattern.nnz() == 0) return false;
  const BlockPattern key_major = pattern.transposed();
  // The 128-key CTAs' scores, on the fewer of the contiguous and packed tiles.
  const double contiguous = double(count_active_tiles(key_major, key_rows, tile_cols));
  const double packed = double(count_active_tiles(key_major, key_rows, block)) * block / tile_cols;
  const double walk_scores = std::min(contiguous, packed) * key_rows * tile_cols;
  // The gathered steps': a key block's query blocks, 64 queries a step (the last one padded), those a
  // causal mask leaves (the pass drops the blocks before the edge).
  const int blocks_per_step = tile_cols / block;
  const std::int64_t offset = spec.causal == Causal::bottom_right ? pattern.block_cols() - pattern.block_rows() : 0;
  std::int64_t steps = 0;
  for (int head = 0; head < key_major.heads(); ++head)
    for (std::int64_t key_block = 0; key_block < key_major.block_rows(); ++key_block) {
      std::int64_t seen = 0;
      for (const std::int32_t q_block : key_major.row(head, key_block))
        seen += spec.causal == Causal::none || key_block <= q_block + offset;
      steps += (seen + blocks_per_step - 1) / blocks_per_step;
    }
  const double gathered_scores = double(steps) * tile_cols * block;
  return walk_scores >= kMinWalkOverGatheredScores * gathered_scores;
}

bool packing_queries_pays(const BlockPattern& pattern, int key_rows, int tile_cols) {
  const int block = pattern.block_size();
  if (block >= tile_cols) return false;
  // The dK/dV pass walks the transposed pattern: its rows are keys.
  const BlockPattern key_major = pattern.transposed();
  const double contiguous = double(count_active_tiles(key_major, key_rows, tile_cols));
  // Runs a CTA walks, tile_cols / block to a tile (a walk's last tile may be part full: ignored).
  const double packed = double(count_active_tiles(key_major, key_rows, block)) * block / tile_cols;
  return contiguous > 0 && packed <= kPackedTilesAtMost * contiguous;
}

}  // namespace sjit::attention

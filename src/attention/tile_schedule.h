// The block-sparse schedule of a forward kernel: for each (pattern head, query tile) the key tiles it
// visits, with the pattern blocks of each tile that are active. Built once per (pattern, tile shape).
#pragma once

#include <cstdint>
#include <vector>

#include "sparsejit/pattern.h"

namespace sjit::attention {

struct TileSchedule {
  int pattern_heads = 0;
  int q_tiles = 0;                          // query tiles per head
  std::vector<std::int32_t> item_tile_begin;  // [pattern_heads * q_tiles + 1]; item = head * q_tiles + q_tile
  std::vector<std::int32_t> tile_index;       // ascending key tile numbers of each item
  std::vector<std::uint64_t> tile_mask;       // kWholeTile, or bit (row group * groups per row + column group)
  std::vector<std::int32_t> item_order;       // items by descending tile count: the launch order
  // [pattern_heads * q_tiles]: each head's items (as q_tile, its position in the head) by descending
  // tile count. The key-major pass launches a head's key tiles together, for L2, and in this order.
  std::vector<std::int32_t> head_item_order;
  std::int64_t tiles() const { return static_cast<std::int64_t>(tile_index.size()); }
};

// Tiles of block_m query rows by block_n keys over the pattern's blocks. A pattern block larger than a
// tile covers several tiles whole; a tile larger than a block holds several blocks, and its mask says
// which. Groups past the pattern's last row or column count as active (those rows and keys are past
// the sequence and masked by length), so a tile whose real blocks are all active is whole.
TileSchedule build_tile_schedule(const BlockPattern& pattern, int block_m, int block_n);

// The key tiles of every item where all items have as many, else 0 (the persistent forward splits its
// last round only where items are of one length: src/attention/last_round.h).
int uniform_item_tiles(const TileSchedule& schedule);

// build_tile_schedule(pattern, block_m, block_n).tiles() without building the schedule: the (pattern
// head, query tile, key tile) triples holding an active block. O(active blocks + tiles).
std::int64_t count_active_tiles(const BlockPattern& pattern, int block_m, int block_n);
// Those triples item by item: [pattern heads * query tiles], item = head * query tiles + query tile.
std::vector<std::int32_t> active_tiles_each_item(const BlockPattern& pattern, int block_m, int block_n);
// And with the first and last key tile of each item (both 0 where it has none).
struct ItemTiles {
  std::int32_t count = 0, first = 0, last = 0;
};
std::vector<ItemTiles> active_tile_spans_each_item(const BlockPattern& pattern, int block_m, int block_n);

}  // namespace sjit::attention

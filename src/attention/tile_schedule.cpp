#include "attention/tile_schedule.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "sparsejit/error.h"
#include "templates/sparsejit/attention_params.cuh"

namespace sjit::attention {

TileSchedule build_tile_schedule(const BlockPattern& pattern, int block_m, int block_n) {
  const int bs = pattern.block_size();
  const int group_rows = std::min(bs, block_m), group_cols = std::min(bs, block_n);
  const int row_groups = block_m / group_rows, col_groups = block_n / group_cols;
  const int bits = row_groups * col_groups;  // <= 64: block sizes are >= 16 and tiles <= 128
  const std::uint64_t all_bits = bits == 64 ? ~0ull : (1ull << bits) - 1;
  const std::int64_t rows = pattern.block_rows(), cols = pattern.block_cols();

  TileSchedule s;
  s.pattern_heads = pattern.heads();
  s.q_tiles = static_cast<int>((rows * bs + block_m - 1) / block_m);
  const std::int64_t key_tiles = (cols * bs + block_n - 1) / block_n;
  const std::int64_t items = std::int64_t(s.pattern_heads) * s.q_tiles;
  s.item_tile_begin.reserve(items + 1);
  s.item_tile_begin.push_back(0);

  // Groups that lie past the last pattern row or column: "active", see the header.
  auto phantom_bits = [&](std::int64_t q_tile, std::int64_t key_tile) {
    std::uint64_t mask = 0;
    for (int rg = 0; rg < row_groups; ++rg)
      for (int cg = 0; cg < col_groups; ++cg) {
        const bool row_past = (q_tile * block_m + std::int64_t(rg) * group_rows) >= rows * bs;
        const bool col_past = (key_tile * block_n + std::int64_t(cg) * group_cols) >= cols * bs;
        if (row_past || col_past) mask |= 1ull << (rg * col_groups + cg);
      }
    return mask;
  };

  std::vector<std::pair<std::int64_t, std::uint64_t>> found;  // (key tile, bits) of one item
  for (int head = 0; head < s.pattern_heads; ++head)
    for (std::int64_t q_tile = 0; q_tile < s.q_tiles; ++q_tile) {
      found.clear();
      // Pattern rows this query tile overlaps, and the row group each one fills.
      const std::int64_t first_row = q_tile * block_m / bs;
      const std::int64_t last_row = std::min(rows - 1, (q_tile * block_m + block_m - 1) / bs);
      for (std::int64_t r = first_row; r <= last_row; ++r) {
        const int rg = bs < block_m ? static_cast<int>(r - q_tile * block_m / bs) : 0;
        for (const std::int32_t c : pattern.row(head, r)) {
          if (bs <= block_n) {
            const std::int64_t key_tile = std::int64_t(c) * bs / block_n;
            const int cg = static_cast<int>(c % col_groups);
            found.emplace_back(key_tile, 1ull << (rg * col_groups + cg));
          } else {
            for (std::int64_t t = std::int64_t(c) * bs / block_n; t < (std::int64_t(c) + 1) * bs / block_n; ++t)
              found.emplace_back(t, 1ull << (rg * col_groups));
          }
        }
      }
      std::sort(found.begin(), found.end());
      for (std::size_t i = 0; i < found.size();) {
        const std::int64_t key_tile = found[i].first;
        std::uint64_t mask = 0;
        for (; i < found.size() && found[i].first == key_tile; ++i) mask |= found[i].second;
        mask |= phantom_bits(q_tile, key_tile);
        if (key_tile >= key_tiles) continue;
        s.tile_index.push_back(static_cast<std::int32_t>(key_tile));
        s.tile_mask.push_back(mask == all_bits ? sjit_kernels::kWholeTile : mask);
      }
      if (s.tile_index.size() > 0x7fffffffu)
        throw InvalidArgument("attention: the pattern's tile schedule has more than 2^31 - 1 tiles");
      s.item_tile_begin.push_back(static_cast<std::int32_t>(s.tile_index.size()));
    }

  s.item_order.resize(items);
  std::iota(s.item_order.begin(), s.item_order.end(), 0);
  std::stable_sort(s.item_order.begin(), s.item_order.end(), [&](std::int32_t a, std::int32_t b) {
    return s.item_tile_begin[a + 1] - s.item_tile_begin[a] > s.item_tile_begin[b + 1] - s.item_tile_begin[b];
  });
  s.head_item_order = s.item_order;  // the global order, one head at a time
  std::stable_sort(s.head_item_order.begin(), s.head_item_order.end(),
                   [&](std::int32_t a, std::int32_t b) { return a / s.q_tiles < b / s.q_tiles; });
  for (std::int32_t& item : s.head_item_order) item %= s.q_tiles;
  return s;
}

std::vector<ItemTiles> active_tile_spans_each_item(const BlockPattern& pattern, int block_m, int block_n) {
  const std::int64_t bs = pattern.block_size(), rows = pattern.block_rows(), cols = pattern.block_cols();
  const std::int64_t q_tiles = (rows * bs + block_m - 1) / block_m, key_tiles = (cols * bs + block_n - 1) / block_n;
  std::vector<ItemTiles> items(std::size_t(pattern.heads() * q_tiles));
  // The last query tile that counted each key tile: a tile is counted once an item.
  std::vector<std::int64_t> counted_by(std::size_t(key_tiles), -1);
  for (int head = 0; head < pattern.heads(); ++head)
    for (std::int64_t q_tile = 0; q_tile < q_tiles; ++q_tile) {
      const std::int64_t item = std::int64_t(head) * q_tiles + q_tile;
      ItemTiles& it = items[std::size_t(item)];
      const std::int64_t last_row = std::min(rows - 1, (q_tile * block_m + block_m - 1) / bs);
      for (std::int64_t r = q_tile * block_m / bs; r <= last_row; ++r)
        for (const std::int32_t c : pattern.row(head, r))
          for (std::int64_t t = c * bs / block_n; t <= ((c + 1) * bs - 1) / block_n && t < key_tiles; ++t)
            if (counted_by[std::size_t(t)] != item) {
              counted_by[std::size_t(t)] = item;
              it.first = it.count == 0 ? std::int32_t(t) : std::min(it.first, std::int32_t(t));
              it.last = it.count == 0 ? std::int32_t(t) : std::max(it.last, std::int32_t(t));
              ++it.count;
            }
    }
  return items;
}

std::vector<std::int32_t> active_tiles_each_item(const BlockPattern& pattern, int block_m, int block_n) {
  const std::vector<ItemTiles> items = active_tile_spans_each_item(pattern, block_m, block_n);
  std::vector<std::int32_t> tiles(items.size());
  std::transform(items.begin(), items.end(), tiles.begin(), [](const ItemTiles& it) { return it.count; });
  return tiles;
}

std::int64_t count_active_tiles(const BlockPattern& pattern, int block_m, int block_n) {
  const std::vector<std::int32_t> each = active_tiles_each_item(pattern, block_m, block_n);
  return std::accumulate(each.begin(), each.end(), std::int64_t(0));
}

int uniform_item_tiles(const TileSchedule& schedule) {
  const std::vector<std::int32_t>& begin = schedule.item_tile_begin;
  if (begin.size() < 2) return 0;
  const int tiles = begin[1] - begin[0];
  for (std::size_t i = 1; i + 1 < begin.size(); ++i)
    if (begin[i + 1] - begin[i] != tiles) return 0;
  return tiles;
}

}  // namespace sjit::attention

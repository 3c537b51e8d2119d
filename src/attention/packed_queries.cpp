#include "attention/packed_queries.h"

#include "attention/tile_schedule.h"

namespace sjit::attention {

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

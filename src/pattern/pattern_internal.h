// Shared by the block pattern's files: argument checks with messages in one voice, the row-by-row BSR
// assembler the builders use, and the byte layout that both the digest and the file format hash.
#pragma once

#include <cstdint>
#include <filesystem>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "sparsejit/pattern.h"

namespace sjit::pattern_detail {

// row_ptr and col_idx hold int32: no more blocks, rows or columns than this.
inline constexpr std::int64_t kMaxIndex = std::numeric_limits<std::int32_t>::max();

// Each throws InvalidArgument "<context>: <name> = <value> ...<what is allowed>".
void check_block_size(std::string_view context, int block_size);
void check_heads(std::string_view context, int heads);
void check_block_count(std::string_view context, std::string_view name, std::int64_t blocks);  // [1, 2^31)
void check_length(std::string_view context, std::string_view name, std::int64_t elements);      // >= 1
void check_not_negative(std::string_view context, std::string_view name, std::int64_t value);
// Throws when `active_blocks` exceeds what int32 row_ptr entries can index.
void check_total_blocks(std::string_view context, std::int64_t active_blocks);

// ceil(elements / block_size): the blocks covering a sequence, checked to fit an int32 index.
std::int64_t blocks_covering(std::string_view context, std::string_view name, std::int64_t elements,
                             int block_size);

// A builder's checked shape: block size and heads valid, block_rows/block_cols covering seq_q/seq_k.
struct BlockShape {
  std::int64_t block_rows = 0, block_cols = 0;
};
BlockShape checked_shape(std::string_view context, int block_size, std::int64_t seq_q, std::int64_t seq_k, int heads);

// The XXH3-64 digest of a pattern's fields (pattern_io.cpp: the file body from block_size to col_idx).
std::uint64_t digest_of(int block_size, std::int64_t block_rows, std::int64_t block_cols, int heads,
                        const std::vector<std::int32_t>& row_ptr, const std::vector<std::int32_t>& col_idx);

// Writes `bytes` to a temporary file in `path`'s folder, synced, then renamed over `path`: readers see
// the old file or the new one whole. Throws Error "<context>: cannot save '<path>': <OS error>".
void save_whole_file(std::string_view context, const std::filesystem::path& path, std::string_view bytes);

// Assembles one head's BSR row by row (columns of a row in increasing order), then repeats it for every
// head or takes further heads' rows, and hands the arrays to BlockPattern's checking constructor.
class BsrAssembler {
 public:
  explicit BsrAssembler(std::string_view context) : context_(context) { row_ptr_.push_back(0); }

  void add(std::int64_t block_col) { col_idx_.push_back(static_cast<std::int32_t>(block_col)); }
  void add_range(std::int64_t first, std::int64_t last);  // first .. last inclusive; nothing when first > last
  void end_row();                                         // checks the running count fits int32

  // Repeats the rows assembled so far (one head's) `heads` times.
  void repeat_for_heads(int heads);

  BlockPattern finish(int block_size, std::int64_t block_rows, std::int64_t block_cols, int heads);

 private:
  std::string context_;
  std::vector<std::int32_t> row_ptr_, col_idx_;
};

}  // namespace sjit::pattern_detail

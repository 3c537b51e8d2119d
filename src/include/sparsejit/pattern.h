// Block-sparse attention patterns: which (query block, key block) tiles an attention kernel visits,
// in BSR form, with builders for the usual shapes and a checksummed file format (docs/patterns.md).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sjit {

// Where the causal diagonal sits when the query and key lengths differ (Sq queries, Sk keys):
// query i may see key j iff j <= i (top_left) or j <= i + (Sk - Sq) (bottom_right: the last query sees
// every key, as in decoding with a KV cache). With bottom_right and Sq > Sk the first Sq - Sk queries
// see no key at all.
enum class CausalAlign { top_left, bottom_right };

struct PatternStats {
  std::int64_t nnz = 0;      // active blocks over all heads
  double density = 0;        // nnz / (heads * block_rows * block_cols); 0 for an empty shape
  std::int64_t min_per_row = 0, max_per_row = 0;  // active blocks of a block row, over all heads' rows
  double mean_per_row = 0;
  std::int64_t empty_rows = 0;  // block rows (over all heads) with no active block

  friend bool operator==(const PatternStats&, const PatternStats&) = default;
};

// A block-sparse pattern over (query block, key block) in BSR (CSR of blocks) form.
// heads == 1: one pattern shared by every attention head; heads > 1: one per head. The BSR has
// heads * block_rows rows: rows of head h are h*block_rows .. h*block_rows + block_rows - 1, and
// row_ptr[row] .. row_ptr[row + 1] index the sorted, distinct active key blocks of that row in col_idx.
// Block row r covers queries r*block_size .. (r+1)*block_size - 1 (the last one may be partial: the
// pattern knows blocks, not element lengths); block column c covers keys likewise.
// A value type: copies are deep, == compares everything.
class BlockPattern {
 public:
  static constexpr std::uint32_t kFormatVersion = 1;  // of to_bytes() / save()

  BlockPattern() = default;  // empty: block_size 0, no rows, no row_ptr

  // Validates: block_size in {16, 32, 64, 128}; block_rows, block_cols in [1, 2^31); heads >= 1;
  // row_ptr.size() == heads*block_rows + 1, row_ptr[0] == 0, non-decreasing, back() == col_idx.size();
  // every column in [0, block_cols), strictly increasing within a row (sorted, no duplicates).
  // Throws InvalidArgument naming the first bad entry, its value and what is allowed.
  BlockPattern(int block_size, std::int64_t block_rows, std::int64_t block_cols, int heads,
               std::vector<std::int32_t> row_ptr, std::vector<std::int32_t> col_idx);

  static bool is_supported_block_size(int block_size);  // 16, 32, 64 or 128

  int block_size() const { return block_size_; }
  std::int64_t block_rows() const { return block_rows_; }  // per head
  std::int64_t block_cols() const { return block_cols_; }
  int heads() const { return heads_; }
  std::span<const std::int32_t> row_ptr() const { return row_ptr_; }
  std::span<const std::int32_t> col_idx() const { return col_idx_; }
  std::int64_t nnz() const { return static_cast<std::int64_t>(col_idx_.size()); }

  // The BSR row of (head, block_row): head * block_rows + block_row. Throws InvalidArgument when head
  // is not in [0, heads) or block_row not in [0, block_rows) (a 1-head pattern has head 0 only).
  std::int64_t row_index(int head, std::int64_t block_row) const;
  std::span<const std::int32_t> row(int head, std::int64_t block_row) const;  // its active key blocks
  // Binary search in the row; throws InvalidArgument for a block_col outside [0, block_cols) too.
  bool active(int head, std::int64_t block_row, std::int64_t block_col) const;

  // Dense block mask, row-major [heads][block_rows][block_cols], nonzero = active; and back.
  // from_block_mask checks mask.size() == heads * block_rows * block_cols.
  static BlockPattern from_block_mask(int block_size, int heads, std::int64_t block_rows, std::int64_t block_cols,
                                      std::span<const std::uint8_t> mask);
  std::vector<std::uint8_t> to_block_mask() const;

  PatternStats stats() const;

  // Rows are key blocks and columns query blocks, per head (same block size and heads): the pattern a
  // backward pass for dK/dV walks.
  BlockPattern transposed() const;

  // XXH3-64 of block_size, block_rows, block_cols, heads, nnz, row_ptr and col_idx as laid out in the
  // file format (little-endian, from block_size up to the checksum): equal patterns have equal digests
  // on every machine. Computed once at construction, so it is free to call per launch.
  std::uint64_t digest() const { return digest_; }

  // Binary format (docs/patterns.md): magic "SJITBSR\0", u32 version = 1, u32 block_size,
  // i64 block_rows, i64 block_cols, u32 heads, i64 nnz, i32 row_ptr[heads*block_rows + 1],
  // i32 col_idx[nnz], u64 XXH3-64 of every byte before it; little-endian, no padding.
  std::string to_bytes() const;
  // Checks magic, version, that the length matches the header (before allocating anything), the
  // checksum, then the BSR itself; throws InvalidArgument saying which.
  static BlockPattern from_bytes(std::string_view bytes);
  // Writes a temporary file in the same folder and renames it over `path`: readers see the old file or
  // the new one whole. Throws sjit::Error naming the path and the OS error if it cannot.
  void save(const std::filesystem::path& path) const;
  // from_bytes() of the file's content, the messages naming the file. A missing or unreadable file
  // throws InvalidArgument with the OS error.
  static BlockPattern load(const std::filesystem::path& path);

  // Digest first: unequal patterns are usually told apart without comparing the arrays.
  friend bool operator==(const BlockPattern&, const BlockPattern&) = default;

 private:
  // The public constructor with `context` ("pattern", "pattern file 'x.bsr'") leading its messages.
  BlockPattern(std::string_view context, int block_size, std::int64_t block_rows, std::int64_t block_cols,
               int heads, std::vector<std::int32_t> row_ptr, std::vector<std::int32_t> col_idx);
  static BlockPattern decode(std::string_view bytes, std::string_view context);
  static std::uint64_t empty_digest();

  std::uint64_t digest_ = empty_digest();
  int block_size_ = 0;
  std::int64_t block_rows_ = 0;
  std::int64_t block_cols_ = 0;
  int heads_ = 0;
  std::vector<std::int32_t> row_ptr_;
  std::vector<std::int32_t> col_idx_;
};

// Builders. Lengths are in elements so that partial last blocks and bottom-right alignment are exact:
// block_rows = ceil(seq_q / block_size), block_cols = ceil(seq_k / block_size); query block r covers
// queries [r*bs, min((r+1)*bs, seq_q)), key block c keys [c*bs, min((c+1)*bs, seq_k)).
// With heads > 1, the deterministic builders repeat the same pattern for every head; bigbird and random
// draw each head's random blocks afresh. Random choices use std::mt19937_64(seed) and no std::
// distribution, so a seed gives the same pattern with every standard library.
// Every builder throws InvalidArgument for a block size other than 16/32/64/128, a length below 1,
// heads below 1, or more than 2^31 - 1 active blocks in all.
namespace patterns {

// Every key block for every query block.
BlockPattern dense(int block_size, std::int64_t seq_q, std::int64_t seq_k, int heads = 1);

// The blocks a causal mask touches: key block c is active in query block row r iff some query i and key j
// of the tile have j <= i + offset (offset 0 for top_left, seq_k - seq_q for bottom_right), that is
// iff c*bs <= min((r+1)*bs, seq_q) - 1 + offset. Diagonal tiles are partly masked: the kernel still
// applies the element rule there. Rows can be empty (bottom_right with seq_q > seq_k).
BlockPattern causal(int block_size, std::int64_t seq_q, std::int64_t seq_k,
                    CausalAlign align = CausalAlign::top_left, int heads = 1);

// Key blocks r - blocks_before .. r + blocks_after of query block row r, clipped to [0, block_cols):
// a band around the block diagonal aligned top-left. Both counts >= 0.
BlockPattern sliding_window(int block_size, std::int64_t seq_q, std::int64_t seq_k, std::int64_t blocks_before,
                            std::int64_t blocks_after, int heads = 1);

// BigBird-like (Zaheer et al. 2020, "Big Bird: Transformers for Longer Sequences", Sec. 2): row r has
// the local window |c - r| <= local_blocks, the global key blocks c < global_blocks, every key block when
// r < global_blocks, plus random_blocks key blocks drawn uniformly among those not already active (all
// of them if fewer remain). All counts >= 0.
BlockPattern bigbird(int block_size, std::int64_t seq_q, std::int64_t seq_k, int local_blocks, int global_blocks,
                     int random_blocks, std::uint64_t seed, int heads = 1);

// Benchmark pattern: every row has k = round(density * block_cols) active blocks (half away from zero),
// at least 1 when density > 0, none when density == 0: its diagonal block r (when r < block_cols) plus
// k - 1 others drawn uniformly (k when the row has no diagonal). density in [0, 1].
BlockPattern random(int block_size, std::int64_t seq_q, std::int64_t seq_k, double density, std::uint64_t seed,
                    int heads = 1);

// From a graph's adjacency: nodes are sequence positions, edge (i, j) means query i attends key j
// (0 <= i < seq_q, 0 <= j < seq_k; repeated edges count again). Counts the edges of every block pair
// and keeps, per block row, the top_k pairs by count (ties: smaller column first) that have at least
// one edge. top_k >= 1.
BlockPattern from_graph(int block_size, std::int64_t seq_q, std::int64_t seq_k,
                        std::span<const std::pair<std::int64_t, std::int64_t>> edges, int top_k, int heads = 1);

// Learned patterns: which tiles a row keeps, by a score per tile (higher is more important).
struct BlockSelection {
  std::int64_t top_k = 0;   // at most this many tiles a row (0: no cap)
  double mass = 1.0;        // below 1: the fewest tiles, best first, whose scores reach this share of
                            // the row's total (scores >= 0, as attention mass is); 1: no such stop
  bool diagonal = true;     // keep tile (r, r) of every row that has one, first (it counts toward both)
};

// From scores [heads][block_rows][block_cols], row-major: attention mass per tile measured on sample
// inputs, pooled q . k, a gradient's norm. Each row takes its tiles in order of score (ties: the smaller
// column), the diagonal first where asked, while fewer than top_k are taken (top_k > 0) and, with mass
// < 1, while their scores sum to less than mass x the row's total and the next scores above 0. Throws
// InvalidArgument naming the first bad score (NaN or infinite; negative where mass < 1) by head, row and
// column, a wrong count of scores, top_k < 0, mass outside (0, 1], or top_k 0 with mass 1 (every tile).
BlockPattern from_scores(int block_size, std::int64_t seq_q, std::int64_t seq_k, std::span<const float> scores,
                         const BlockSelection& keep, int heads = 1);

// From a function of blocks, as FlexAttention's block masks come from one: tile (r, c) of head h is
// active iff active(h, r, c). It is called once a tile, heads x block_rows x block_cols times, head by
// head, row by row, columns in order; what it throws passes through.
BlockPattern from_predicate(int block_size, std::int64_t seq_q, std::int64_t seq_k,
                            const std::function<bool(int head, std::int64_t q_block, std::int64_t k_block)>& active,
                            int heads = 1);

// Tiles active in a or in b (united), in both (intersected): a causal sliding window, a window with
// global blocks, one head's learned blocks beside a shared band. Both patterns need the same block
// size, block rows and block columns, and the same heads, or one of them a single head (shared by every
// head of the other); the result has the larger count of heads. Throws InvalidArgument naming what
// differs.
BlockPattern united(const BlockPattern& a, const BlockPattern& b);
BlockPattern intersected(const BlockPattern& a, const BlockPattern& b);

}  // namespace patterns
}  // namespace sjit

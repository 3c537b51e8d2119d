// Argument checks shared by the block pattern's constructor, builders and decoder: one message shape,
// "<context>: <name> = <value> <what is wrong>: <what is allowed>".
#include <fmt/format.h>

#include "pattern/pattern_internal.h"
#include "sparsejit/error.h"

namespace sjit::pattern_detail {

void check_block_size(std::string_view context, int block_size) {
  if (!BlockPattern::is_supported_block_size(block_size))
    throw InvalidArgument(
        fmt::format("{}: block_size = {} is not supported: allowed 16, 32, 64, 128", context, block_size));
}

void check_heads(std::string_view context, int heads) {
  if (heads < 1) throw InvalidArgument(fmt::format("{}: heads = {} must be at least 1", context, heads));
}

void check_block_count(std::string_view context, std::string_view name, std::int64_t blocks) {
  if (blocks < 1 || blocks > kMaxIndex)
    throw InvalidArgument(
        fmt::format("{}: {} = {} is out of range: allowed 1 .. {}", context, name, blocks, kMaxIndex));
}

void check_length(std::string_view context, std::string_view name, std::int64_t elements) {
  if (elements < 1)
    throw InvalidArgument(
        fmt::format("{}: {} = {} must be at least 1 (a length in elements)", context, name, elements));
}

void check_not_negative(std::string_view context, std::string_view name, std::int64_t value) {
  if (value < 0) throw InvalidArgument(fmt::format("{}: {} = {} must not be negative", context, name, value));
}

void check_total_blocks(std::string_view context, std::int64_t active_blocks) {
  if (active_blocks > kMaxIndex)
    throw InvalidArgument(fmt::format(
        "{}: the pattern would have {} or more active blocks: at most {} fit its int32 row_ptr", context,
        active_blocks, kMaxIndex));
}

std::int64_t blocks_covering(std::string_view context, std::string_view name, std::int64_t elements,
                             int block_size) {
  check_length(context, name, elements);
  const std::int64_t blocks = (elements - 1) / block_size + 1;
  if (blocks > kMaxIndex)
    throw InvalidArgument(fmt::format("{}: {} = {} makes {} blocks of {}: at most {} blocks are allowed", context,
                                      name, elements, blocks, block_size, kMaxIndex));
  return blocks;
}

BlockShape checked_shape(std::string_view context, int block_size, std::int64_t seq_q, std::int64_t seq_k,
                         int heads) {
  check_block_size(context, block_size);
  check_heads(context, heads);
  return {blocks_covering(context, "seq_q", seq_q, block_size), blocks_covering(context, "seq_k", seq_k, block_size)};
}

}  // namespace sjit::pattern_detail

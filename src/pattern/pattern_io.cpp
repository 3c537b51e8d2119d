// The block pattern's byte layout: its digest, to_bytes/from_bytes, and files written by rename.
//
//   offset  type          field
//        0  char[8]       magic "SJITBSR\0"
//        8  u32           version = 1
//       12  u32           block_size          <- the digest covers from here ...
//       16  i64           block_rows
//       24  i64           block_cols
//       32  u32           heads
//       36  i64           nnz
//       44  i32[R + 1]    row_ptr, R = heads * block_rows
//           i32[nnz]      col_idx              <- ... to here
//           u64           XXH3-64 of every byte before it
// All little-endian, no padding.
#include <xxhash.h>

#include <fmt/format.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>

#include "cache/atomic_file.h"
#include "pattern/pattern_internal.h"
#include "sparsejit/error.h"
#include "sparsejit/pattern.h"

namespace sjit {

namespace fs = std::filesystem;
using namespace pattern_detail;

namespace {

constexpr std::string_view kMagic{"SJITBSR\0", 8};
constexpr std::size_t kBodyOffset = 12;                // magic + version
constexpr std::size_t kHeaderBytes = 44;               // up to row_ptr
constexpr std::size_t kChecksumBytes = 8;
constexpr std::size_t kSmallestFile = kHeaderBytes + 4 + kChecksumBytes;  // one row_ptr entry at least

template <class T>
void put(std::string& out, T value) {
  using U = std::make_unsigned_t<T>;
  U bits = static_cast<U>(value);
  for (std::size_t i = 0; i < sizeof(T); ++i, bits >>= 8) out.push_back(static_cast<char>(bits & 0xff));
}

template <class T>
T get(std::string_view bytes, std::size_t offset) {
  using U = std::make_unsigned_t<T>;
  U bits = 0;
  for (std::size_t i = sizeof(T); i-- > 0;) bits = (bits << 8) | static_cast<unsigned char>(bytes[offset + i]);
  return static_cast<T>(bits);
}

void put_array(std::string& out, const std::vector<std::int32_t>& values) {
  if constexpr (std::endian::native == std::endian::little) {
    out.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(std::int32_t));
  } else {
    for (std::int32_t v : values) put(out, v);
  }
}

std::vector<std::int32_t> get_array(std::string_view bytes, std::size_t offset, std::size_t count) {
  std::vector<std::int32_t> values(count);
  if constexpr (std::endian::native == std::endian::little) {
    if (count > 0) std::memcpy(values.data(), bytes.data() + offset, count * sizeof(std::int32_t));  // (null when empty)
  } else {
    for (std::size_t i = 0; i < count; ++i) values[i] = get<std::int32_t>(bytes, offset + 4 * i);
  }
  return values;
}

// block_size .. nnz: the part of the body before the arrays.
std::string body_header(int block_size, std::int64_t block_rows, std::int64_t block_cols, int heads,
                        std::int64_t nnz) {
  std::string out;
  put(out, static_cast<std::uint32_t>(block_size));
  put(out, block_rows);
  put(out, block_cols);
  put(out, static_cast<std::uint32_t>(heads));
  put(out, nnz);
  return out;
}

using Xxh3State = std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)>;

}  // namespace

namespace pattern_detail {

std::uint64_t digest_of(int block_size, std::int64_t block_rows, std::int64_t block_cols, int heads,
                        const std::vector<std::int32_t>& row_ptr, const std::vector<std::int32_t>& col_idx) {
  // Streamed so that a large pattern is hashed in place, not copied into its byte form first.
  Xxh3State state(XXH3_createState(), &XXH3_freeState);
  if (!state || XXH3_64bits_reset(state.get()) != XXH_OK) throw std::bad_alloc();
  const std::string header =
      body_header(block_size, block_rows, block_cols, heads, static_cast<std::int64_t>(col_idx.size()));
  XXH3_64bits_update(state.get(), header.data(), header.size());
  for (const std::vector<std::int32_t>* array : {&row_ptr, &col_idx}) {
    if constexpr (std::endian::native == std::endian::little) {
      XXH3_64bits_update(state.get(), array->data(), array->size() * sizeof(std::int32_t));
    } else {
      std::string bytes;
      put_array(bytes, *array);
      XXH3_64bits_update(state.get(), bytes.data(), bytes.size());
    }
  }
  return XXH3_64bits_digest(state.get());
}

}  // namespace pattern_detail

std::string BlockPattern::to_bytes() const {
  if (block_size_ == 0)
    throw InvalidArgument("pattern: the empty pattern (default-constructed, block_size 0) has no byte form");
  std::string out;
  out.reserve(kHeaderBytes + 4 * (row_ptr_.size() + col_idx_.size()) + kChecksumBytes);
  out.append(kMagic);
  put(out, kFormatVersion);
  out += body_header(block_size_, block_rows_, block_cols_, heads_, nnz());
  put_array(out, row_ptr_);
  put_array(out, col_idx_);
  put(out, static_cast<std::uint64_t>(XXH3_64bits(out.data(), out.size())));
  return out;
}

BlockPattern BlockPattern::decode(std::string_view bytes, std::string_view context) {
  if (bytes.size() < kMagic.size() || bytes.substr(0, kMagic.size()) != kMagic)
    throw InvalidArgument(fmt::format(
        "{}: not a sparsejit block pattern: it does not start with the magic \"SJITBSR\\0\" ({} bytes)", context,
        bytes.size()));
  if (bytes.size() < kBodyOffset)
    throw InvalidArgument(fmt::format("{}: truncated: {} bytes end inside the header", context, bytes.size()));
  const auto version = get<std::uint32_t>(bytes, 8);
  if (version != kFormatVersion)
    throw InvalidArgument(fmt::format("{}: format version {} is not supported: this build reads version {}", context,
                                      version, kFormatVersion));
  if (bytes.size() < kSmallestFile)
    throw InvalidArgument(fmt::format("{}: truncated: {} bytes, but a version {} pattern takes at least {}", context,
                                      bytes.size(), kFormatVersion, kSmallestFile));

  // The header's sizes, checked against the length before anything is allocated from them.
  const auto block_size = get<std::uint32_t>(bytes, 12);
  const auto block_rows = get<std::int64_t>(bytes, 16);
  const auto block_cols = get<std::int64_t>(bytes, 24);
  const auto heads = get<std::uint32_t>(bytes, 32);
  const auto nnz = get<std::int64_t>(bytes, 36);
  check_block_count(context, "block_rows", block_rows);
  check_block_count(context, "block_cols", block_cols);
  if (heads < 1 || heads > kMaxIndex)
    throw InvalidArgument(fmt::format("{}: heads = {} is out of range: allowed 1 .. {}", context, heads, kMaxIndex));
  if (nnz < 0 || nnz > kMaxIndex)
    throw InvalidArgument(fmt::format("{}: nnz = {} is out of range: allowed 0 .. {}", context, nnz, kMaxIndex));
  // Every term is below 2^62 and the sum below 2^64: no overflow in u64.
  const std::uint64_t rows = static_cast<std::uint64_t>(heads) * static_cast<std::uint64_t>(block_rows);
  const std::uint64_t expected_bytes =
      kHeaderBytes + 4 * (rows + 1) + 4 * static_cast<std::uint64_t>(nnz) + kChecksumBytes;
  if (expected_bytes != bytes.size())
    throw InvalidArgument(fmt::format(
        "{}: {} bytes, but its header (heads = {}, block_rows = {}, nnz = {}) makes a pattern of {} bytes: the data "
        "is truncated or corrupt",
        context, bytes.size(), heads, block_rows, nnz, expected_bytes));

  const std::size_t checksum_at = bytes.size() - kChecksumBytes;
  const auto stored = get<std::uint64_t>(bytes, checksum_at);
  const auto computed = static_cast<std::uint64_t>(XXH3_64bits(bytes.data(), checksum_at));
  if (stored != computed)
    throw InvalidArgument(fmt::format(
        "{}: checksum mismatch (stored {:016x}, computed {:016x} over the first {} bytes): the data is corrupt",
        context, stored, computed, checksum_at));

  if (block_size > 128 || !is_supported_block_size(static_cast<int>(block_size)))
    throw InvalidArgument(
        fmt::format("{}: block_size = {} is not supported: allowed 16, 32, 64, 128", context, block_size));
  std::vector<std::int32_t> row_ptr = get_array(bytes, kHeaderBytes, rows + 1);
  std::vector<std::int32_t> col_idx = get_array(bytes, kHeaderBytes + 4 * (rows + 1), nnz);
  return BlockPattern(context, static_cast<int>(block_size), block_rows, block_cols, static_cast<int>(heads),
                      std::move(row_ptr), std::move(col_idx));
}

BlockPattern BlockPattern::from_bytes(std::string_view bytes) { return decode(bytes, "pattern bytes"); }

void pattern_detail::save_whole_file(std::string_view context, const fs::path& path, std::string_view bytes) {
  try {
    cache::TemporaryFile file(path, 0644);
    file.write(bytes);
    file.sync();
    file.publish();
  } catch (const cache::FileError& e) {
    throw Error(fmt::format("{}: cannot save '{}': {}", context, path.string(), e.what()));
  }
}

void BlockPattern::save(const fs::path& path) const { pattern_detail::save_whole_file("pattern", path, to_bytes()); }

BlockPattern BlockPattern::load(const fs::path& path) {
  const std::string context = fmt::format("pattern file '{}'", path.string());
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  if (error) throw InvalidArgument(fmt::format("{}: cannot open: {}", context, error.message()));
  if (!fs::is_regular_file(status)) throw InvalidArgument(fmt::format("{}: not a regular file", context));

  std::ifstream in(path, std::ios::binary);
  if (!in) throw InvalidArgument(fmt::format("{}: cannot open: {}", context, std::strerror(errno)));
  // The file's real size bounds the allocation, whatever its header claims.
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  in.seekg(0, std::ios::beg);
  if (size < 0) throw InvalidArgument(fmt::format("{}: cannot determine its size", context));
  std::string bytes(static_cast<std::size_t>(size), '\0');
  if (!in.read(bytes.data(), size))
    throw InvalidArgument(fmt::format("{}: cannot read {} bytes: {}", context, size, std::strerror(errno)));
  return decode(bytes, context);
}

}  // namespace sjit

// Pictures of block-sparse patterns: the gray raster, the text picture, and PNG files (libpng, where
// the build found it). Rules are stated in sparsejit/pattern_picture.h.
#include "sparsejit/pattern_picture.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>

#if SJIT_HAVE_PNG
#include <png.h>
#endif

#include "pattern/pattern_internal.h"
#include "sparsejit/error.h"

namespace sjit {

namespace {

constexpr int kHeadsPerRow = 8;
constexpr int kGap = 8;                  // white pixels between heads, and around them
constexpr std::uint8_t kFrame = 96;      // a head's frame
constexpr std::uint8_t kBackground = 255;
constexpr float kSparsestCell = 200;     // a cell with any active block is at most this light

void check_picture_args(std::string_view context, const BlockPattern& pattern, int head) {
  if (pattern.block_size() == 0)
    throw InvalidArgument(fmt::format("{}: the pattern is empty (default-constructed): nothing to draw", context));
  if (head < -1 || head >= pattern.heads())
    throw InvalidArgument(fmt::format("{}: head = {} is not in [0, {}) (the pattern's heads), nor -1 (every head)",
                                      context, head, pattern.heads()));
}

// Cells of `cell` x `cell` blocks, as few blocks a side as keep the longer side within `max_cells`
// cells: ceil(rows / cell) x ceil(cols / cell) of them.
struct CellGrid {
  std::int64_t cell, rows, cols;
};
CellGrid cell_grid(const BlockPattern& pattern, std::int64_t max_cells) {
  const std::int64_t cell = (std::max(pattern.block_rows(), pattern.block_cols()) + max_cells - 1) / max_cells;
  return {cell, (pattern.block_rows() + cell - 1) / cell, (pattern.block_cols() + cell - 1) / cell};
}

// A head's block mask averaged into the cells of `grid`: the share of each cell's blocks that are
// active, row-major.
std::vector<float> cell_shares(const BlockPattern& pattern, int head, const CellGrid& grid) {
  const std::int64_t cell = grid.cell, cell_rows = grid.rows, cell_cols = grid.cols;
  std::vector<std::int64_t> active(std::size_t(cell_rows * cell_cols), 0);
  for (std::int64_t r = 0; r < pattern.block_rows(); ++r)
    for (const std::int32_t c : pattern.row(head, r)) ++active[std::size_t(r / cell * cell_cols + c / cell)];
  std::vector<float> share(active.size());
  for (std::int64_t y = 0; y < cell_rows; ++y)
    for (std::int64_t x = 0; x < cell_cols; ++x) {
      // (The last row and column of cells may hold fewer blocks.)
      const std::int64_t blocks = (std::min(pattern.block_rows(), (y + 1) * cell) - y * cell) *
                                  (std::min(pattern.block_cols(), (x + 1) * cell) - x * cell);
      share[std::size_t(y * cell_cols + x)] = float(active[std::size_t(y * cell_cols + x)]) / float(blocks);
    }
  return share;
}

}  // namespace

std::uint8_t cell_gray(float share) {
  return share <= 0.0f ? 255 : std::uint8_t(kSparsestCell * (1.0f - std::min(share, 1.0f)) + 0.5f);
}

PatternPicture draw(const BlockPattern& pattern, const PictureOptions& options) {
  constexpr std::string_view context = "draw(pattern)";
  check_picture_args(context, pattern, options.head);
  if (options.max_side < 1 || options.min_side < 1)
    throw InvalidArgument(fmt::format("{}: max_side = {} and min_side = {} must be at least 1", context,
                                      options.max_side, options.min_side));
  const CellGrid grid = cell_grid(pattern, options.max_side);
  const std::int64_t cell_rows = grid.rows, cell_cols = grid.cols;
  PatternPicture picture;
  picture.blocks_per_cell = int(grid.cell);
  const std::int64_t cells_longest = std::max(cell_rows, cell_cols);
  const std::int64_t most_pixels = std::max<std::int64_t>(1, options.max_side / cells_longest);
  picture.pixels_per_cell = int(std::clamp<std::int64_t>(options.min_side / cells_longest, 1, most_pixels));
  const int pixels = picture.pixels_per_cell;

  // Heads in a grid, each inside a one-pixel frame, kGap white pixels around and between them.
  const int first = options.head < 0 ? 0 : options.head;
  const int count = options.head < 0 ? pattern.heads() : 1;
  const int grid_cols = std::min(count, kHeadsPerRow), grid_rows = (count + kHeadsPerRow - 1) / kHeadsPerRow;
  const std::int64_t head_width = cell_cols * pixels + 2, head_height = cell_rows * pixels + 2;
  const std::int64_t width = kGap + grid_cols * (head_width + kGap), height = kGap + grid_rows * (head_height + kGap);
  if (width * height > (std::int64_t{1} << 31))
    throw InvalidArgument(fmt::format("{}: the picture would be {} x {} pixels: give a smaller max_side (now {})",
                                      context, width, height, options.max_side));
  picture.width = int(width), picture.height = int(height);
  picture.gray.assign(std::size_t(width * height), kBackground);
  for (int i = 0; i < count; ++i) {
    const std::int64_t left = kGap + (i % kHeadsPerRow) * (head_width + kGap);
    const std::int64_t top = kGap + (i / kHeadsPerRow) * (head_height + kGap);
    // Pixel (x, y) of this head's frame: (0, 0) its top left corner, its cells from (1, 1).
    auto pixel = [&](std::int64_t x, std::int64_t y) -> std::uint8_t& {
      return picture.gray[std::size_t((top + y) * width + left + x)];
    };
    for (std::int64_t x = 0; x < head_width; ++x) pixel(x, 0) = pixel(x, head_height - 1) = kFrame;
    for (std::int64_t y = 0; y < head_height; ++y) pixel(0, y) = pixel(head_width - 1, y) = kFrame;
    const std::vector<float> share = cell_shares(pattern, first + i, grid);
    for (std::int64_t y = 0; y < cell_rows * pixels; ++y)
      for (std::int64_t x = 0; x < cell_cols * pixels; ++x)
        pixel(1 + x, 1 + y) = cell_gray(share[std::size_t(y / pixels * cell_cols + x / pixels)]);
  }
  return picture;
}

std::string draw_text(const BlockPattern& pattern, int head, int max_cols) {
  constexpr std::string_view context = "draw_text(pattern)";
  check_picture_args(context, pattern, head);
  if (head < 0) throw InvalidArgument(fmt::format("{}: head = -1: a text picture shows one head", context));
  if (max_cols < 1) throw InvalidArgument(fmt::format("{}: max_cols = {} must be at least 1", context, max_cols));
  const CellGrid grid = cell_grid(pattern, max_cols);
  const std::int64_t cell_rows = grid.rows, cell_cols = grid.cols;
  const std::vector<float> share = cell_shares(pattern, head, grid);
  std::string text;
  for (std::int64_t y = 0; y < cell_rows; ++y) {
    for (std::int64_t x = 0; x < cell_cols; ++x) {
      const float s = share[std::size_t(y * cell_cols + x)];
      text += s == 1.0f ? '#' : s > 0.0f ? '+' : '.';
    }
    text += '\n';
  }
  return text;
}

bool png_support() { return SJIT_HAVE_PNG != 0; }

void save_png(const PatternPicture& picture, const std::filesystem::path& path) {
  if (picture.width < 1 || picture.height < 1 ||
      picture.gray.size() != std::size_t(picture.width) * std::size_t(picture.height))
    throw InvalidArgument(fmt::format("save_png('{}'): the picture is {} x {} pixels with {} values: draw() one first",
                                      path.string(), picture.width, picture.height, picture.gray.size()));
#if SJIT_HAVE_PNG
  // Encoded in memory first, so that the file is written (and renamed over `path`) whole.
  std::string bytes;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png ? png_create_info_struct(png) : nullptr;
  if (!info) {
    png_destroy_write_struct(&png, nullptr);
    throw Error(fmt::format("save_png('{}'): libpng could not start (out of memory)", path.string()));
  }
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    throw Error(fmt::format("save_png('{}'): libpng failed to encode the picture", path.string()));
  }
  png_set_write_fn(
      png, &bytes,
      [](png_structp p, png_bytep data, png_size_t length) {
        static_cast<std::string*>(png_get_io_ptr(p))->append(reinterpret_cast<const char*>(data), length);
      },
      nullptr);
  png_set_IHDR(png, info, png_uint_32(picture.width), png_uint_32(picture.height), 8, PNG_COLOR_TYPE_GRAY,
               PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  for (int y = 0; y < picture.height; ++y)
    png_write_row(png, picture.gray.data() + std::size_t(y) * std::size_t(picture.width));
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  pattern_detail::save_whole_file("save_png", path, bytes);
#else
  throw Error(fmt::format("save_png('{}'): this build of sparsejit has no libpng (install libpng-dev and build "
                          "again); draw() gives the picture's pixels",
                          path.string()));
#endif
}

}  // namespace sjit

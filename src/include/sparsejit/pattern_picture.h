// Pictures of block-sparse patterns: a grayscale raster of every head's block mask (active blocks
// black), a text picture for a terminal, and the raster as a PNG file (docs/patterns.md, "Pictures").
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "sparsejit/pattern.h"

namespace sjit {

struct PictureOptions {
  int head = -1;         // the head to draw; -1 draws every head, side by side, 8 to a row
  int max_side = 2048;   // pixels a head's side may take at most: larger patterns average blocks into
                         // cells of several blocks a side, each shaded by the share of its blocks active
  int min_side = 512;    // small patterns are scaled up, whole pixels a block, to about this many
};

// Row-major 8-bit gray: a cell is cell_gray(its share of active blocks), so 0 (black) where every
// block is active, 255 (white) where none is, and a cell with any active block at most 200, so that
// scattered blocks stay visible. Each head sits in a one-pixel gray (96) frame, the heads 8 to a row
// with 8 white pixels around and between them: head i's first cell pixel is at x = 8 + (i % 8) *
// (frame width + 8) + 1, y = 8 + (i / 8) * (frame height + 8) + 1, the frame being the head's cells'
// pixels plus 2 each way.
struct PatternPicture {
  int width = 0, height = 0;
  std::vector<std::uint8_t> gray;  // width * height
  int blocks_per_cell = 1;         // blocks a cell's side holds (1: every block its own cell)
  int pixels_per_cell = 1;         // pixels a cell's side takes
};

// 255 for a share of 0, else round(200 * (1 - share)).
std::uint8_t cell_gray(float share);

// Throws InvalidArgument for an empty pattern, a head outside [-1, heads), or sides below 1.
PatternPicture draw(const BlockPattern& pattern, const PictureOptions& options = {});

// One head in at most `max_cols` characters a line: '#' where every block of a cell is active, '+'
// where some are, '.' where none is; a line a cell row. Throws as draw() does.
std::string draw_text(const BlockPattern& pattern, int head = 0, int max_cols = 64);

// Writes `picture` as an 8-bit grayscale PNG (libpng): a temporary file in the same folder, renamed
// over `path`. Throws Error naming the path and the cause, or saying that this build of sparsejit has
// no libpng (png_support() is false).
void save_png(const PatternPicture& picture, const std::filesystem::path& path);
bool png_support();

}  // namespace sjit

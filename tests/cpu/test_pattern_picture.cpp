// Pictures of patterns: the raster against the block mask (cells, shades, the heads' grid), the text
// picture, PNG files read back with libpng, and `sjit pattern build | show | draw`.
#include <catch2/catch.hpp>

#include <bit>
#include <cstdint>
#include <fstream>
#include <random>
#include <sstream>

#if SJIT_HAVE_PNG
#include <png.h>
#endif

#include "sparsejit/error.h"
#include "sparsejit/pattern.h"
#include "sparsejit/pattern_picture.h"
#include "support/run_tool.h"
#include "support/temp_dir.h"
#include "support/test_support.h"

using namespace sjit;
using Catch::Matchers::Contains;

namespace {

constexpr int kGap = 8;  // the documented layout: white pixels around and between heads

// The pixel of cell (y, x) of head i, for a picture whose heads' cells take `cell_w` x `cell_h` pixels
// in all.
std::uint8_t cell_pixel(const PatternPicture& p, int head, std::int64_t y, std::int64_t x, std::int64_t cell_w,
                        std::int64_t cell_h) {
  const std::int64_t left = kGap + (head % 8) * (cell_w + 2 + kGap) + 1;
  const std::int64_t top = kGap + (head / 8) * (cell_h + 2 + kGap) + 1;
  return p.gray[std::size_t((top + y) * p.width + left + x)];
}

}  // namespace

TEST_CASE("draw: every block its own cell, black where active, white where not, heads in a grid", "[pattern]") {
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  const int heads = 10;  // two rows of heads
  const BlockPattern p = patterns::random(32, 37 * 32, 23 * 32, 0.3, seed, heads);
  const PatternPicture picture = draw(p);
  REQUIRE(picture.blocks_per_cell == 1);
  const int px = picture.pixels_per_cell;
  CHECK(px == 512 / 37);  // scaled up to about min_side
  const std::int64_t cell_w = 23 * px, cell_h = 37 * px;
  REQUIRE(picture.width == kGap + 8 * (cell_w + 2 + kGap));
  REQUIRE(picture.height == kGap + 2 * (cell_h + 2 + kGap));
  for (int h = 0; h < heads; ++h)
    for (std::int64_t r = 0; r < 37; ++r)
      for (std::int64_t c = 0; c < 23; ++c)
        for (const int corner : {0, px - 1}) {
          INFO("head " << h << ", block (" << r << ", " << c << ")");
          REQUIRE(cell_pixel(picture, h, r * px + corner, c * px + corner, cell_w, cell_h) ==
                  (p.active(h, r, c) ? 0 : 255));
        }
  // The frame around head 3, and the gap beside it.
  CHECK(cell_pixel(picture, 3, -1, 0, cell_w, cell_h) == 96);
  CHECK(cell_pixel(picture, 3, 0, cell_w, cell_w, cell_h) == 96);
  CHECK(cell_pixel(picture, 3, 0, cell_w + 1, cell_w, cell_h) == 255);
  // One head alone.
  const PatternPicture one = draw(p, {.head = 7});
  CHECK(one.width == kGap + cell_w + 2 + kGap);
  for (std::int64_t r = 0; r < 37; ++r)
    for (std::int64_t c = 0; c < 23; ++c)
      REQUIRE(cell_pixel(one, 0, r * px, c * px, cell_w, cell_h) == (p.active(7, r, c) ? 0 : 255));
}

TEST_CASE("draw: large patterns average blocks into cells, shaded by the share active", "[pattern]") {
  // 40 x 40 blocks with max_side 10: cells of 4 x 4 blocks. Cell (y, x) gets y * 10 + x mod 17 of its 16
  // blocks active, so every share from 0 to 1 shows up.
  std::vector<std::uint8_t> mask(40 * 40, 0);
  for (int y = 0; y < 10; ++y)
    for (int x = 0; x < 10; ++x)
      for (int k = 0; k < (y * 10 + x) % 17; ++k) mask[std::size_t((y * 4 + k / 4) * 40 + x * 4 + k % 4)] = 1;
  const BlockPattern p = BlockPattern::from_block_mask(16, 1, 40, 40, mask);
  const PatternPicture picture = draw(p, {.max_side = 10, .min_side = 1});
  REQUIRE(picture.blocks_per_cell == 4);
  REQUIRE(picture.pixels_per_cell == 1);
  for (int y = 0; y < 10; ++y)
    for (int x = 0; x < 10; ++x) {
      const int active = (y * 10 + x) % 17;
      INFO("cell (" << y << ", " << x << "), " << active << " of 16 blocks active");
      REQUIRE(cell_pixel(picture, 0, y, x, 10, 10) == cell_gray(float(active) / 16));
    }
  CHECK(cell_gray(0) == 255);
  CHECK(cell_gray(1) == 0);
  CHECK(cell_gray(1.0f / 16) == 188);  // round(200 * 15 / 16): a lone block stays visible
  // A partial last cell counts only its blocks: 41 x 41 blocks, the last cell one block wide.
  const BlockPattern odd = patterns::from_predicate(
      16, 41 * 16, 41 * 16, [](int, std::int64_t r, std::int64_t c) { return r == 40 && c == 40; });
  const PatternPicture odd_picture = draw(odd, {.max_side = 10, .min_side = 1});
  REQUIRE(odd_picture.blocks_per_cell == 5);  // ceil(41 / 10)
  CHECK(cell_pixel(odd_picture, 0, 8, 8, 9, 9) == 0);  // 1 of 1 block
}

TEST_CASE("draw_text: a character a cell, '#' all active, '+' some, '.' none", "[pattern]") {
  const BlockPattern window = patterns::sliding_window(64, 8 * 64, 8 * 64, 1, 0);
  CHECK(draw_text(window) == "#.......\n##......\n.##.....\n..##....\n...##...\n....##..\n.....##.\n......##\n");
  // Cells of 2 x 2 blocks: the diagonal's cells hold 3 active blocks of 4, those below it 1.
  CHECK(draw_text(window, 0, 4) == "+...\n++..\n.++.\n..++\n");
  CHECK(draw_text(patterns::dense(64, 8 * 64, 8 * 64), 0, 4) == "####\n####\n####\n####\n");
  CHECK_THROWS_WITH(draw_text(window, 1), Contains("head = 1 is not in [0, 1)"));
  CHECK_THROWS_WITH(draw(window, {.head = -2}), Contains("head = -2"));
  CHECK_THROWS_WITH(draw(BlockPattern()), Contains("the pattern is empty"));
  CHECK_THROWS_WITH(draw(window, {.max_side = 0}), Contains("max_side = 0"));
}

TEST_CASE("save_png writes the picture that libpng reads back, or says the build has no libpng", "[pattern]") {
  const test::TempDir dir("sjit-picture");
  const BlockPattern p = patterns::bigbird(32, 50 * 32, 30 * 32, 1, 1, 2, 3, 3);
  const PatternPicture picture = draw(p);
  const auto path = dir.path() / "p.png";
  if (!png_support()) {
    CHECK_THROWS_WITH(save_png(picture, path), Contains("has no libpng"));
    return;
  }
  save_png(picture, path);
#if SJIT_HAVE_PNG
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  REQUIRE(png_image_begin_read_from_file(&image, path.c_str()) != 0);
  image.format = PNG_FORMAT_GRAY;
  std::vector<std::uint8_t> pixels(PNG_IMAGE_SIZE(image));
  REQUIRE(png_image_finish_read(&image, nullptr, pixels.data(), 0, nullptr) != 0);
  CHECK(int(image.width) == picture.width);
  CHECK(int(image.height) == picture.height);
  CHECK(pixels == picture.gray);
#endif
  CHECK_THROWS_WITH(save_png(PatternPicture{}, path), Contains("draw() one first"));
  CHECK_THROWS_WITH(save_png(picture, dir.path() / "no-such-folder" / "p.png"), Contains("cannot save"));
}

TEST_CASE("sjit pattern build writes the builder's pattern, show prints its statistics, draw its picture, "
          "combine unites or intersects files",
          "[pattern][tool]") {
  const test::TempDir dir("sjit-picture");
  const std::string file = (dir.path() / "w.bsr").string();
  int status = -1;
  std::string out = test::run_tool(
      fmt::format("pattern build window --block 32 --seq 1000 --seq-k 800 --before 3 --after 1 --heads 2 -o '{}'", file),
      &status);
  INFO(out);
  REQUIRE(status == 0);
  const BlockPattern want = patterns::sliding_window(32, 1000, 800, 3, 1, 2);
  const BlockPattern got = BlockPattern::load(file);
  CHECK(got == want);
  const PatternStats s = want.stats();
  out = test::run_tool(fmt::format("pattern show '{}' --head 1", file), &status);
  CHECK(status == 0);
  CHECK_THAT(out, Contains(fmt::format("{} active blocks, density {:.4f}", s.nnz, s.density)) &&
                      Contains(fmt::format("{:016x}", want.digest())) && Contains(draw_text(want, 1)));
  for (const std::string kind : {"random --density 0.25 --seed 3", "bigbird --local 2 --random 1", "causal --align br",
                                 "dense"}) {
    out = test::run_tool(fmt::format("pattern build {} --block 64 --seq 640 -o '{}'", kind, file), &status);
    INFO(kind);
    CHECK(status == 0);
  }
  CHECK(BlockPattern::load(file) == patterns::dense(64, 640, 640));
  out = test::run_tool(fmt::format("pattern draw '{}' -o '{}'", file, (dir.path() / "d.png").string()), &status);
  if (png_support()) {
    CHECK(status == 0);
    std::ifstream png(dir.path() / "d.png", std::ios::binary);
    std::string signature(8, '\0');
    png.read(signature.data(), 8);
    CHECK(signature == "\x89PNG\r\n\x1a\n");
  } else {
    CHECK(status != 0);
    CHECK_THAT(out, Contains("has no libpng"));
  }
  // A pattern learned from a raw little-endian float32 file of scores: from_scores's, per head.
  std::vector<float> scores(2 * 8 * 8);
  for (std::size_t i = 0; i < scores.size(); ++i) scores[i] = float((i * 37) % 23);
  const std::string scores_file = (dir.path() / "scores.f32").string();
  {
    std::ofstream raw(scores_file, std::ios::binary);
    for (const float x : scores) {  // (little-endian, whatever the host)
      const auto bits = std::bit_cast<std::uint32_t>(x);
      for (int b = 0; b < 4; ++b) raw.put(char(bits >> (8 * b) & 0xFF));
    }
  }
  out = test::run_tool(
      fmt::format("pattern build scores --scores '{}' --block 32 --seq 256 --heads 2 --top-k 3 --mass 0.5 -o '{}'",
                  scores_file, file),
      &status);
  CHECK(status == 0);
  const BlockPattern learned = patterns::from_scores(32, 256, 256, scores, {.top_k = 3, .mass = 0.5}, 2);
  CHECK(BlockPattern::load(file) == learned);
  CHECK_THAT(out, Contains("per head: density"));
  out = test::run_tool(fmt::format("pattern build scores --scores '{}' --block 32 --seq 512 --heads 2 --top-k 3 -o '{}'",
                                   scores_file, file),
                       &status);
  CHECK(status != 0);
  CHECK_THAT(out, Contains("128 scores for 2 head(s) of 16 x 16 blocks: give 512"));
  // The union and intersection of files: the library's.
  const std::string window_file = (dir.path() / "a.bsr").string(), random_file = (dir.path() / "b.bsr").string();
  want.save(window_file);
  const BlockPattern random = patterns::random(32, 1000, 800, 0.2, 5);
  random.save(random_file);
  for (const std::string how : {"union", "intersection"}) {
    out = test::run_tool(fmt::format("pattern combine {} '{}' '{}' -o '{}'", how, window_file, random_file, file), &status);
    INFO(how);
    CHECK(status == 0);
    CHECK(BlockPattern::load(file) ==
          (how == "union" ? patterns::united(want, random) : patterns::intersected(want, random)));
  }
  out = test::run_tool(fmt::format("pattern combine xor '{}' '{}' -o '{}'", window_file, random_file, file), &status);
  CHECK(status != 0);
  CHECK_THAT(out, Contains("use union or intersection"));
  // Refusals, each naming what was wrong.
  out = test::run_tool(fmt::format("pattern build window --seq 1000 --density 0.3 -o '{}'", file), &status);
  CHECK(status != 0);
  CHECK_THAT(out, Contains("--density does not apply to a window pattern"));
  out = test::run_tool(fmt::format("pattern build blob --seq 100 -o '{}'", file), &status);
  CHECK(status != 0);
  CHECK_THAT(out, Contains("pattern kind 'blob': use dense, causal, window, bigbird, random or scores"));
  out = test::run_tool(fmt::format("pattern build dense --block 48 --seq 100 -o '{}'", file), &status);
  CHECK(status != 0);
  CHECK_THAT(out, Contains("block_size = 48"));
  out = test::run_tool(fmt::format("pattern show '{}'", (dir.path() / "missing.bsr").string()), &status);
  CHECK(status != 0);
  CHECK_THAT(out, Contains("cannot open"));
}

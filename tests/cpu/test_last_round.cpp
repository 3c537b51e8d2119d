// The persistent forward's split last round: the host's choice of which items to split, and the
// kernel's own partition of them (templates/sparsejit/last_round.cuh, compiled here as on the GPU).
#include <catch2/catch.hpp>

#include <map>
#include <vector>

#include "attention/last_round.h"
#include "attention/tile_schedule.h"
#include "sparsejit/pattern.h"
#include "templates/sparsejit/last_round.cuh"

using sjit::attention::kMaxLastRoundPieces;
using sjit::attention::split_last_round;
using sjit_kernels::LastRound;
using sjit_kernels::TileRange;

TEST_CASE("the last round is split where the CTAs it leaves idle outweigh the merge", "[attention][last_round]") {
  using sjit::attention::kLastRoundMergeTiles;
  using sjit::LastRound;
  constexpr auto pays = LastRound::automatic, always = LastRound::split, never = LastRound::whole;
  // 2048 items of 64 tiles (B2 H16 S8192, 128 x 128 tiles) on 132 SMs: 15 full rounds and 68 items
  // left, which 64 idle CTAs would share.
  auto split = split_last_round(2048, 64, true, 132, pays);
  CHECK(split.grid == 132);
  CHECK(split.tail_items == 68);
  CHECK(split.tail_ctas == 132);
  CHECK(split_last_round(2048, 64, true, 132, never).tail_items == 0);
  CHECK(split_last_round(2048, 64, true, 132, never).grid == 132);
  // Short items pay only where many CTAs would idle: the rule's edge, 64 idle CTAs.
  const std::int64_t edge = (132 * kLastRoundMergeTiles + 63) / 64;
  CHECK(split_last_round(2048, edge, true, 132, pays).tail_items == 68);
  CHECK(split_last_round(2048, edge - 1, true, 132, pays).tail_items == 0);
  CHECK(split_last_round(2048, edge - 1, true, 132, always).tail_items == 68);
  // The measured cases (H200, B2 H16 S8192, blocks of 128): patterns of 16 tiles a row (density 0.25)
  // gain split, 6 (0.1) tie and 3 (0.05) lose.
  CHECK(split_last_round(2048, 16, true, 132, pays).tail_items == 68);
  CHECK(split_last_round(2048, 6, true, 132, pays).tail_items == 0);
  CHECK(split_last_round(2048, 3, true, 132, pays).tail_items == 0);
  // Rounds that come out even: nothing to split, whatever the rule.
  CHECK(split_last_round(132 * 4, 64, true, 132, always).tail_items == 0);
  // A last round nearly full: four idle CTAs pay for long items only.
  CHECK(split_last_round(132 * 3 + 128, 64, true, 132, pays).tail_items == 0);
  CHECK(split_last_round(132 * 3 + 128, 512, true, 132, pays).tail_items == 128);
  // Fewer items than SMs: each cut into about kMaxLastRoundPieces pieces, one CTA a share.
  split = split_last_round(16, 64, true, 132, pays);
  CHECK(split.tail_items == 16);
  CHECK(split.tail_ctas == std::min(132, 16 * kMaxLastRoundPieces));
  CHECK(split.grid == split.tail_ctas);
  split = split_last_round(1, 64, true, 132, pays);
  CHECK(split.tail_ctas == kMaxLastRoundPieces);
  CHECK(split.grid == kMaxLastRoundPieces);
  CHECK(split_last_round(16, 64, true, 132, never).grid == 16);
  // Items too long for the kernel's 32-bit cut, a device of one SM, no items: whole.
  CHECK(split_last_round(2048, std::int64_t(1) << 30, true, 132, always).tail_items == 0);
  CHECK(split_last_round(5, 64, true, 1, always).tail_items == 0);
  CHECK(split_last_round(0, 64, true, 132, always).grid == 0);
}

TEST_CASE("the CTAs' pieces cut every item of the last round exactly once", "[attention][last_round]") {
  for (const int sms : {132, 114, 7}) {
    for (int items = 1; items < 3 * sms; ++items) {
      const auto split = split_last_round(items, 512, false, sms, sjit::LastRound::split);
      if (split.tail_items == 0) continue;
      const LastRound last{split.tail_items, split.tail_ctas};
      REQUIRE(split.tail_ctas <= split.grid);
      for (const int count : {0, 1, 2, 3, 7, 64, 512}) {
        INFO("SMs " << sms << ", items " << items << ", tail " << split.tail_items << " on " << split.tail_ctas
                    << " CTAs, " << count << " tiles an item");
        std::map<int, std::vector<int>> covered;  // item -> how often each tile was taken
        for (int c = 0; c < last.ctas; ++c) {
          REQUIRE(last.first_item(c) <= last.last_item(c));
          REQUIRE(last.last_item(c) <= last.first_item(c) + 1);
          REQUIRE(last.last_item(c) < last.items);
          int waited_for = 0;  // pieces of this CTA that a merger waits for: one scratch slot a CTA
          for (int t = last.first_item(c); t <= last.last_item(c); ++t) {
            REQUIRE(last.first_cta(t) <= c);
            REQUIRE(c <= last.last_cta(t));
            const TileRange r = last.tiles(t, c, count);
            if (r.empty()) continue;
            REQUIRE(0 <= r.begin);
            REQUIRE(r.end <= count);
            auto& tiles = covered[t];
            tiles.resize(std::size_t(count));
            for (int j = r.begin; j < r.end; ++j) ++tiles[std::size_t(j)];
            if (last.waited_for(t, c, count)) {
              ++waited_for;
              // The CTA walks it first (its last item), and its merger is a higher CTA, launched after
              // it: a merger never waits for a piece behind its own wait.
              REQUIRE(t == last.last_item(c));
              REQUIRE(last.merger(t) > c);
            }
          }
          REQUIRE(waited_for <= 1);
        }
        for (int t = 0; t < last.items; ++t) {
          int pieces = 0;
          for (int c = last.first_cta(t); c <= last.last_cta(t); ++c) pieces += !last.tiles(t, c, count).empty();
          REQUIRE(last.pieces(t, count) == pieces);
          REQUIRE(pieces <= std::max(1, kMaxLastRoundPieces + 1));
          if (count == 0) {
            REQUIRE(pieces == 0);
            continue;
          }
          REQUIRE(pieces >= 1);
          REQUIRE(covered[t].size() == std::size_t(count));
          for (const int taken : covered[t]) REQUIRE(taken == 1);
          // The merger holds the item's last tile, so a piece of its own; it waits for every other.
          const TileRange own = last.tiles(t, last.merger(t), count);
          REQUIRE(own.end == count);
          REQUIRE_FALSE(own.empty());
          int others = 0;
          for (int c = last.first_cta(t); c <= last.last_cta(t); ++c) others += last.waited_for(t, c, count);
          REQUIRE(others == pieces - 1);
        }
      }
    }
  }
}

TEST_CASE("a schedule says whether its items are of one length", "[attention][last_round]") {
  using sjit::attention::build_tile_schedule;
  using sjit::attention::uniform_item_tiles;
  namespace patterns = sjit::patterns;
  // The benchmark's random patterns: as many blocks in every row (and 128-key tiles of blocks of 128).
  CHECK(uniform_item_tiles(build_tile_schedule(patterns::random(128, 8192, 8192, 0.5, 7, 4), 128, 128)) == 32);
  CHECK(uniform_item_tiles(build_tile_schedule(patterns::dense(128, 4096, 2048, 2), 128, 128)) == 16);
  // A window's first and last rows are shorter; causal rows differ.
  CHECK(uniform_item_tiles(build_tile_schedule(patterns::sliding_window(128, 4096, 4096, 2, 2), 128, 128)) == 0);
  CHECK(uniform_item_tiles(build_tile_schedule(patterns::causal(128, 2048, 2048), 128, 128)) == 0);
  // An empty row among full ones.
  std::vector<std::uint8_t> mask(4 * 4, 1);
  std::fill_n(mask.begin() + 8, 4, std::uint8_t{0});
  CHECK(uniform_item_tiles(build_tile_schedule(sjit::BlockPattern::from_block_mask(128, 1, 4, 4, mask), 128, 128)) == 0);
}

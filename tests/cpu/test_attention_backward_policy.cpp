// The backward's problem-dependent choices (src/attention/backward_policy.h): how dQ is summed, and
// where atomic dQ's accumulator is converted. The thresholds are the measured crossovers of
// docs/attention.md, "The dQ pass on wgmma"; each case sits on one side of one.
#include <catch2/catch.hpp>

#include "attention/backward_policy.h"
#include "tune/attention_tuned_configs.h"
#include "sparsejit/sparsejit.h"

using namespace sjit;
using attention::choose_dq_summation;
using Catch::Matchers::Contains;

namespace {

AttentionSpec spec_of(int head_dim, Causal causal = Causal::none, bool deterministic = false) {
  AttentionSpec s;
  s.head_dim = head_dim;
  s.causal = causal;
  s.deterministic = deterministic;
  return s;
}

}  // namespace

TEST_CASE("a deterministic spec, or one at d = 256, always takes the dQ pass", "[attention][backward][policy]") {
  for (const bool sm90 : {false, true})
    for (const char* forced : {"", "auto", "atomic", "pass"}) {
      INFO("sm90 " << sm90 << ", SJIT_BACKWARD_DQ='" << forced << "'");
      CHECK(choose_dq_summation(spec_of(128, Causal::none, true), sm90, 64, 1, forced) == DqSummation::pass);
      CHECK(choose_dq_summation(spec_of(256), sm90, 64, 1, forced) == DqSummation::pass);
    }
}

TEST_CASE("off Hopper dQ is summed atomically unless forced", "[attention][backward][policy]") {
  for (const double tiles : {0.5, 1.0, 6.0, 64.0})
    for (const int d : {64, 128}) {
      INFO("d " << d << ", tiles a row " << tiles);
      CHECK(choose_dq_summation(spec_of(d), false, tiles, 1, "") == DqSummation::atomic);
      CHECK(choose_dq_summation(spec_of(d), false, tiles, 8, "auto") == DqSummation::atomic);
      CHECK(choose_dq_summation(spec_of(d), false, tiles, 1, "pass") == DqSummation::pass);
    }
}

TEST_CASE("on Hopper the dQ pass where rows see few key tiles, and for wide GQA groups",
          "[attention][backward][policy]") {
  // One query head a K/V head, d = 128: the pass at 1 and 2 tiles a row (0.02 and 0.035 at S = 8192),
  // the atomic adds from 3 (0.05) on, causal or not.
  for (const Causal c : {Causal::none, Causal::top_left}) {
    INFO("causal " << name(c));
    CHECK(choose_dq_summation(spec_of(128, c), true, 1, 1, "") == DqSummation::pass);
    CHECK(choose_dq_summation(spec_of(128, c), true, 2, 1, "") == DqSummation::pass);
    CHECK(choose_dq_summation(spec_of(128, c), true, 3, 1, "") == DqSummation::atomic);
    CHECK(choose_dq_summation(spec_of(128, c), true, 64, 1, "") == DqSummation::atomic);
  }
  // Two or three query heads a K/V head: the pass up to 0.1 (6 tiles a row at S = 8192), the atomic
  // adds from 0.25 (16).
  for (const int group : {2, 3}) {
    INFO("group " << group);
    CHECK(choose_dq_summation(spec_of(128), true, 3, group, "") == DqSummation::pass);
    CHECK(choose_dq_summation(spec_of(128), true, 6, group, "") == DqSummation::pass);
    CHECK(choose_dq_summation(spec_of(128), true, 16, group, "") == DqSummation::atomic);
  }
  // Four or more: the pass up to 0.25 (16 tiles a row), the atomic adds from 0.5 (32); 0.375 (24)
  // is a tie.
  CHECK(choose_dq_summation(spec_of(128), true, 9.6, 4, "") == DqSummation::pass);
  CHECK(choose_dq_summation(spec_of(128), true, 16, 4, "") == DqSummation::pass);
  CHECK(choose_dq_summation(spec_of(128), true, 32, 4, "") == DqSummation::atomic);
  CHECK(choose_dq_summation(spec_of(128), true, 16, 8, "") == DqSummation::pass);
  CHECK(choose_dq_summation(spec_of(128), true, 64, 8, "") == DqSummation::atomic);
}

// d = 64's dK/dV pass walks 128-query tiles where pattern blocks are that wide (or dense), and each
// warpgroup's dQ product then takes half the queries: atomic dQ wins from two key tiles a row (the
// H200, backward_policy.cpp). On 64-query tiles (narrower pattern blocks) its dQ product splits the
// keys, and the pass wins at every density.
TEST_CASE("at d = 64 the dQ pass where rows see one key tile, or where the dK/dV tiles are 64 queries",
          "[attention][backward][policy]") {
  for (const Causal c : {Causal::none, Causal::top_left, Causal::bottom_right})
    for (const std::int64_t group : {1, 2, 4, 8}) {
      CAPTURE(name(c), group);
      CHECK(choose_dq_summation(spec_of(64, c), true, 1, group, "") == DqSummation::pass);
      CHECK(choose_dq_summation(spec_of(64, c), true, 2, group, "") == DqSummation::atomic);
      CHECK(choose_dq_summation(spec_of(64, c), true, 32, group, "auto") == DqSummation::atomic);
    }
  AttentionSpec blocks = spec_of(64);
  blocks.sparsity = Sparsity::block_sparse;
  for (const int block : {16, 32, 64, 128, 256}) {
    CAPTURE(block);
    blocks.block_size = block;
    // Blocks of 64 run 64-query tiles; the others 128 unless the pattern's walks are short, which the
    // caller says (dkdv_query_cols).
    for (const double tiles : {1.0, 3.0, 32.0}) {
      CAPTURE(tiles);
      CHECK(choose_dq_summation(blocks, true, tiles, 1, "") ==
            (block != 64 && tiles > 1 ? DqSummation::atomic : DqSummation::pass));
      CHECK(choose_dq_summation(blocks, true, tiles, 1, "", {}, {}, false, 0, 4.8e12, 64) == DqSummation::pass);
      CHECK(choose_dq_summation(blocks, true, tiles, 1, "", {}, {}, false, 0, 4.8e12, 128) ==
            (tiles > 1 ? DqSummation::atomic : DqSummation::pass));
    }
  }
  // Asked for, atomic runs on 64-query tiles too.
  CHECK(choose_dq_summation(blocks, true, 32, 1, "", DqSummation::atomic, {}, false, 0, 4.8e12, 64) == DqSummation::atomic);
}

// A band (a sliding window: attention::contiguous_walks) adds to rows its neighbouring CTAs add to, in
// the L2: atomic dQ from 2 key tiles a row whatever the group, where random blocks with four query heads
// a K/V head take the pass up to 8 (the H200) or 20 (the H100), and whatever the sequence's length.
TEST_CASE("a band sums dQ atomically from two key tiles a row whatever the group and the length",
          "[attention][backward][policy]") {
  constexpr double h100 = 3.35e12, h200 = 4.8e12;
  auto way = [](int d, Causal causal, double tiles, std::int64_t group, double bandwidth, bool banded) {
    return choose_dq_summation(spec_of(d, causal), true, tiles, group, "", std::nullopt, std::nullopt, false, 0,
                               bandwidth, 0, banded);
  };
  for (const double bandwidth : {h100, h200})
    for (const Causal c : {Causal::none, Causal::top_left})
      for (const std::int64_t group : {1, 2, 4, 8}) {
        CAPTURE(bandwidth, name(c), group);
        CHECK(way(128, c, 3, group, bandwidth, true) == DqSummation::atomic);
        CHECK(way(128, c, 2.5, group, bandwidth, true) == DqSummation::atomic);
        CHECK(way(128, c, 1.9, group, bandwidth, true) == DqSummation::pass);
        CHECK(way(96, c, 2.5, group, bandwidth, true) == DqSummation::atomic);
        // Not a band: four heads or more take the pass at 3 tiles (random blocks measured 7% faster so).
        if (group >= 4) CHECK(way(128, c, 3, group, bandwidth, false) == DqSummation::pass);
      }
  // Beyond the L2 (512 key tiles, an accumulator that outgrows it) a band's adds still stay in the L2:
  // atomic at 4 tiles a row, where random blocks take the pass on either card.
  for (const double bandwidth : {h100, h200}) {
    CAPTURE(bandwidth);
    auto spilled = [&](double tiles, bool banded) {
      return choose_dq_summation(spec_of(128), true, tiles, 1, "", std::nullopt, std::nullopt, false, 512, bandwidth,
                                 0, banded);
    };
    CHECK(spilled(4, true) == DqSummation::atomic);
    CHECK(spilled(4, false) == DqSummation::pass);
    CHECK(spilled(1.5, true) == DqSummation::pass);
  }
  // At d = 64 (128-query tiles) a band takes the pass below 2 tiles a row too (a window of 1 + 1 + 0
  // blocks of 128, 1.98 tiles: 7-19% faster so with one to four heads), where random blocks take it
  // below 1.5 only (2 tiles: 5-10% faster atomic).
  for (const double bandwidth : {h100, h200})
    for (const std::int64_t group : {1, 2, 4}) {
      CAPTURE(bandwidth, group);
      CHECK(way(64, Causal::none, 1, group, bandwidth, true) == DqSummation::pass);
      CHECK(way(64, Causal::none, 1.98, group, bandwidth, true) == DqSummation::pass);
      CHECK(way(64, Causal::none, 1.98, group, bandwidth, false) == DqSummation::atomic);
      CHECK(way(64, Causal::none, 2.97, group, bandwidth, true) == DqSummation::atomic);
    }
  // A band's stored tuning has a bucket of its own.
  CHECK(tuning::dq_bucket(4, 3, {.banded = true}) == "group=4,tiles<=4,banded");
  CHECK(tuning::dq_bucket(4, 3) == "group=4,tiles<=4");
  CHECK_THROWS_WITH(tuning::dq_bucket(4, 3, {.gathered = true, .banded = true}), Contains("band"));
}

TEST_CASE("SJIT_BACKWARD_DQ forces a way, and a bad value names itself", "[attention][backward][policy]") {
  CHECK(choose_dq_summation(spec_of(128), true, 1, 1, "atomic") == DqSummation::atomic);
  CHECK(choose_dq_summation(spec_of(128), true, 64, 1, "pass") == DqSummation::pass);
  CHECK_THROWS_AS(choose_dq_summation(spec_of(128), true, 6, 1, "Atomic"), InvalidArgument);
  CHECK_THROWS_WITH(choose_dq_summation(spec_of(128), true, 6, 1, "fastest"),
                    Contains("SJIT_BACKWARD_DQ = 'fastest'") && Contains("atomic, pass or auto"));
  // Also where the spec leaves no choice: the setting is wrong either way.
  CHECK_THROWS_AS(choose_dq_summation(spec_of(128, Causal::none, true), false, 6, 1, "fastest"), InvalidArgument);
}

TEST_CASE("atomic dQ is converted inside the dK/dV pass from two key tiles a query row",
          "[attention][backward][policy]") {
  CHECK_FALSE(attention::worth_converting_in_pass(1));
  CHECK_FALSE(attention::worth_converting_in_pass(1.9));
  CHECK(attention::worth_converting_in_pass(2));
  CHECK(attention::worth_converting_in_pass(6));
}

// AttentionBackwardArgs::dq_summation, then SJIT_BACKWARD_DQ, then a stored tuning, then the rule.
TEST_CASE("a way asked for in the args wins, then SJIT_BACKWARD_DQ, then a stored tuning, then the rule",
          "[attention][backward][policy]") {
  const auto atomic = DqSummation::atomic, pass = DqSummation::pass;
  // The rule alone: atomic at 6 tiles a row, the pass at 1 (d = 128, one query head a K/V head).
  REQUIRE(choose_dq_summation(spec_of(128), true, 6, 1, "") == atomic);
  REQUIRE(choose_dq_summation(spec_of(128), true, 1, 1, "") == pass);
  // A stored tuning over the rule, on and off Hopper.
  CHECK(choose_dq_summation(spec_of(128), true, 6, 1, "", std::nullopt, pass) == pass);
  CHECK(choose_dq_summation(spec_of(128), true, 1, 1, "auto", std::nullopt, atomic) == atomic);
  CHECK(choose_dq_summation(spec_of(128), false, 6, 1, "", std::nullopt, pass) == pass);
  // SJIT_BACKWARD_DQ over a stored tuning.
  CHECK(choose_dq_summation(spec_of(128), true, 6, 1, "atomic", std::nullopt, pass) == atomic);
  CHECK(choose_dq_summation(spec_of(128), true, 1, 1, "pass", std::nullopt, atomic) == pass);
  // The args over everything.
  CHECK(choose_dq_summation(spec_of(128), true, 1, 1, "pass", atomic, pass) == atomic);
  CHECK(choose_dq_summation(spec_of(128), true, 64, 1, "atomic", pass, atomic) == pass);
  CHECK(choose_dq_summation(spec_of(64), true, 64, 1, "", atomic) == atomic);
}

TEST_CASE("a spec that must take the dQ pass takes it whatever is stored, and refuses atomic asked in the args",
          "[attention][backward][policy]") {
  const AttentionSpec det = spec_of(128, Causal::none, true);
  CHECK(choose_dq_summation(det, true, 6, 1, "", std::nullopt, DqSummation::atomic) == DqSummation::pass);
  CHECK(choose_dq_summation(det, true, 6, 1, "", DqSummation::pass) == DqSummation::pass);
  CHECK_THROWS_WITH(choose_dq_summation(det, true, 6, 1, "", DqSummation::atomic),
                    Contains("dq_summation = atomic") && Contains("det=1") && Contains("deterministic") &&
                        Contains("ask for pass"));
  CHECK_THROWS_WITH(choose_dq_summation(spec_of(256), false, 6, 1, "", DqSummation::atomic),
                    Contains("dq_summation = atomic") && Contains("d=256") && Contains("head_dim"));
}

// The gathered backward (pattern blocks of 16 and 32) has its own crossover: its dK/dV pass's bulk
// reductions against the gathered dQ pass, measured with one and four query heads a K/V head, and
// (on the H200) with an accumulator beyond the L2, where its reductions, two to four times the 128-key
// pass's bytes a product, miss the L2.
TEST_CASE("the gathered backward sums dQ atomically with one query head a K/V head, by its pass with four "
          "or beyond the L2", "[attention][backward][policy]") {
  for (const int d : {64, 128}) {
    CAPTURE(d);
    // Whatever the tiles a row (the 128-key pass's rule would take the pass below 2.5, and at d = 64).
    for (const double tiles : {1.0, 6.0, 40.0}) {
      CAPTURE(tiles);
      CHECK(choose_dq_summation(spec_of(d), true, tiles, 1, "", std::nullopt, std::nullopt, true) == DqSummation::atomic);
      CHECK(choose_dq_summation(spec_of(d), true, tiles, 4, "", std::nullopt, std::nullopt, true) == DqSummation::pass);
      // Beyond the L2 (512 key tiles spilled), one head a K/V head too, whatever the DRAM's speed.
      for (const double bandwidth : {0.0, 3.35e12, 4.8e12}) {
        CAPTURE(bandwidth);
        CHECK(choose_dq_summation(spec_of(d), true, tiles, 1, "", std::nullopt, std::nullopt, true, 512, bandwidth) ==
              DqSummation::pass);
        CHECK(choose_dq_summation(spec_of(d), true, tiles, 2, "", std::nullopt, std::nullopt, true, 512, bandwidth) ==
              DqSummation::pass);
      }
    }
    // What comes before the rule still decides: asked, a deterministic spec, forced.
    CHECK(choose_dq_summation(spec_of(d), true, 6, 1, "", DqSummation::pass, std::nullopt, true) == DqSummation::pass);
    CHECK(choose_dq_summation(spec_of(d, Causal::none, true), true, 6, 1, "", std::nullopt, std::nullopt, true) ==
          DqSummation::pass);
    CHECK(choose_dq_summation(spec_of(d), true, 6, 4, "atomic", std::nullopt, std::nullopt, true) == DqSummation::atomic);
    CHECK(choose_dq_summation(spec_of(d), true, 6, 1, "pass", std::nullopt, std::nullopt, true) == DqSummation::pass);
  }
}

// Long sequences and wide GQA groups: where a K/V group's Q, dO and fp32 accumulator (group * seq_q *
// head_dim * 8 bytes) outgrow the L2, the adds of a sparse pattern miss it, and the dQ pass wins up to
// 30% of the key tiles (backward_policy.cpp has the H100 measurements; its L2 holds 50 MB).
TEST_CASE("an accumulator beyond the L2 takes the dQ pass up to 30% of the key tiles",
          "[attention][backward][policy]") {
  constexpr std::int64_t h100_l2 = 50 << 20;
  using attention::accumulator_spills;
  CHECK_FALSE(accumulator_spills(1, 32768, 128, h100_l2));  // 32 MB: the rule of S = 8192 holds
  CHECK(accumulator_spills(1, 65536, 128, h100_l2));         // 64 MB
  CHECK(accumulator_spills(2, 32768, 128, h100_l2));
  CHECK(accumulator_spills(4, 16384, 128, h100_l2));
  CHECK_FALSE(accumulator_spills(4, 8192, 128, h100_l2));
  CHECK_FALSE(accumulator_spills(1, 65536, 64, h100_l2));
  CHECK_FALSE(accumulator_spills(8, 1 << 20, 128, 0));  // an L2 of unknown size: the rule as measured

  const auto atomic = DqSummation::atomic, pass = DqSummation::pass;
  const auto choose = [](double tiles, std::int64_t group, std::int64_t spilled_key_tiles) {
    return choose_dq_summation(spec_of(128), true, tiles, group, "", std::nullopt, std::nullopt, false,
                               spilled_key_tiles);
  };
  // One query head a K/V head at S = 65536 (512 key tiles): the pass at 5, 10 and 128 tiles a row,
  // atomic from 30% on and dense; the same rows with an accumulator that fits stay atomic from 3.
  CHECK(choose(5, 1, 512) == pass);
  CHECK(choose(10, 1, 512) == pass);
  CHECK(choose(128, 1, 512) == pass);
  CHECK(choose(160, 1, 512) == atomic);
  CHECK(choose(512, 1, 512) == atomic);
  CHECK(choose(10, 1, 0) == atomic);
  // Two and four heads at S = 32768 (256 key tiles): the pass at 64 tiles, where the rule alone would
  // take atomic; atomic at 102 (40%) and dense.
  for (const std::int64_t group : {2, 4}) {
    CAPTURE(group);
    CHECK(choose(64, group, 256) == pass);
    CHECK(choose(64, group, 0) == atomic);
    CHECK(choose(102, group, 256) == atomic);
    CHECK(choose(256, group, 256) == atomic);
  }
  // Below the L2's rule, the rule of short sequences still takes the pass.
  CHECK(choose(16, 4, 32) == pass);
  // What comes before the rule still decides: forced, asked, a stored tuning.
  CHECK(choose_dq_summation(spec_of(128), true, 10, 1, "atomic", std::nullopt, std::nullopt, false, 512) == atomic);
  CHECK(choose_dq_summation(spec_of(128), true, 10, 1, "", atomic, std::nullopt, false, 512) == atomic);
  CHECK(choose_dq_summation(spec_of(128), true, 10, 1, "", std::nullopt, atomic, false, 512) == atomic);
  // d = 64 with an unknown bandwidth (the H100's share): the pass up to 30% of the key tiles.
  CHECK(choose_dq_summation(spec_of(64), true, 100, 1, "", std::nullopt, std::nullopt, false, 512) == pass);
  CHECK(choose_dq_summation(spec_of(64), true, 400, 1, "", std::nullopt, std::nullopt, false, 512) == atomic);
}

// On faster DRAM (the H200's 4.8 TB/s against the H100's 3.35) the spilled adds cost less: beyond the
// L2 the pass is taken only below 2% of the key tiles, and above that the rule of short sequences
// decides (backward_policy.cpp has the H200's measurements). An unknown bandwidth keeps the H100's 30%.
TEST_CASE("beyond the L2, fast DRAM takes the dQ pass only where rows see very few key tiles",
          "[attention][backward][policy]") {
  using attention::dq_pass_thresholds;
  CHECK(dq_pass_thresholds(0).beyond_l2_share == 0.3);
  CHECK(dq_pass_thresholds(3.35e12).beyond_l2_share == 0.3);
  CHECK(dq_pass_thresholds(4.8e12).beyond_l2_share == 0.02);

  const auto atomic = DqSummation::atomic, pass = DqSummation::pass;
  constexpr double h100 = 3.35e12, h200 = 4.8e12;
  struct Case {
    double tiles;
    std::int64_t group, spilled_key_tiles;  // spilled: the sequence's key tiles where the accumulator spills
    double bandwidth;
    DqSummation want;
  };
  const Case cases[] = {
      // One head a K/V head at S = 65536 (512 key tiles): the H200 takes the pass at 5 tiles, atomic at
      // 26, where the H100 takes the pass.
      {5, 1, 512, h200, pass}, {26, 1, 512, h200, atomic}, {26, 1, 512, h100, pass},
      // Four heads at S = 32768 (256 key tiles): below 8 tiles the short sequences' rule takes the pass
      // on either; at 13, 26 and 64 tiles only the H100 does.
      {6, 4, 256, h200, pass}, {13, 4, 256, h200, atomic}, {13, 4, 256, h100, pass},
      {26, 4, 256, h200, atomic}, {64, 4, 256, h200, atomic}, {64, 4, 256, h100, pass},
      // With an accumulator that fits and one head a K/V head: atomic from 3 tiles a row on either, the
      // pass at 1; at 2 tiles the H200 adds atomically (measured 8% faster), the H100 takes the pass.
      {26, 1, 0, 0, atomic}, {26, 1, 0, h100, atomic}, {26, 1, 0, h200, atomic},
      {3, 1, 0, 0, atomic}, {3, 1, 0, h100, atomic}, {3, 1, 0, h200, atomic},
      {2, 1, 0, 0, pass}, {2, 1, 0, h100, pass}, {2, 1, 0, h200, atomic}, {1, 1, 0, h200, pass},
  };
  for (const Case& c : cases) {
    CAPTURE(c.tiles, c.group, c.spilled_key_tiles, c.bandwidth);
    CHECK(choose_dq_summation(spec_of(128), true, c.tiles, c.group, "", std::nullopt, std::nullopt, false,
                              c.spilled_key_tiles, c.bandwidth) == c.want);
  }
  // d = 64 on the H200: atomic at 20 of 1024 spilled key tiles (measured 10% faster), the pass below 1%.
  CHECK(dq_pass_thresholds(4.8e12, 64).beyond_l2_share == 0.01);
  CHECK(choose_dq_summation(spec_of(64), true, 20, 1, "", std::nullopt, std::nullopt, false, 1024, h200) == atomic);
  CHECK(choose_dq_summation(spec_of(64), true, 8, 1, "", std::nullopt, std::nullopt, false, 1024, h200) == pass);
}

// GQA groups on fast DRAM: atomic dQ's reductions cost less, and the pass wins below fewer tiles (the
// H200 at S = 8192: four heads a K/V head tie near 6-8 tiles where the H100 ties near 24, two heads near
// 3 where the H100 ties near 10; backward_policy.cpp has the figures). d = 64 has its own: the pass at
// one tile a row, and beyond the L2 below 1% of the key tiles on fast DRAM.
TEST_CASE("on fast DRAM a GQA group takes the dQ pass below fewer key tiles", "[attention][backward][policy]") {
  using attention::dq_pass_thresholds;
  constexpr double h100 = 3.35e12, h200 = 4.8e12;
  for (const double bandwidth : {0.0, h100, h200}) {
    CAPTURE(bandwidth);
    const auto t = dq_pass_thresholds(bandwidth);
    CHECK(t.one_head < t.two_heads);
    CHECK(t.two_heads < t.four_heads);
  }
  CHECK(dq_pass_thresholds(h200).four_heads < dq_pass_thresholds(h100).four_heads);
  CHECK(dq_pass_thresholds(h200).two_heads < dq_pass_thresholds(h100).two_heads);
  CHECK(dq_pass_thresholds(h200).one_head < dq_pass_thresholds(h100).one_head);
  CHECK(dq_pass_thresholds(0).four_heads == dq_pass_thresholds(h100).four_heads);  // unknown: as the H100

  CHECK(dq_pass_thresholds(h100).four_heads_causal == dq_pass_thresholds(h100).four_heads);

  const auto atomic = DqSummation::atomic, pass = DqSummation::pass;
  struct Case {
    int d;
    Causal causal;
    double tiles;
    std::int64_t group;
    double bandwidth;
    DqSummation want;
  };
  constexpr Causal none = Causal::none, causal = Causal::top_left;
  const Case cases[] = {
      // Four heads at 6 and 16 tiles (densities 0.1 and 0.25 at S = 8192), two heads at 3 and 6, eight
      // heads as four; d = 96 as 128.
      {128, none, 6, 4, h200, pass}, {128, none, 16, 4, h200, atomic}, {128, none, 16, 4, h100, pass},
      {128, none, 3, 2, h200, pass}, {128, none, 6, 2, h200, atomic}, {128, none, 6, 2, h100, pass},
      {128, none, 6, 8, h200, pass}, {96, none, 16, 4, h200, atomic},
      // Causal, four heads keep the H100's threshold (rows see about half the tiles counted); two heads
      // do not.
      {128, causal, 16, 4, h200, pass}, {128, causal, 24, 4, h200, atomic},
      {128, causal, 6, 2, h200, atomic}, {128, causal, 3, 2, h200, pass},
      // d = 64: the pass at one tile a row, atomic from two, on both cards.
      {64, none, 1, 1, h200, pass}, {64, none, 2, 1, h200, atomic}, {64, none, 64, 1, h200, atomic},
      {64, none, 1, 4, h200, pass}, {64, none, 3, 4, h200, atomic}, {64, causal, 2, 4, h100, atomic},
  };
  for (const Case& c : cases) {
    CAPTURE(c.d, c.causal == causal, c.tiles, c.group, c.bandwidth);
    CHECK(choose_dq_summation(spec_of(c.d, c.causal), true, c.tiles, c.group, "", std::nullopt, std::nullopt, false, 0,
                              c.bandwidth) == c.want);
  }
}

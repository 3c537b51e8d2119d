// The backward's choices that depend on the problem, not on the kernels: where atomic dQ's accumulator
// is converted, and whether dQ is summed atomically or by a pass of its own.
#include "attention/backward_policy.h"

#include <fmt/format.h>

#include <cstdlib>

#include "codegen/attention_codegen.h"
#include "sparsejit/error.h"

namespace sjit::attention {

// Whether the Hopper dK/dV pass should convert atomic dQ's accumulator itself (in the CTAs a wave
// after each group's) rather than leave it all to dq_convert. A CTA's share of the conversion is its
// group's rows over the group's CTAs, read, written as dQ and zeroed; the CTA's own work is its key
// tile's active query rows, over the same query heads. Their ratio is the mean number of active key
// tiles a query row. Where it is small, a share is no longer hidden behind the work. On the H100
// (S = 8192; docs/attention-log.md, "Landed: dQ converted by the CTAs a wave later") the conversion
// in the pass took 45-85 us off the backward at 6 (density 0.1), about 10 us at 3 (0.05), and nothing
// at 1 (0.02: 0.431 against 0.432 ms with dq_convert). Below 2 (a single key tile, say) one CTA's
// share would be many rows, so dq_convert does it.
bool worth_converting_in_pass(double key_tiles_per_row) { return key_tiles_per_row >= 2; }

// Long sequences (thirty-fifth session, H100, backward ms, atomic / pass; "tiles" are key tiles a row).
// Where a group's working set (accumulator_spills) fits the L2, choose_dq_summation's rule (below),
// measured at S = 8192, holds: one head a K/V head at S = 16384 (16 MB) 4 tiles 1.16 / 1.25, 6 tiles
// 1.44 / 1.65; at S = 32768 (32 MB) 5 tiles 1.49 / 1.48, 9 tiles 1.96 / 2.07, 13 tiles 2.79 / 3.16.
// Beyond the L2's 50 MB the pass wins up to a quarter of the key tiles at least: one head at S = 65536
// (64 MB) 5 tiles 3.40 / 2.94, 10 tiles 5.35 / 4.87, 26 tiles (H4) 3.13 / 2.53, 128 of 512 tiles
// 13.94 / 12.36; at S = 131072 (128 MB, H4) 10 tiles 3.27 / 2.50, 31 tiles 8.89 / 6.95; two heads at
// S = 32768 (64 MB) 26 tiles 5.91 / 5.56, 38 tiles 8.11 / 7.67, 64 of 256 tiles 13.31 / 12.61, 102
// tiles 19.85 / 19.51 (in the training step 19.90 / 21.28); four heads at S = 32768 (128 MB) 5 tiles
// 1.80 / 1.29, 26 tiles 7.43 / 5.32, 64 tiles 15.90 / 12.79, dense 42.5 / 46.8; four heads at S =
// 16384, B2 (64 MB) 32 of 128 tiles 6.64 / 6.32, 51 tiles 9.87 / 10.09. Dense, neighbouring CTAs'
// walks add to the same rows at nearly the same time, and atomic wins at every length (S = 65536
// 166.7 / 208.3, S = 131072 171.5 / 196.6). So beyond the L2 the pass is taken up to 30% of the key
// tiles there (DqPassThresholds::beyond_l2_share).
//
// On the H200 (thirty-sixth session; HBM3e at 4.8 TB/s against the H100's 3.35, an L2 of 60 MB) the
// spilled adds cost far less, and past a few key tiles atomic ties or wins: one head a K/V head at
// S = 65536 (H4, 64 MB) 5 of 512 tiles 0.674 / 0.642, 10 tiles 1.076 / 1.076, 26 tiles 2.489 /
// 2.732; four heads at S = 32768 (128 MB) 26 tiles 5.389 / 5.384, 51 tiles 10.500 / 10.597, 64 tiles
// 12.633 / 13.292, 77 tiles 14.795 / 15.340; two heads at S = 32768 (64 MB) 77 tiles 13.995 /
// 15.411, 90 tiles 17.425 / 18.172; four heads at S = 16384, B2 (64 MB) 38 of 128 tiles 6.949 /
// 7.615; d = 96, four heads at S = 32768 (96 MB) 13 tiles 2.124 / 2.143, 26 tiles 4.307 / 4.506, 64
// tiles 9.867 / 10.535. There the pass is taken below 2% of the key tiles, and above that the rule of
// short sequences decides (dq_pass_thresholds, below).
bool accumulator_spills(std::int64_t group, std::int64_t seq_q, int head_dim, std::int64_t l2_bytes) {
  const double working_set = double(group) * double(seq_q) * double(head_dim) * 8.0;
  return l2_bytes > 0 && working_set > double(l2_bytes);
}

// How a backward that may sum dQ either way (spec.deterministic false) sums it: atomically inside the
// dK/dV pass, or in the dQ pass of its own (no accumulator, no conversion, but S and dP computed a
// second time: seven tile products a tile pair instead of five). The accumulator's costs (the
// reductions, the conversion) grow with the rows, the second products with the active tiles, so the
// dQ pass wins where a row sees few tiles. Measured on the H100 with the Hopper kernels
// (docs/attention.md, "The dQ pass on wgmma"), the backward in ms, atomic / dQ pass:
//   d = 128, B2 H16 S8192: 0.1 0.68-0.71 / 0.86-0.88, 0.05 0.54 / 0.56-0.57, 0.035 0.47 / 0.45,
//     0.02 0.43 / 0.36; causal 0.05 0.49 / 0.51-0.52;
//   d = 128 with 4 query heads a K/V head, since the dQ pass's 128-key tiles (twenty-second session):
//     dense 5.23-5.39 / 5.51-5.64, 0.75 3.82-4.12 / 4.38-4.55, 0.5 2.96-3.02 / 3.11-3.25,
//     0.375 2.42-2.51 / 2.39-2.46, 0.25 1.85 / 1.61-1.62, 0.15 1.35 / 1.09, 0.1 0.74 / 0.71 (the dK/dV
//     pass has a quarter of the CTAs, each with four heads' tiles);
//   d = 128 with 2 query heads a K/V head (same session): dense 5.30-5.37 / 5.69-6.12,
//     0.25 1.60 / 1.68-1.69, 0.1 0.80 / 0.75-0.76, 0.05 0.56 / 0.48;
//   d = 128, one query head a K/V head (same session): 0.07 0.55-0.56 / 0.60-0.63, 0.05 0.51-0.52 /
//     0.52, 0.035 0.46 / 0.43-0.48;
//   d = 64, B2 H16 S8192, with the atomic dK/dV pass on 64-query tiles (dQ split by keys, two adds an
//     element): dense 3.78-3.81 / 3.41-3.45, 0.25 1.04 / 0.97-1.02, 0.1 0.49 / 0.49, 0.02 0.26 /
//     0.21; causal dense 2.04-2.05 / 1.82-1.83, 0.1 0.38 / 0.38-0.39; at B4 H32 S4096 (3 key tiles a
//     row at 0.1) 0.1 0.72 in earlier closing runs / 0.60. Its 128-query tiles (forty-second session)
//     changed that: see dq_pass_thresholds.
// Bands (forty-sixth session, H200, B2 H16 S8192 d = 128, backward ms queued, two rounds, atomic /
// pass; tiles a row counted contiguous, attention::contiguous_walks): a sliding window's key tiles add
// to the rows their neighbours add to, in the L2, and atomic dQ wins from fewer tiles a row than for
// random blocks, whatever the group. One query head a K/V head: windows of 2 tiles a row tie (blocks
// of 128, 1 + 1 + 0, 0.391-0.415 / 0.373-0.410; blocks of 32 and 16, 0.386-0.409 / 0.371-0.412),
// 2.5 tiles atomic (blocks of 64, 2 + 1 + 1, 0.389-0.403 / 0.395-0.441; blocks of 16, 5 + 1 + 4,
// 0.403-0.406 / 0.449-0.457), 3 tiles atomic (blocks of 16 and 32, packed, 0.400-0.428 /
// 0.440-0.506); random blocks of 128 at 2 tiles 0.364-0.369 / 0.394-0.399. Two heads: a window of 3
// tiles (blocks of 128) 0.418-0.419 / 0.449-0.451, packed ones 0.361-0.379 / 0.430-0.450; random
// blocks at 3 tiles 0.441 / 0.447-0.450. Four heads: a window of
// 3 tiles 0.396-0.411 / 0.387-0.426, of 6 tiles 0.630 / 0.701-0.703, packed windows of 3 tiles
// 0.361-0.364 / 0.405-0.430; random blocks at 3 tiles 0.474-0.477 / 0.440-0.444, 6 tiles 0.710-0.719 /
// 0.719-0.724 (where the four-head threshold of 8 still takes the pass). So a band takes the pass
// below 2 tiles a row whatever the group (DqPassThresholds::band; on the H100 too, unmeasured there;
// at d = 64 too, where random blocks take it below 1.5: dq_pass_thresholds). Beyond the L2 too (B1 H4 S65536, one head, 512 key tiles,
// where the H200's share of 2% took the pass below 10 tiles): windows of 4 + 1 + 3 blocks of 128 (8
// tiles a row) 0.806 / 0.871 and 0.921 / 0.998, 2 + 1 + 1 (4 tiles) 0.574 / 0.615; so a band's
// accumulator, whose rows its running CTAs share, is not taken to spill (on the H100 unmeasured).
// At d = 96 (forty-seventh session, same shape and rounds) the same thresholds hold: one head, windows
// of 2 tiles a row near ties (1 + 1 + 0 of 128 0.328-0.343 / 0.325-0.361, 2 + 1 + 1 of 32 0.325-0.346 /
// 0.333-0.366), of 2.5 and 3 tiles atomic (2 + 1 + 1 of 64 0.316-0.330 / 0.348-0.389, 5 + 1 + 4 of 16
// 0.332-0.359 / 0.370-0.415, 3 + 1 + 3 of 32 0.335-0.353 / 0.434-0.442), random blocks of 128 at 2 a
// row 0.317-0.321 / 0.354-0.356; four heads, a window of 6 tiles 0.543-0.544 / 0.599-0.608; beyond the
// L2 (B1 H4 S65536) 2 + 1 + 1 of 128 0.512-0.514 / 0.538-0.544.
DqSummation choose_dq_summation(const AttentionSpec& spec, bool sm90, double key_tiles_per_row, std::int64_t group,
                                std::string_view forced, std::optional<DqSummation> asked,
                                std::optional<DqSummation> tuned, bool gathered, std::int64_t spilled_key_tiles,
                                double memory_bandwidth, int dkdv_query_cols, bool banded) {
  if (!forced.empty() && forced != "auto" && forced != "atomic" && forced != "pass")
    throw InvalidArgument(fmt::format("SJIT_BACKWARD_DQ = '{}': use atomic, pass or auto (or leave it unset)", forced));
  const bool may_be_atomic = codegen::atomic_dq(spec);  // not where determinism is asked for, nor at d = 256
  if (asked == DqSummation::atomic && !may_be_atomic)
    throw InvalidArgument(fmt::format(
        "attention backward: dq_summation = atomic, but '{}' sums dQ only by its pass ({}): leave dq_summation "
        "unset or ask for pass", key(spec), spec.deterministic ? "deterministic" : "no atomic dQ at this head_dim"));
  if (asked) return *asked;
  if (!may_be_atomic) return DqSummation::pass;
  if (forced == "atomic") return DqSummation::atomic;
  if (forced == "pass") return DqSummation::pass;
  if (tuned) return *tuned;
  if (!sm90) return DqSummation::atomic;  // the mma.sync kernels' crossover is not measured: as before
  // The gathered backward: its dK/dV pass's bulk reductions (a query block's dQ for each key block that
  // sees it) against the gathered dQ pass (reading each query block's key blocks again). Measured on the
  // H100 (thirty-fourth session, docs/attention-log.md, "Landed: the gathered backward"), backward ms,
  // atomic / pass: one query head a K/V head, d = 128 (B2 H16 S8192): blocks of 16 at 0.1 2.91 / 3.74,
  // 0.02 0.96 / 1.12, blocks of 32 at 0.1 1.57 / 1.99; d = 64 (B4 H32 S4096): blocks of 16 at 0.1
  // 1.55 / 1.87, blocks of 32 at 0.1 0.88 / 1.06. Four heads a K/V head, d = 128: blocks of 16 at 0.1
  // 3.45 / 2.90, 0.02 0.90 / 0.80, blocks of 32 at 0.1 1.94 / 1.38. Two heads: blocks of 16 at 0.1
  // 2.78 / 2.95, 0.02 0.83 / 0.84, blocks of 32 at 0.1 1.63 / 1.53: as one.
  // Its reductions are a 64-row step's dQ for every 16 or 32 keys, two to four times the 128-key pass's
  // bytes a product, so an accumulator beyond the L2 costs it far more. On the H200 (thirty-sixth
  // session, one head a K/V head): one head at S = 65536 (64 MB) blocks of 32 at 0.02 / 0.05 / 0.1
  // 3.390 / 2.393, 8.033 / 5.286, 15.807 / 10.447, blocks of 16 at 0.02 / 0.05 6.289 / 4.951, 15.257 /
  // 11.704: the pass 21-34% faster. Within the L2 atomic still wins or ties: at S = 16384 (16 MB)
  // blocks of 32 at 0.05 / 0.1 1.516 / 1.596, 2.914 / 2.964, blocks of 16 at 0.05 2.803 / 3.148; at
  // S = 32768 (32 MB) blocks of 16 at 0.02 / 0.05 2.568 / 2.719, 5.623 / 5.890, blocks of 32 at 0.05 /
  // 0.1 2.931 / 2.836, 6.039 / 5.330 (the pass there, by 3-12%); at S = 8192 (B2 H16) blocks of 32 at
  // 0.1 1.515 / 1.609, blocks of 16 2.806 / 3.191, as on the H100.
  const bool spills = spilled_key_tiles > 0;
  if (gathered) return group >= 4 || spills ? DqSummation::pass : DqSummation::atomic;
  // d = 64 on 64-query dK/dV tiles (pattern blocks of 64, or of 16 and 32 where the walks are short):
  // their atomic dQ lost to the pass at every density measured (above), and on windows of 2.45 tiles a
  // row (forty-eighth session, H200, B4 H32 S4096, atomic / pass: one head 2 + 1 + 1 blocks of 64
  // 0.539-0.553 / 0.448-0.481, 5 + 1 + 4 of 16 0.557-0.562 / 0.484-0.523; four heads, blocks of 64,
  // 0.441-0.444 / 0.411), where a band on 128-query tiles would take atomic (DqPassThresholds::band).
  const int query_cols = dkdv_query_cols > 0 ? dkdv_query_cols
                                             : codegen::default_backward_tiling(spec, codegen::BackwardPart::dkdv, true).block_cols;
  if (spec.head_dim == 64 && query_cols != 128) return DqSummation::pass;
  const DqPassThresholds below = dq_pass_thresholds(memory_bandwidth, spec.head_dim);
  // The accumulator spills: a random pattern's adds land on rows all over the group's and miss the L2;
  // a band's stay in the rows its running CTAs share (above), and its rule is the short sequences'.
  if (!banded && key_tiles_per_row < below.beyond_l2_share * double(spilled_key_tiles))
    return DqSummation::pass;
  // Key tiles a row at S = 8192 are 64 x density: on the H100 24 at 0.375, where four heads a group
  // tie, and about 10 between 0.1 and 0.25, where two heads a group do. A band's adds stay in the L2
  // whatever the group (above).
  const double four_heads = spec.causal == Causal::none ? below.four_heads : below.four_heads_causal;
  const double threshold = banded       ? below.band
                           : group >= 4 ? four_heads
                           : group >= 2 ? below.two_heads
                                        : below.one_head;
  return key_tiles_per_row < threshold ? DqSummation::pass : DqSummation::atomic;
}

// The H100's thresholds are choose_dq_summation's measurements (above). On the H200 (thirty-sixth
// session, B2 H16 S8192 D128, backward ms, atomic / pass) its faster DRAM makes atomic dQ's reductions
// cheaper, and the crossovers of the GQA groups move down: two heads a K/V head 3 tiles 0.450 / 0.454,
// 6 tiles 0.650 / 0.728, 10 tiles 0.979 / 1.120, 16 tiles 1.493 / 1.655; four heads 6 tiles 0.735 /
// 0.714, 16 tiles 1.539 / 1.685, 24 tiles 2.167 / 2.487, 32 tiles 2.874 / 3.210. One head: 1 tile
// 0.338 / 0.299, 2 tiles 0.361 / 0.370 (a tie; in the forty-sixth session 0.364-0.369 / 0.394-0.399,
// so the pass below 2 since), 3 tiles 0.437 / 0.476; and d = 64 the
// pass everywhere: dense 3.869 / 3.162, 16 tiles 1.047 / 0.912, 6 tiles 0.471 / 0.427, 1 tile 0.243 /
// 0.189. Causal top-left, whose rows see about half the tiles counted: four heads 6 tiles 0.504 /
// 0.468, 16 tiles 1.067 / 0.999, so they keep the H100's 20; two heads 3 tiles 0.384 / 0.372, 6 tiles
// 0.477 / 0.506, as without the mask. (d = 96, four heads: 6 tiles 0.546 / 0.575, 16 tiles 1.210 /
// 1.370.) The step between the two cards (3.35 and 4.8 TB/s) is put at 4 TB/s, unmeasured between.
// d = 64 (the dK/dV pass on 128-query tiles, each warpgroup's dQ product over half of them; forty-second
// session, H200, B4 H32 S4096 unless said, backward ms queued, atomic / pass): one head a K/V head 1
// tile 0.402 / 0.356 and 0.397 / 0.344, 2 tiles 0.401 / 0.423 and 0.423 / 0.434, 3 tiles 0.532 /
// 0.540, dense 3.011 / 3.440; two heads 2 tiles 0.354 / 0.395, 3 tiles 0.452 / 0.481, 8 tiles 0.893
// / 1.020; four heads 3 tiles 0.439 / 0.467, 8 tiles 0.921 / 0.981, 16 tiles 1.672 / 1.864; causal
// top-left, one head 2 tiles 0.382 / 0.422, 3 tiles 0.420 / 0.452, four heads 8 tiles 0.639 / 0.663;
// beyond the L2 (B1 H4 S131072, 67 MB a group) 20 of 1024 tiles 2.207 / 2.446, 51 tiles 5.544 /
// 6.101. So the pass only where rows see one tile, whatever the group, and beyond the L2 below 1% of
// the key tiles (atomic wins at 2%, where d = 128 ties). Bands differ (forty-seventh session, same
// shape, two rounds): windows of blocks of 128, one head, 0 + 1 + 0 (1 tile a row) 0.398-0.400 /
// 0.349-0.357, 1 + 1 + 0 (1.98) 0.497-0.509 / 0.404-0.440, 1 + 1 + 1 (2.97) 0.496-0.500 / 0.538-0.540,
// 2 + 1 + 1 (3.97) 0.581-0.586 / 0.634-0.646; 1 + 1 + 0 with two heads 0.408-0.416 / 0.382-0.383, with
// four 0.372-0.374 / 0.344-0.346; 1 + 1 + 1 with four 0.411-0.417 / 0.453-0.460 (random blocks at 2 a
// row, one head, in the same call: 0.398-0.415 / 0.442-0.446). So a band takes the pass below 2 tiles a
// row, as at d = 128. Not measured on the H100, whose d = 128
// crossovers for GQA groups and beyond the L2 lie higher (kept there for the latter); `sjit tune
// attention --backward` measures a device's own.
DqPassThresholds dq_pass_thresholds(double memory_bandwidth, int head_dim) {
  if (head_dim == 64)
    return {.four_heads = 1.5, .four_heads_causal = 1.5, .two_heads = 1.5, .one_head = 1.5, .band = 2,
            .beyond_l2_share = memory_bandwidth >= 4e12 ? 0.01 : 0.3};
  if (memory_bandwidth >= 4e12)
    return {.four_heads = 8, .four_heads_causal = 20, .two_heads = 4, .one_head = 2, .band = 2,
            .beyond_l2_share = 0.02};
  return {.four_heads = 20, .four_heads_causal = 20, .two_heads = 8, .one_head = 2.5, .band = 2,
          .beyond_l2_share = 0.3};
}

std::string_view forced_dq_summation() {
  const char* env = std::getenv("SJIT_BACKWARD_DQ");
  return env == nullptr ? std::string_view() : std::string_view(env);
}

}  // namespace sjit::attention

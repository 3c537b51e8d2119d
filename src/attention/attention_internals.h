// What the library's own code (the tuners) asks of an Attention beyond its public interface.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "sparsejit/attention.h"

namespace sjit {

struct AttentionInternals {
  // What the backward of args runs, from one plan, and what it chose its way of summing dQ by: the
  // mean number of active key tiles (of the 128-key dK/dV pass's tiling, counted contiguous) a query
  // row sees, and the rest of a dQ tuning's bucket. Checks args as backward does; launches nothing.
  struct BackwardChoices {
    BackwardWalk walk = BackwardWalk::tiles;  // Attention::backward_walk
    DqSummation dq = DqSummation::atomic;     // Attention::dq_summation
    std::string tiling;                       // Attention::backward_tiling
    int query_tile_cols = 0;                  // the queries of the dK/dV pass's tiles; 0 on the gathered walk
    double key_tiles_per_row = 0;
    bool accumulator_spills = false;  // atomic dQ's working set outgrows the L2 (backward_policy.h)
    bool narrow_queries = false;      // d = 64's 64-query dK/dV tiles (attention/packed_queries.h)
    bool banded = false;              // its dK/dV walks make a band (attention::contiguous_walks)
  };
  static BackwardChoices backward_choices(Attention& attention, const AttentionBackwardArgs& args);

  // What a forward of `spec` (bsr) with `pattern` and these heads runs on the current device where no
  // tiling is asked for or stored, whatever a stored tiling says: `untuned`, the tiling
  // (Attention::forward_config of an untuned object: with small pattern blocks on Hopper a pick per
  // pattern, a stored pick for it included where the autotune policy is on); `picks`, the tilings it
  // picks among there, named as a tuning stores a pick ("narrow", "wide", "gathered_heads=H"; empty
  // where it does not pick per pattern); `heads`, the query heads a CTA of the gathered kernel could
  // take (the stored pick's bucket). The forward's tuner times `untuned` as the default and the picks
  // first.
  struct ForwardPicks {
    AttentionConfig untuned;
    std::vector<std::pair<std::string, AttentionConfig>> picks;
    int heads = 1;
  };
  static ForwardPicks forward_picks(const AttentionSpec& spec, const BlockPattern& pattern, std::int64_t heads_q,
                                    std::int64_t heads_kv);
};

}  // namespace sjit

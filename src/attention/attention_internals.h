// What the library's own code (the dQ tuner) asks of an Attention beyond its public interface.
#pragma once

#include "sparsejit/attention.h"

namespace sjit {

struct AttentionInternals {
  // The mean number of active key tiles (of the dK/dV pass's tiling) a query row of args sees: what
  // the backward chooses its way of summing dQ by. Checks args as backward does; launches nothing.
  static double backward_key_tiles_per_row(Attention& attention, const AttentionBackwardArgs& args);
};

}  // namespace sjit

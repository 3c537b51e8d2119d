#!/usr/bin/env python3
"""Instruments a copy of the source tree for forward_report.py: where the persistent forward's time goes.

  mkdir .snap-ftl && git archive HEAD | tar -x -C .snap-ftl
  python3 scripts/timeline/forward_instrument.py .snap-ftl
  # on the GPU machine, carrying .snap-ftl:
  cmake -S .snap-ftl -B .snap-ftl/build-gpu -DCMAKE_BUILD_TYPE=Release && cmake --build .snap-ftl/build-gpu --target sjit
  SJIT_FTIMELINE=$OUT/ftl .snap-ftl/build-gpu/sjit bench attention --iters 3 --density 0.1
  python3 scripts/timeline/forward_report.py $OUT/ftl.sparse $OUT/ftl.dense

The wgmma_ws kernel's math thread 0 stamps %globaltimer when each item's Q and record are ready, when
its walk is done (and its tile count) and when its output is staged; the Q thread when it is done.
Since the fourteenth session the walk leaves its last P V to the loop over items, and the output is
written under the next item's first S = Q K^T: "walk done" is before that last P V, and "staged" falls
in the next item.
512 words a CTA (up to 126 items). Each edit names the text it expects; where the code has changed since, it
stops and says which.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from common import device_stamps, patch, patch_forward_launch  # noqa: E402

WORDS = 512
root = sys.argv[1]

patch_forward_launch(root, 'SJIT_FTIMELINE', WORDS)
patch(root + '/templates/sparsejit/attention_forward_sm90_ws.cuh', [
("""template <class Cfg>
__global__ void __launch_bounds__(AttentionWsLayout<Cfg>::threads, 1)""", device_stamps('FTL', WORDS) + """template <class Cfg>
__global__ void __launch_bounds__(AttentionWsLayout<Cfg>::threads, 1)"""),
("""  if (threadIdx.x == 0) {
    for (int b = 0; b < 2; ++b) {""", """  if (threadIdx.x == 0) {
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    FTL(0, sm);
    FTL(1, timeline_now());
  }
  if (threadIdx.x == 0) {
    for (int b = 0; b < 2; ++b) {"""),
("""      bulk_wait_done();
      return;
    }""", """      bulk_wait_done();
      FTL(4, timeline_now());
      return;
    }"""),
("""  PackedOutput<Tr> packed;
""", """  PackedOutput<Tr> packed;
  int pending_n = 0;  // the pending item's place in the CTA's order
"""),
("""    mbarrier_arrive(barrier(L::q_empty + pending));
""", """    mbarrier_arrive(barrier(L::q_empty + pending));
    if (threadIdx.x == 0) FTL(8 + 4 * pending_n + 2, timeline_now());
"""),
("""    const int count = item_records[b].count;
""", """    const int count = item_records[b].count;
    if (threadIdx.x == 0) { FTL(8 + 4 * n, timeline_now()); FTL(3, n); }
"""),
("""    pending = b;
""", """    pending = b;
    pending_n = n;
"""),
("""    tiles_seen += count;
  }
}""", """    tiles_seen += count;
    if (threadIdx.x == 0) { FTL(8 + 4 * n + 1, timeline_now()); FTL(8 + 4 * n + 3, count); }
  }
  if (threadIdx.x == 0) FTL(2, timeline_now());
}""")])

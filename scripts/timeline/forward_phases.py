#!/usr/bin/env python3
"""Instruments a copy of the source tree for forward_phases_report.py: the persistent forward's
(wgmma_ws) math warps, phase by phase, in SM clock cycles.

  mkdir .snap-fph && git archive HEAD | tar -x -C .snap-fph
  python3 scripts/timeline/forward_phases.py .snap-fph
  # on the GPU machine, carrying .snap-fph:
  cmake -S .snap-fph -B .snap-fph/build-gpu -DCMAKE_BUILD_TYPE=Release && cmake --build .snap-fph/build-gpu --target sjit
  SJIT_FPHASES=$OUT/fph .snap-fph/build-gpu/sjit bench attention --iters 3 --density 1,0.1
  python3 scripts/timeline/forward_phases_report.py $OUT/fph.dense $OUT/fph.sparse

forward_instrument.py stamps a few moments of each item with the global timer; this one splits all of
a math thread's time into eight phases, so that what an item costs beyond its tiles shows where it
goes. Every math thread sums %clock64 laps into eight registers (no branch on the thread: a divergent
branch near the wgmma would change the code under test, ptxas C7520) and the first thread of each
warpgroup writes them at the end. The phases, an item's first:
  0  the previous item's last P V: the wait for its V and for the turn, the issue
  1  the item's Q and record, the wait for that P V, the previous output packed
  2  the first tile's K, the wait for the turn
  3  the first S = Q K^T issued, the previous output written to shared memory under it (block-sparse)
  4  the wait for that S, the turn handed over, the previous output written (dense), the first
     softmax, P packed
and each later tile's:
  5  its K, the previous tile's V, the wait for the turn
  6  S and the previous tile's P V issued, the wait for S, the turn handed over
  7  the softmax, the wait for P V, the output rescaled and P packed
Where a block-sparse item issues its first two S together (WarpgroupRows::walk, early_second_scores),
phases 2-4 hold its tile 0 with both S issued and tile 1's K waited for in phase 3, and tile 1 is a
later tile whose phase 6 issues only P V of tile 0.
Words a CTA: 16 a warpgroup (the eight sums, items, tiles, all cycles from the loop's start).
Branch experiment/ws-boundary-one-turn has a version for the structure tried there.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from common import patch, patch_forward_launch  # noqa: E402

WORDS = 32
root = sys.argv[1]

patch_forward_launch(root, 'SJIT_FPHASES', WORDS)
patch(root + '/templates/sparsejit/attention_forward_sm90.cuh', [
    ("""  unsigned pa[Tr::block_n / 16][4];  // P of one tile as the A fragments of block_n / 16 k-steps
""", """  unsigned pa[Tr::block_n / 16][4];  // P of one tile as the A fragments of block_n / 16 k-steps
  unsigned phase_cycles[8];
  unsigned long long last_clock;
  __device__ __forceinline__ void phase_start() {
#pragma unroll
    for (int k = 0; k < 8; ++k) phase_cycles[k] = 0;
    last_clock = clock64();
  }
  template <int k>
  __device__ __forceinline__ void lap() {
    const unsigned long long now = clock64();
    phase_cycles[k] += unsigned(now - last_clock);
    last_clock = now;
  }
"""),
    # The overlapped walk's turn (the sequential walk has no begin_turn; issue_last_values issues P V).
    ("""        feed.begin_turn();
        wgmma_fence();
        wgmma_fence_operands(o[0]);
        issue_scores(""", """        feed.begin_turn();
        if (j > 0) lap<5>(); else lap<2>();
        wgmma_fence();
        wgmma_fence_operands(o[0]);
        issue_scores("""),
    ("""          feed.end_turn();
        } else {""", """          feed.end_turn();
          lap<6>();
        } else {"""),
    ("""          if constexpr (Feed::scores_cover_first) on_first_scores();
          wgmma_wait<0>();""", """          if constexpr (Feed::scores_cover_first) on_first_scores();
          lap<3>();
          wgmma_wait<0>();"""),
    ("""        rescale_and_pack();
        previous = slot;""", """        rescale_and_pack();
        if (j > 0) lap<7>(); else lap<4>();
        previous = slot;"""),
    # The block-sparse walk's first two tiles (Feed::early_second_scores): tile 0 as an item's first,
    # tile 1 as a later tile.
    ("""          feed.begin_turn();
          wgmma_fence();
          issue_scores(s_first,""", """          feed.begin_turn();
          lap<2>();
          wgmma_fence();
          issue_scores(s_first,"""),
    ("""on_first_scores();  // under both products
""", """on_first_scores();  // under both products
          lap<3>();
"""),
    ("""          pack(s_first);  // P V of tile 0 then overwrites o (no rescale, no reset)
""", """          pack(s_first);  // P V of tile 0 then overwrites o (no rescale, no reset)
          lap<4>();
"""),
    ("""          feed.begin_turn();
          wgmma_fence();
          wgmma_fence_operands(o[0]);
          issue_values<true>""", """          feed.begin_turn();
          lap<5>();
          wgmma_fence();
          wgmma_fence_operands(o[0]);
          issue_values<true>"""),
    ("""          wgmma_fence_operands(s[0]);
          feed.end_turn();
""", """          wgmma_fence_operands(s[0]);
          feed.end_turn();
          lap<6>();
"""),
    ("""          rescale_and_pack(s);
          previous = slot1;""", """          rescale_and_pack(s);
          lap<7>();
          previous = slot1;"""),
])
patch(root + '/templates/sparsejit/attention_forward_sm90_ws.cuh', [
    ("""  int tiles_seen = 0;
  for (int n = 0;; ++n) {""", """  int tiles_seen = 0;
  rows.phase_start();
  const unsigned long long loop_start = rows.last_clock;
  int items_seen = 0;
  for (int n = 0;; ++n) {"""),
    ("""    const int b = n % 2;
    mbarrier_wait(barrier(L::q_full + b), (n / 2) & 1);""", """    rows.template lap<0>();
    const int b = n % 2;
    mbarrier_wait(barrier(L::q_full + b), (n / 2) & 1);"""),
    ("""    if (pending >= 0) pack_pending();
    if (count <= 0) {""", """    if (pending >= 0) pack_pending();
    rows.template lap<1>();
    if (count <= 0) {"""),
    ("""    pending = b;
    tiles_seen += count;
  }
}""", """    pending = b;
    tiles_seen += count;
    ++items_seen;
  }
  if (p.timeline && threadIdx.x % 128 == 0) {
    unsigned long long* out = p.timeline + blockIdx.x * 32ull + group * 16;
#pragma unroll
    for (int k = 0; k < 8; ++k) out[k] = rows.phase_cycles[k];
    out[8] = items_seen;
    out[9] = tiles_seen;
    out[10] = clock64() - loop_start;
  }
}"""),
])

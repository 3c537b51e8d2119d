// The persistent forward's last round split across CTAs (attention_forward_sm90_ws.cuh): which key
// tiles of which item each CTA takes. Plain code, compiled by NVRTC for the kernel and by the host
// compiler for the tests, which check that the pieces cut every item exactly.
//
// Rounds of gridDim.x items leave the last one part full (2048 items on 132 CTAs: 16 rounds for a
// mean of 15.52), and the CTAs of that round would finish an item after the others have none. So the
// last `items` items (tail_items) are shared out by key tiles among CTAs 0 .. ctas - 1 (tail_ctas):
// measured in units of 1 / ctas of an item, item t spans [t ctas, (t + 1) ctas) and CTA c takes
// [c items, (c + 1) items), so a CTA has pieces of at most two items (items <= ctas). A piece is the
// item's key tiles in proportion to its units.
//
// The piece of an item cut in two or more that ends it, in CTA last_cta(t), merges the others
// (FlashDecoding's merge): each other piece writes its output, normalized and rounded as a whole
// item's, and its rows' log-sum-exp to the scratch slot of its CTA, and counts itself in the item's
// counters; the merging piece waits for them, folds them in CTA order with its own rows, still in
// registers, and stores the item. A CTA walks its pieces last item first, so that its piece which
// others wait for (the start of its last item) comes first and the piece that waits (the end of its
// first item) last, when the lower CTAs' pieces are long done; and since a CTA waits only for lower
// CTAs, launched before it, no wait can outlast a CTA that is not yet running.
#pragma once

#if defined(__CUDACC__)
#define SJIT_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define SJIT_HOST_DEVICE inline
#endif

namespace sjit_kernels {

// Key tiles [begin, end) of an item.
struct TileRange {
  int begin, end;
  SJIT_HOST_DEVICE bool empty() const { return end <= begin; }
};

struct LastRound {
  int items, ctas;
  SJIT_HOST_DEVICE int first_item(int c) const { return c * items / ctas; }
  SJIT_HOST_DEVICE int last_item(int c) const { return ((c + 1) * items - 1) / ctas; }
  SJIT_HOST_DEVICE int first_cta(int t) const { return t * ctas / items; }
  SJIT_HOST_DEVICE int last_cta(int t) const { return ((t + 1) * ctas - 1) / items; }
  // The key tiles of item t (count tiles) that CTA c takes; empty where its units hold no tile.
  // 32-bit products: the host splits only where count * ctas fits in 31 bits.
  SJIT_HOST_DEVICE TileRange tiles(int t, int c, int count) const {
    const int share_begin = c * items, share_end = (c + 1) * items, item_begin = t * ctas, item_end = (t + 1) * ctas;
    const int lo = (share_begin > item_begin ? share_begin : item_begin) - item_begin;
    const int hi = (share_end < item_end ? share_end : item_end) - item_begin;
    if (hi <= lo) return {0, 0};
    return {int(unsigned(lo) * unsigned(count) / unsigned(ctas)), int(unsigned(hi) * unsigned(count) / unsigned(ctas))};
  }
  // Pieces of item t that hold a key tile: 1 means one CTA takes it whole.
  SJIT_HOST_DEVICE int pieces(int t, int count) const {
    int n = 0;
    for (int c = first_cta(t); c <= last_cta(t); ++c) n += !tiles(t, c, count).empty();
    return n;
  }
  // The CTA whose piece ends item t: it merges the item's other pieces, which lower CTAs hold.
  SJIT_HOST_DEVICE int merger(int t) const { return last_cta(t); }
  // Whether CTA c's piece of item t is one the merger waits for. A CTA has at most one such piece, the
  // start of its last item, so the scratch needs one slot a CTA (slot c).
  SJIT_HOST_DEVICE bool waited_for(int t, int c, int count) const {
    return c != merger(t) && !tiles(t, c, count).empty();
  }
};

}  // namespace sjit_kernels

#undef SJIT_HOST_DEVICE

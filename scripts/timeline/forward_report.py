#!/usr/bin/env python3
"""Where the persistent forward's (wgmma_ws) time goes, from the dumps of a tree instrumented by
forward_instrument.py (next to this file). Words a CTA: SM, start, math end, items, copy thread's end, then
4 an item from word 8: Q and record ready, walk done, output staged, key tiles.

  python3 forward_report.py PREFIX.sparse [more dumps]
"""
import struct, sys, statistics as st


def report(path):
    data = open(path, 'rb').read()
    ctas = [struct.unpack_from('<512Q', data, 4096 * i) for i in range(len(data) // 4096)]
    ctas = [c for c in ctas if c[1]]
    t0 = min(c[1] for c in ctas)
    end = max(max(c[2], c[4]) for c in ctas)
    span = end - t0
    print(f"== {path}: {len(ctas)} CTAs, span {span / 1000:.1f} us")
    waits, walks, stages, tiles, first_wait, tail = [], [], [], [], [], []
    per_tile = {}
    for c in ctas:
        n = c[3]
        prev_end = None
        for i in range(n):
            ready, walk, staged, count = c[8 + 4 * i], c[9 + 4 * i], c[10 + 4 * i], c[11 + 4 * i]
            if not (ready and walk and staged):
                continue
            if prev_end is None:
                first_wait.append(ready - c[1])
            else:
                waits.append(ready - prev_end)
            walks.append(walk - ready)
            stages.append(staged - walk)
            tiles.append(count)
            per_tile.setdefault(count, []).append(walk - ready)
            prev_end = staged
        tail.append(end - c[2])
    us = lambda v: v / 1000
    items = len(walks)
    print(f"  items {items} ({items / len(ctas):.2f} a CTA), tiles an item {st.mean(tiles):.2f}")
    print(f"  CTA start -> first item ready  {us(st.mean(first_wait)):7.2f} us")
    print(f"  item ready -> walk done         {us(st.mean(walks)):7.2f} us an item ({us(sum(walks)) / len(ctas):.1f} us a CTA, {100 * sum(walks) / (len(ctas) * span):.1f}%)")
    print(f"  walk done -> output staged      {us(st.mean(stages)):7.2f} us an item ({100 * sum(stages) / (len(ctas) * span):.1f}%)")
    print(f"  staged -> next item ready       {us(st.mean(waits)):7.2f} us an item ({100 * sum(waits) / (len(ctas) * span):.1f}%)")
    print(f"  math end -> kernel end (tail)   {us(st.mean(tail)):7.2f} us a CTA ({100 * sum(tail) / (len(ctas) * span):.1f}%)")
    for count in sorted(per_tile):
        v = per_tile[count]
        print(f"  walks of {count:3d} tiles: {len(v):5d}, {us(st.mean(v)):7.2f} us ({us(st.mean(v)) / max(count, 1):.3f} us a tile)")


for path in sys.argv[1:]:
    report(path)

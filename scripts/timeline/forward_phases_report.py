#!/usr/bin/env python3
"""The persistent forward's math time phase by phase, from the dumps of a tree instrumented by
forward_phases.py (next to this file; it lists the phases). Cycles an item for the item's first tile
and its boundary (phases 0-4), cycles a tile for the later tiles (5-7).

  python3 forward_phases_report.py PREFIX.dense PREFIX.sparse
"""
import struct
import sys

NAMES = ['last P V: V, turn, issue', 'next Q, P V done, output packed', 'first K, turn',
         'first S issued, output written', 'first S done, softmax, pack',
         'K, V, turn', 'S + P V issued, S done', 'softmax, P V done, pack']


def report(path):
    data = open(path, 'rb').read()
    groups = []
    for i in range(len(data) // 256):
        words = struct.unpack_from('<32Q', data, 256 * i)
        for g in range(2):
            w = words[16 * g:16 * g + 16]
            if w[8]:
                groups.append(w)
    if not groups:
        # The dump of a run whose kernel was not the persistent one (at d = 64 the dense default is
        # `wgmma`), or of a kernel that never finished an item.
        print(f"== {path}: no wgmma_ws warpgroup wrote phases (check the config column of the bench)")
        return
    items = sum(w[8] for w in groups)
    tiles = sum(w[9] for w in groups)
    later = tiles - items
    total = sum(w[10] for w in groups)
    print(f"== {path}: {len(groups)} warpgroups, {items / len(groups):.2f} items and {tiles / items:.2f} tiles an item")
    print(f"  cycles a warpgroup: {total / len(groups):.0f}; an item {total / items:.0f}")
    for k, name in enumerate(NAMES):
        s = sum(w[k] for w in groups)
        per = f"{s / items:8.0f} an item" if k < 5 else f"{s / max(later, 1):8.0f} a later tile"
        print(f"  {k} {name:34s} {per}   ({100 * s / total:5.1f}%)")
    boundary = sum(sum(w[k] for k in range(5)) for w in groups) / items
    tile = sum(sum(w[k] for k in range(5, 8)) for w in groups) / max(later, 1)
    print(f"  an item's first tile and boundary {boundary:.0f} cycles against {tile:.0f} a later tile:"
          f" {boundary - tile:.0f} over")


for path in sys.argv[1:]:
    report(path)

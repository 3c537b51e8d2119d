#!/usr/bin/env python3
"""Where the Hopper dK/dV pass's time goes, CTA by CTA, from the dumps of an instrumented tree.

dkdv_instrument.py (next to this file) adds to a copy of the source tree: %globaltimer stamps at each step of
a dK/dV CTA's life (start, walk built, K/V landed, first tile, loop end, stores done, dQ adds landed,
conversion done, copy warp done), its SM, its tile count and the cycles its math warp waited for full
ring slots and for its dQ buffer: 16 words a CTA. With SJIT_TIMELINE=PREFIX set, each backward call
synchronizes and writes them to PREFIX.sparse (a pattern) or PREFIX.dense.

  python3 dkdv_report.py PREFIX.sparse [more dumps]

prints, a share of the kernel's SM time each: the gaps between CTAs, idle SMs at the start and the
tail, the CTA's prologue (walk, K/V, first tile), its loop (and the waits in it), its stores and what
ends after them; the loop's cost a tile; and the same over the first, middle and last third of the run.
The words, in order: SM, start, walk built, K/V landed, first tile, wg0 loop end, stores done, dQ adds
landed, conversion done, tiles, full-slot wait cycles, dQ-buffer wait cycles, copy warp done, clock at
the first tile, wg1 loop end, clock at the loop end.
"""
import struct, sys, collections, statistics as st

def load(path):
    data = open(path, 'rb').read()
    n = len(data) // 128
    return [struct.unpack_from('<16Q', data, 128 * i) for i in range(n)]

def report(path):
    rows = [r for r in load(path) if r[1]]
    print(f"== {path}: {len(rows)} CTAs")
    t0 = min(r[1] for r in rows)
    us = lambda ns: ns / 1000.0
    ctas = []
    for r in rows:
        sm, start, synced, kv, tile0, loop_end, stored, dq_done, conv_done, count, full_wait, dq_wait, copy_done, c13, t14, c15 = r
        ends = [x for x in (stored, dq_done, conv_done, copy_done, loop_end, t14) if x]
        end = max(ends)
        cyc = c15 - c13
        ns_per_cycle = (loop_end - tile0) / cyc if cyc > 0 and loop_end > tile0 else 0
        ctas.append(dict(sm=sm, start=start, end=end, synced=synced, kv=kv, tile0=tile0, loop_end=loop_end, stored=stored,
                         dq_done=dq_done, conv_done=conv_done, copy_done=copy_done, count=count, wg1_end=t14,
                         full_wait=full_wait * ns_per_cycle, dq_wait=dq_wait * ns_per_cycle, npc=ns_per_cycle))
    span = max(c['end'] for c in ctas) - t0
    by_sm = collections.defaultdict(list)
    for c in ctas: by_sm[c['sm']].append(c)
    gaps, head_idle, tail_idle = [], [], []
    tend = max(c['end'] for c in ctas)
    for sm, cs in by_sm.items():
        cs.sort(key=lambda c: c['start'])
        head_idle.append(cs[0]['start'] - t0)
        tail_idle.append(tend - cs[-1]['end'])
        for a, b in zip(cs, cs[1:]): gaps.append(b['start'] - a['end'])
    sms = len(by_sm)
    m = lambda f: st.mean(f(c) for c in ctas)
    print(f"span {us(span):.1f} us on {sms} SMs, {len(ctas)/sms:.2f} CTAs an SM, tiles a CTA {m(lambda c: c['count']):.2f}")
    tot = sms * span
    parts = {
        'launch gap (end -> next start)': sum(gaps),
        'idle at start': sum(head_idle),
        'idle at tail': sum(tail_idle),
        'build walk + sync (start->synced)': sum(c['synced'] - c['start'] for c in ctas),
        'K/V wait (synced->kv)': sum(c['kv'] - c['synced'] for c in ctas),
        'first tile wait (kv->tile0)': sum(c['tile0'] - c['kv'] for c in ctas),
        'loop (tile0->loop end, wg0)': sum(c['loop_end'] - c['tile0'] for c in ctas),
        '  of which waiting for full slots': sum(c['full_wait'] for c in ctas),
        '  of which waiting for dQ buffer': sum(c['dq_wait'] for c in ctas),
        'stores (loop end->stored)': sum(c['stored'] - c['loop_end'] for c in ctas),
        'after stores (stored->CTA end)': sum(c['end'] - c['stored'] for c in ctas),
    }
    for k, v in parts.items():
        print(f"  {k:40s} {us(v)/sms:8.1f} us an SM  {100*v/tot:5.1f}%  ({us(v)/len(ctas):6.2f} us a CTA)")
    late = collections.Counter()
    for c in ctas:
        last = max(('stored', c['stored']), ('dq_done', c['dq_done']), ('conv_done', c['conv_done']), ('copy_done', c['copy_done']), key=lambda x: x[1])
        late[last[0]] += 1
    print("  last to finish:", dict(late))
    print(f"  dq_done - stored {us(m(lambda c: c['dq_done'] - c['stored'] if c['dq_done'] else 0)):.2f} us, "
          f"conv_done - start {us(m(lambda c: c['conv_done'] - c['start'] if c['conv_done'] else 0)):.2f} us, "
          f"wg1 end - wg0 end {us(m(lambda c: c['wg1_end'] - c['loop_end'])):.2f} us, ns/cycle {m(lambda c: c['npc']):.3f}")
    # Loop time against tiles: per-tile cost and a fixed part.
    xs = [c['count'] for c in ctas if c['count'] > 0]
    ys = [us(c['loop_end'] - c['tile0']) for c in ctas if c['count'] > 0]
    if len(set(xs)) > 1:
        mx, my = st.mean(xs), st.mean(ys)
        b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
        print(f"  loop = {my - b * mx:.2f} + {b:.3f} x tiles (us)")
    else:
        print(f"  loop a tile {st.mean(ys) / xs[0]:.3f} us ({xs[0]} tiles)")
    # Over time: the mean loop rate in the first, middle and last thirds.
    for name, lo, hi in (('first third', 0, 1/3), ('middle', 1/3, 2/3), ('last third', 2/3, 1.01)):
        sel = [c for c in ctas if c['count'] and lo <= (c['start'] - t0) / span < hi]
        if sel:
            print(f"  {name:12s}: {len(sel)} CTAs, loop a tile {st.mean(us(c['loop_end'] - c['tile0']) / c['count'] for c in sel):.3f} us,"
                  f" prologue {st.mean(us(c['tile0'] - c['start']) for c in sel):.2f} us, full waits a tile "
                  f"{st.mean(us(c['full_wait']) / c['count'] for c in sel):.3f} us")

for path in sys.argv[1:]:
    report(path)

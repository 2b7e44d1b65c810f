#!/usr/bin/env python3
"""A small offline planner for allocsim's plan: policy (and its tests).

    python3 planner.py [--order size|best] INPUT OUTPUT

INPUT is a MiniMalloc problem (id,lower,upper,size: a buffer lives over
[lower, upper)); OUTPUT is written as its solution, the same rows in the same
order with an offset column (id,lower,upper,size,offset). Standard library
only (Python 3.8 or later).

--order size (the default) is greedy by size with first fit: buffers by
decreasing size (the lower id first among equals), each at the lowest offset
where it overlaps no buffer already placed whose lifetime meets its own.

--order best tries several greedy orders (size, lifetime, area, and the
most loaded moment of a buffer's lifetime) each with first fit and with best
fit (the smallest gap that holds it), then improves the best by a search
after MiniMalloc (Moffitt, ASPLOS 2023): buffers placed in order of offset,
each at the top of the placed buffers its lifetime meets, with a node budget
(--nodes, default 20000); it writes the lowest plan found.
"""

import argparse
import csv
import sys


def read_problem(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    bufs = []
    for r in rows:
        lower, upper, size = int(r["lower"]), int(r["upper"]), int(r["size"])
        if upper <= lower:
            sys.exit("buffer %s: empty lifetime [%d, %d)" % (r["id"], lower, upper))
        bufs.append((r["id"], lower, upper, size))
    return bufs


def meets(a, b):
    return a[1] < b[2] and b[1] < a[2]


def conflicts(bufs):
    """For each buffer, the indices of the buffers whose lifetimes meet it."""
    order = sorted(range(len(bufs)), key=lambda k: bufs[k][1])
    out = [[] for _ in bufs]
    live = []
    for k in order:
        lower = bufs[k][1]
        live = [j for j in live if bufs[j][2] > lower]
        for j in live:
            out[k].append(j)
            out[j].append(k)
        live.append(k)
    return out


def place(bufs, conf, order, best_fit):
    """Greedy placement in order; returns the offsets and the peak."""
    offs = [None] * len(bufs)
    peak = 0
    for k in order:
        size = bufs[k][3]
        taken = sorted((offs[j], offs[j] + bufs[j][3]) for j in conf[k] if offs[j] is not None)
        at, gap, end = None, None, 0
        for lo, hi in taken:
            if lo >= end + size:
                if not best_fit:
                    at = end
                    break
                if gap is None or lo - end < gap:
                    at, gap = end, lo - end
            end = max(end, hi)
        if at is None:
            at = end
        offs[k] = at
        peak = max(peak, at + size)
    return offs, peak


def greedy_orders(bufs):
    n = len(bufs)
    life = lambda k: bufs[k][2] - bufs[k][1]
    # The load (live bytes) at each start, and each buffer's most loaded moment.
    times = sorted({b[1] for b in bufs})
    load = {}
    for t in times:
        load[t] = sum(b[3] for b in bufs if b[1] <= t < b[2])
    contention = [max(load[t] for t in times if b[1] <= t < b[2]) for b in bufs]
    ids = range(n)
    return {
        "size": sorted(ids, key=lambda k: (-bufs[k][3], k)),
        "size-lifetime": sorted(ids, key=lambda k: (-bufs[k][3], -life(k), k)),
        "lifetime": sorted(ids, key=lambda k: (-life(k), -bufs[k][3], k)),
        "area": sorted(ids, key=lambda k: (-life(k) * bufs[k][3], k)),
        "contention": sorted(ids, key=lambda k: (-contention[k], -bufs[k][3], -life(k), k)),
    }


def search(bufs, conf, bound, nodes):
    """MiniMalloc's canonical search for a plan under bound: at each step,
    among the buffers not placed, those that can go lowest (at the top of
    their placed conflicts) are tried in turn; returns offsets or None."""
    n = len(bufs)
    offs = [None] * n
    budget = [nodes]
    # The problem's moments: each buffer's start; a buffer is live there when
    # its lifetime holds it. Prune: at any moment, the bytes of unplaced
    # buffers live there must fit above the lowest free height there... kept
    # simple: placed buffers' tops plus unplaced sizes within the bound.
    def floor(k):
        return max((offs[j] + bufs[j][3] for j in conf[k] if offs[j] is not None), default=0)

    def rec(left, minoff):
        if not left:
            return True
        budget[0] -= 1
        if budget[0] < 0:
            return False
        cands = []
        for k in left:
            f = floor(k)
            if f + bufs[k][3] > bound:
                return False
            cands.append((f, k))
        low = min(c[0] for c in cands)
        # Canonical: offsets never decrease along the placement.
        low = max(low, minoff)
        # Section pruning: buffers left that are live with a given buffer
        # must stack within the bound above their floors (a cheap check on
        # each left buffer's conflicts).
        for f, k in cands:
            need = bufs[k][3] + sum(bufs[j][3] for j in conf[k] if offs[j] is None and bufs[j][1] <= bufs[k][1] < bufs[j][2])
            if max(f, low) + need > bound:
                return False
        tried = sorted((c for c in cands if c[0] <= low), key=lambda c: (-bufs[c[1]][3], -(bufs[c[1]][2] - bufs[c[1]][1]), c[1]))
        for f, k in tried:
            offs[k] = low
            if rec([j for j in left if j != k], low):
                return True
            offs[k] = None
            if budget[0] < 0:
                return False
        return False

    sys.setrecursionlimit(max(1000, 4 * n + 100))
    if rec(list(range(n)), 0):
        return offs
    return None


def lower_bound(bufs):
    events = sorted([(b[1], b[3]) for b in bufs] + [(b[2], -b[3]) for b in bufs], key=lambda e: (e[0], e[1]))
    live = peak = 0
    for _, d in events:
        live += d
        peak = max(peak, live)
    return peak


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--order", choices=["size", "best"], default="size")
    ap.add_argument("--nodes", type=int, default=20000)
    ap.add_argument("input")
    ap.add_argument("output")
    a = ap.parse_args()
    bufs = read_problem(a.input)
    conf = conflicts(bufs)
    if a.order == "size":
        offs, peak = place(bufs, conf, sorted(range(len(bufs)), key=lambda k: (-bufs[k][3], k)), False)
    else:
        offs, peak, lb = None, None, lower_bound(bufs)
        for name, order in greedy_orders(bufs).items():
            for best_fit in (False, True):
                o, p = place(bufs, conf, order, best_fit)
                if peak is None or p < peak:
                    offs, peak = o, p
        # Search for lower plans, down in steps, while the budget holds.
        while peak > lb and a.nodes > 0:
            target = peak - 1
            o = search(bufs, conf, target, a.nodes)
            if o is None:
                break
            offs = o
            peak = max(o[k] + bufs[k][3] for k in range(len(bufs)))
    with open(a.output, "w", newline="") as f:
        f.write("id,lower,upper,size,offset\n")
        for (i, lower, upper, size), off in zip(bufs, offs):
            f.write("%s,%d,%d,%d,%d\n" % (i, lower, upper, size, off))
    print("planner: %d buffers, peak %d" % (len(bufs), peak), file=sys.stderr)


if __name__ == "__main__":
    main()

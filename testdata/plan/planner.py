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
fit (the smallest gap that holds it), then bisects for lower plans with a search
after MiniMalloc (Moffitt, ASPLOS 2023): buffers placed in order of offset,
each at the top of the placed buffers its lifetime meets, with a node budget
(--nodes, default 5000, per bound tried); it writes the lowest plan found.
"""

import argparse
import bisect
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
    """MiniMalloc's canonical search for a plan whose peak is at most bound:
    buffers placed in order of offset, each at its floor (the top of the
    placed buffers its lifetime meets), among those whose floor is the
    lowest; pruned where the buffers left at some moment cannot stack
    within the bound above the lowest floor among them (section floors),
    and where the state left (the buffers not placed, with their floors)
    failed before. Returns the offsets, or None when there is no such plan
    or the node budget ran out."""
    n = len(bufs)
    lo = [b[1] for b in bufs]
    up = [b[2] for b in bufs]
    sz = [b[3] for b in bufs]
    times = sorted(set(lo))
    secs = [(bisect.bisect_left(times, lo[k]), bisect.bisect_left(times, up[k])) for k in range(n)]
    members = [[] for _ in times]
    left_bytes = [0] * len(times)
    for k in range(n):
        for s in range(*secs[k]):
            members[s].append(k)
            left_bytes[s] += sz[k]
    floor = [0] * n
    offs = [None] * n
    left = set(range(n))
    failed = set()
    budget = [nodes]

    def sections_fit(ks):
        seen = set()
        for k in ks:
            for s in range(*secs[k]):
                if s in seen or left_bytes[s] == 0:
                    continue
                seen.add(s)
                f = min(floor[j] for j in members[s] if offs[j] is None)
                if f + left_bytes[s] > bound:
                    return False
        return True

    def rec():
        if not left:
            return True
        budget[0] -= 1
        if budget[0] < 0:
            return False
        state = tuple(sorted((k, floor[k]) for k in left))
        if state in failed:
            return False
        low = min(floor[k] for k in left)
        cands = sorted((k for k in left if floor[k] == low),
                       key=lambda k: (-max(left_bytes[s] for s in range(*secs[k])), -sz[k], lo[k] - up[k], k))
        for k in cands:
            offs[k] = low
            left.discard(k)
            for s in range(*secs[k]):
                left_bytes[s] -= sz[k]
            top = low + sz[k]
            raised = []
            ok = top <= bound
            if ok:
                for j in conf[k]:
                    if offs[j] is None and floor[j] < top:
                        raised.append((j, floor[j]))
                        floor[j] = top
                        ok = ok and top + sz[j] <= bound
                ok = ok and sections_fit([k] + [j for j, _ in raised])
            if ok and rec():
                return True
            for j, f in raised:
                floor[j] = f
            for s in range(*secs[k]):
                left_bytes[s] += sz[k]
            offs[k] = None
            left.add(k)
            if budget[0] < 0:
                return False
        failed.add(state)
        return False

    sys.setrecursionlimit(max(1000, 4 * n + 100))
    return offs if rec() else None


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
    ap.add_argument("--nodes", type=int, default=5000)
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
        # Search for lower plans: bisection of the bound between the lower
        # bound (the peak of live bytes) and the best plan's peak.
        lo_bound = lb
        while lo_bound < peak and a.nodes > 0:
            target = (lo_bound + peak) // 2
            o = search(bufs, conf, target, a.nodes)
            if o is None:
                lo_bound = target + 1
                continue
            offs = o
            peak = max(o[k] + bufs[k][3] for k in range(len(bufs)))
    with open(a.output, "w", newline="") as f:
        f.write("id,lower,upper,size,offset\n")
        for (i, lower, upper, size), off in zip(bufs, offs):
            f.write("%s,%d,%d,%d,%d\n" % (i, lower, upper, size, off))
    print("planner: %d buffers, peak %d" % (len(bufs), peak), file=sys.stderr)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Checks a slice of a snapshot the way PyTorch's memory viewer reads it.

    python3 slicecheck.py ORIGINAL SLICE FIRST [DEVICE]

ORIGINAL is a snapshot whose history is whole (not cut by max_entries), SLICE
the snapshot `replay slice` wrote of its entries FIRST on (gzip'd or not).
The script loads both with pickle and checks, printing "ok" or failing:

- the slice has the keys the viewer (torch/utils/viz/MemoryViz.js) reads:
  segments with device, address, total_size, stream, frames and blocks
  (size, requested_size, state, frames), device_traces of entries with
  action, addr, size, stream, time_us and frames (device_free for an oom);
- its entries are the original's from FIRST on (action, addr, size, stream,
  time_us);
- the Active Memory Timeline's allocations live at the start (those the trace
  frees without allocating them, and the active_allocated blocks of the
  segments the trace does not allocate) are the blocks the original held at
  entry FIRST, but those still pending at the slice's end, which the viewer
  does not count, by address and requested size;
- the Allocator State History, undoing the slice's entries from its
  segments, never meets a block or segment it lacks, and ends at the
  original's state at entry FIRST: the same segments (runs of mapped pages
  merged by stream, as the viewer merges them) and live blocks;
- a slice to the trace's end has the original's final segments, block for
  block (address, size, requested size, state).

The viewer's rules are restated here from reading its source, not copied.
"""
import gzip
import pickle
import sys


def load(path):
    with (gzip.open(path) if path.endswith(".gz") else open(path, "rb")) as f:
        return pickle.load(f)


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def check_keys(snap, dev):
    for k in ("segments", "device_traces"):
        if k not in snap:
            fail("no key %r" % k)
    for s in snap["segments"]:
        for k in ("device", "address", "total_size", "stream", "frames", "blocks", "allocated_size"):
            if k not in s:
                fail("segment without %r: %r" % (k, s))
        if s["device"] != dev:
            fail("segment of device %r" % s["device"])
        at = s["address"]
        for b in s["blocks"]:
            for k in ("size", "requested_size", "state", "frames"):
                if k not in b:
                    fail("block without %r" % k)
            if b["state"] not in ("active_allocated", "active_pending_free", "inactive"):
                fail("block state %r" % b["state"])
            if b.get("address", at) != at:
                fail("block at %#x, want %#x" % (b["address"], at))
            at += b["size"]
        if at != s["address"] + s["total_size"]:
            fail("segment %#x: blocks cover %d bytes of %d" % (s["address"], at - s["address"], s["total_size"]))
    for e in snap["device_traces"][dev]:
        keys = ("action", "size", "stream", "time_us", "frames") + (("device_free",) if e["action"] == "oom" else ("addr",))
        for k in keys:
            if k not in e and not (k == "frames"):
                fail("entry without %r: %r" % (k, e))
        for f in e.get("frames", []):
            if set(f) != {"name", "filename", "line"}:
                fail("frame %r" % f)


def elide(trace):
    """The viewer's annotation: a free_requested with the free_completed of
    its address right after it is one 'free'."""
    out = []
    for e in trace:
        e = dict(e)
        if e["action"] == "free_completed" and out and out[-1]["action"] == "free_requested" and out[-1]["addr"] == e["addr"]:
            out[-1]["action"] = "free"
            continue
        out.append(e)
    return out


def timeline_initial(snap, dev):
    """The Active Memory Timeline's allocations live before the first entry:
    {addr: size}."""
    alloc, initial = {}, {}
    for e in elide(snap["device_traces"][dev]):
        if e["action"] == "alloc":
            alloc[e["addr"]] = e["size"]
        elif e["action"] in ("free", "free_completed"):
            if e["addr"] in alloc:
                del alloc[e["addr"]]
            else:
                initial[e["addr"]] = e["size"]
    for s in snap["segments"]:
        if s["device"] != dev:
            continue
        at = s["address"]
        for b in s["blocks"]:
            if b["state"] == "active_allocated" and at not in alloc:
                initial[at] = b["requested_size"]
            at += b["size"]
    return initial


def merge_runs(segs):
    """Adjacent segments of one stream, as the viewer's map_segment merges
    mapped pages: [(addr, size, stream)] sorted."""
    out = []
    for a, n, st in sorted(segs):
        if out and out[-1][0] + out[-1][1] == a and out[-1][2] == st:
            out[-1] = (out[-1][0], out[-1][1] + n, st)
        else:
            out.append((a, n, st))
    return out


def history_start(snap, dev):
    """Undoes the trace from the segments as the Allocator State History
    does; returns (segments, blocks) before the first entry."""
    segs = []
    blocks = {}
    for s in snap["segments"]:
        if s["device"] != dev:
            continue
        segs.append([s["address"], s["total_size"], s["stream"], s.get("is_expandable", False)])
        at = s["address"]
        for b in s["blocks"]:
            if b["state"] in ("active_allocated", "active_pending_free"):
                blocks[at] = [b["requested_size"], b["state"] == "active_pending_free"]
            at += b["size"]

    def find(addr):
        for s in segs:
            if s[0] <= addr < s[0] + s[1]:
                return s
        return None

    for e in reversed(elide(snap["device_traces"][dev])):
        a, act = e.get("addr"), e["action"]
        if act in ("free", "free_completed"):
            if find(a) is None:
                fail("undoing %s at %#x: in no segment" % (act, a))
            blocks[a] = [e["size"], act == "free_completed"]
        elif act == "free_requested":
            if a not in blocks:
                fail("undoing free_requested at %#x: no such block" % a)
            blocks[a][1] = False
        elif act == "alloc":
            blocks.pop(a, None)
        elif act == "segment_free":
            segs.append([a, e["size"], e["stream"], False])
        elif act == "segment_unmap":
            # Mapped again: one with its neighbours of its stream.
            new = [a, e["size"], e["stream"], True]
            for s in list(segs):
                if s[2] == new[2] and s[0] + s[1] == new[0]:
                    segs.remove(s)
                    new = [s[0], s[1] + new[1], new[2], True]
                elif s[2] == new[2] and new[0] + new[1] == s[0]:
                    segs.remove(s)
                    new = [new[0], new[1] + s[1], new[2], True]
            segs.append(new)
        elif act in ("segment_alloc", "segment_map"):
            s = find(a)
            if s is None or a + e["size"] > s[0] + s[1]:
                fail("undoing %s at %#x: no segment holds it" % (act, a))
            if act == "segment_alloc":
                if s[0] != a:
                    fail("undoing segment_alloc at %#x: the segment there starts at %#x" % (a, s[0]))
                segs.remove(s)
            else:
                segs.remove(s)
                if s[0] < a:
                    segs.append([s[0], a - s[0], s[2], True])
                if a + e["size"] < s[0] + s[1]:
                    segs.append([a + e["size"], s[0] + s[1] - a - e["size"], s[2], True])
    return merge_runs((s[0], s[1], s[2]) for s in segs), blocks


def original_at(snap, dev, first):
    """The original's segments and live blocks before entry first, from an
    empty allocator."""
    segs, blocks = {}, {}
    for e in snap["device_traces"][dev][:first]:
        a, act = e.get("addr"), e["action"]
        if act == "alloc":
            blocks[a] = [e["size"], False]
        elif act == "free_requested":
            blocks[a][1] = True
        elif act == "free_completed":
            del blocks[a]
        elif act in ("segment_alloc", "segment_map"):
            segs[a] = (a, e["size"], e["stream"])
        elif act in ("segment_free", "segment_unmap"):
            end = a + e["size"]
            for k, (sa, sn, st) in list(segs.items()):
                if sa < end and a < sa + sn:
                    del segs[k]
                    if sa < a:
                        segs[sa] = (sa, a - sa, st)
                    if end < sa + sn:
                        segs[end] = (end, sa + sn - end, st)
    return merge_runs(segs.values()), blocks


def main():
    orig, sl = load(sys.argv[1]), load(sys.argv[2])
    first = int(sys.argv[3])
    dev = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    check_keys(sl, dev)
    fields = ("action", "addr", "size", "stream", "time_us")
    got = [tuple(e.get(k, 0) for k in fields) for e in sl["device_traces"][dev]]
    want = [tuple(e.get(k, 0) for k in fields) for e in orig["device_traces"][dev][first:first + len(got)]]
    want = [w if w[0] != "oom" else w[:1] + (0,) + w[2:] for w in want]
    if got != want:
        for i, (g, w) in enumerate(zip(got, want)):
            if g != w:
                fail("entry %d: %r, want %r" % (first + i, g, w))
        fail("%d entries, want %d" % (len(got), len(want)))

    osegs, oblocks = original_at(orig, dev, first)
    # The timeline: the blocks live at first, but those pending at the end.
    end_pending = set()
    for s in sl["segments"]:
        at = s["address"]
        for b in s["blocks"]:
            if b["state"] == "active_pending_free":
                end_pending.add(at)
            at += b["size"]
    freed = {e["addr"] for e in sl["device_traces"][dev] if e["action"] == "free_completed"}
    want_initial = {a: n for a, (n, _) in oblocks.items() if a in freed or a not in end_pending}
    got_initial = timeline_initial(sl, dev)
    if got_initial != want_initial:
        extra = {hex(a): n for a, n in got_initial.items() if want_initial.get(a) != n}
        missing = {hex(a): n for a, n in want_initial.items() if got_initial.get(a) != n}
        fail("timeline's initial allocations: extra %r, missing %r" % (extra, missing))

    hsegs, hblocks = history_start(sl, dev)
    if hsegs != osegs:
        fail("history's segments at the start %r, want %r" % ([(hex(a), n) for a, n, _ in hsegs], [(hex(a), n) for a, n, _ in osegs]))
    if hblocks != oblocks:
        fail("history's blocks at the start differ: %d against %d" % (len(hblocks), len(oblocks)))
    if first + len(got) == len(orig["device_traces"][dev]):
        # To the trace's end: the segments are the original's final ones,
        # block for block (frames aside).
        def final(snap):
            out = []
            for g in sorted(snap["segments"], key=lambda g: g["address"]):
                if g["device"] == dev:
                    out.append((g["address"], g["total_size"], g["stream"], tuple(g.get("segment_pool_id", (0, 0))),
                                [(b["size"], b["requested_size"], b["state"]) if b["state"] != "inactive" else (b["size"],)
                                 for b in g["blocks"]]))
            return out
        # A run of free blocks is one inactive block in a slice.
        def joined(segs):
            out = []
            for a, n, st, pool, blocks in segs:
                bs = []
                for b in blocks:
                    if len(b) == 1 and bs and len(bs[-1]) == 1:
                        bs[-1] = (bs[-1][0] + b[0],)
                    else:
                        bs.append(b)
                out.append((a, n, st, pool, bs))
            return out
        if joined(final(sl)) != joined(final(orig)):
            fail("segments at the end %r, want the original's %r" % (final(sl)[:3], final(orig)[:3]))
    print("ok")


if __name__ == "__main__":
    main()

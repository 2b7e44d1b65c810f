#!/usr/bin/env python3
"""Seeded random PyTorch programs for differential testing of allocsim's
pytorch policy against the real CUDA caching allocator.

    python3 torchgen.py --seed S --out DIR [--program FILE.json] [--name NAME]

Without --program, program S is generated from random.Random(S) alone (the
same seed gives the same program on any machine) and written to
DIR/NAME.prog.json (NAME defaults to torch_S); with --program, the program
in FILE.json is run instead (the shrinker of run.py hands its candidates
over this way). Either way the program then runs in this process, from a
fresh allocator: PYTORCH_CUDA_ALLOC_CONF is set from the program before
torch is imported, the per-process cap (if any) is set through
torch.cuda.set_per_process_memory_fraction, and history is recorded as
users record it, torch.cuda.memory._record_memory_history(max_entries=
1_000_000) with PyTorch's defaults (context and stacks "all"). After the
last op and a torch.cuda.synchronize() it writes

    DIR/NAME.pickle.gz   torch.cuda.memory._dump_snapshot, gzip-compressed
    DIR/NAME.stats.json  the real allocator's figures, in the shape of
                         testdata/pytorch/record.py's stats.json

and exits 0; out-of-memory errors the program caught are part of the
program (counted in ooms_caught). Any other failure exits non-zero with a
message on stderr (2: no torch or no GPU; 1: the program failed).

A program is a JSON object: the settings header (kind "torch", seed, name,
trace: the snapshot's file name, alloc_conf: the PYTORCH_CUDA_ALLOC_CONF
string, cap_bytes: the per-process cap in bytes, 0 for none, streams: the
number of side streams, tiny: whether sizes stay under 64 MiB) and "ops",
a list of dicts, each with "op" naming it. Tensors live in numbered slots;
an op that makes a tensor names its slot, one that uses or frees a tensor
names the slot it reads, so every dependency is explicit (op_refs gives
them). Streams are numbered: 0 is the default stream, 1..streams the side
streams, -1 the stream that CUDA graphs are warmed up and captured on.

  malloc    {slot, bytes, stream, fill}: torch.empty(bytes, uint8) on that
            stream, filled (a kernel) when fill is true
  free      {slot}: del; a stream that used the tensor without
            record_stream is synchronized first
  use       {slot, stream, via, record}: an in-place kernel on the tensor on
            another stream, ordered after its home stream by via
            ("wait_stream", "event": an event recorded and waited on, or
            "sync": the home stream synchronized), then record_stream
            (record true) or a synchronize before its free (record false)
  add       {slot, src, stream}: src + 1, a new tensor of src's bytes
  clone     {slot, src, bytes, stream}: the first bytes of src, cloned
  cat       {slot, srcs, stream}: the bytes of the srcs, concatenated
  matmul    {slot, m, k, n, dtype, stream}: (m x k) @ (k x n); the inputs
            are freed, the product kept
  event     {src, dst}: an event recorded on src, waited on by dst
  wait_stream {src, dst}: dst.wait_stream(src)
  sync_stream {stream}, sleep {stream, cycles} (torch.cuda._sleep),
  synchronize, empty_cache, gc (gc.collect)
  graph     {graph, input, input_bytes, pool, warmup, replays, body}: a
            CUDA graph: a static input tensor (slot input, on the default
            stream), the body run warmup times on the capture stream (as
            PyTorch's docs say), then captured into its own private pool
            (pool {"kind": "own"}), the pool of a live graph
            ({"kind": "graph", "graph": G}: G's pool()) or a shared pool
            handle ({"kind": "handle", "handle": H}: one
            torch.cuda.graph_pool_handle() per H), then replayed replays
            times. body: malloc {slot, bytes}, add {slot, src}, matmul
            {slot, m, k, n, dtype}, free {slot}, all on the capture stream;
            the tensors it does not free are the graph's outputs, kept in
            their slots (in the private pool) after the capture
  replay    {graph, times}: replays on the default stream
  del_graph {graph}: del of the graph and its static input, then
            gc.collect()
  pool_new  {pool}: torch.cuda.MemPool()
  in_pool   {pool, body}: with torch.cuda.use_mem_pool(pool): the body,
            malloc {slot, bytes, fill}, add {slot, src}, free {slot}, on
            the default stream
  pool_del  {pool}: its live tensors freed, then the pool deleted and
            gc.collect()
  compile   {slot, d, rows, calls, dynamic}: torch.compile(mode=
            "reduce-overhead") of relu(x @ w) + 1 with a d x d weight, fed
            a rows[i] x d input calls times for each i (cudagraph trees);
            the last output cloned into slot

An op whose tensor, graph or pool does not exist (a malloc that ran out
of memory, a tensor freed to make room, an op dropped by the shrinker) is
skipped, so any subsequence of a program's ops is a valid program. An
out-of-memory error (torch.cuda.OutOfMemoryError) is caught at the op that
raised it: the message is kept, every second live tensor (by slot) is
freed, and the program goes on. CUDA graphs and torch.compile run only
where they cannot run out of memory: torch.compile never under a cap,
graphs under a cap only while the live tensors leave room for them.
"""
import argparse
import gc
import gzip
import json
import math
import os
import random
import sys
import time
import traceback

MiB = 1 << 20
GiB = 1 << 30

FORMAT = 1  # version of the program format

# --- generation ------------------------------------------------------------


def odd_mib(x):
    """odd_mib returns x rounded down to an even number of MiB plus one MiB:
    a cap no 2 MiB-multiple segment lands on exactly (as record.py's)."""
    return (int(x) // (2 * MiB)) * 2 * MiB + MiB


def loguniform(rng, lo, hi):
    """loguniform draws an integer in [lo, hi] with a log-uniform density."""
    return max(lo, min(hi, int(math.exp(rng.uniform(math.log(lo), math.log(hi + 1))))))


def draw_size(rng, tiny):
    """draw_size draws a request's bytes the way real jobs' sizes fall: mostly
    log-uniform under 64 MiB, some up to 1 GiB (not in tiny programs), exact
    multiples of 512 bytes and of 2 MiB, sizes at the allocator's thresholds
    (512 B, 1 MiB, 2 MiB, 10 MiB, 20 MiB, 64 MiB) give or take a little, and
    odd byte counts."""
    top = 64 * MiB - 1 if tiny else GiB
    r = rng.random()
    if r < 0.50:
        n = loguniform(rng, 1, 64 * MiB)
    elif r < 0.60:
        n = loguniform(rng, 64 * MiB, GiB) if not tiny else loguniform(rng, 4 * MiB, 63 * MiB)
    elif r < 0.72:
        n = 512 * loguniform(rng, 1, 128 * 1024)
    elif r < 0.80:
        n = 2 * MiB * rng.randint(1, 31 if tiny else 96)
    elif r < 0.92:
        base = rng.choice([512, 4096, MiB, 2 * MiB, 10 * MiB, 20 * MiB, 64 * MiB, 128 * MiB])
        n = base + rng.choice([-513, -512, -1, 0, 1, 511, 512])
    else:
        n = loguniform(rng, 1, 64 * MiB) | 1
    return max(1, min(top, n))


def seg_bound(n, roundup):
    """seg_bound is an upper bound of the reserved bytes one live request of
    n bytes can hold on its own: its segment (2 MiB for the small pool, 20
    MiB up to 10 MiB, else the rounded size), generous enough for rounding
    by roundup_power2_divisions when roundup is true."""
    if n <= MiB:
        return 2 * MiB
    if n <= 10 * MiB:
        return 20 * MiB
    m = 2 * n if roundup else n + n // 4
    return -(-(m + 2 * MiB) // (2 * MiB)) * 2 * MiB


def draw_conf(rng, capped):
    """draw_conf draws a PYTORCH_CUDA_ALLOC_CONF string over every key of
    PyTorch 2.11 that changes placement (max_split_size_mb,
    roundup_power2_divisions in its integer and its list form,
    garbage_collection_threshold, mostly only under a cap where it acts,
    max_non_split_rounding_mb, expandable_segments) and, rarely, two keys
    that must not change it here (release_lock_on_cudamalloc, and
    graph_capture_record_stream_reuse, which acts only on tensors used on
    other streams inside a capture). The keys of the host allocator
    (pinned_*) are left out: its background thread must not make CUDA calls
    while a graph is captured. About 40% of programs run with the default
    settings."""
    if rng.random() < 0.4:
        return ""
    parts = []
    if rng.random() < 0.35:
        parts.append("max_split_size_mb:%d" % rng.choice([20, 32, 40, 64, 100, 128, 200, 256, 512]))
    if rng.random() < 0.35:
        if rng.random() < 0.5:
            parts.append("roundup_power2_divisions:%d" % rng.choice([1, 2, 4, 8, 16]))
        else:
            keys = sorted(rng.sample([1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048], rng.randint(1, 4)))
            items = ["%d:%d" % (k, rng.choice([0, 1, 2, 4, 8, 16])) for k in keys]
            if rng.random() < 0.7:
                items.append(">:%d" % rng.choice([1, 2, 4, 8]))
            parts.append("roundup_power2_divisions:[%s]" % ",".join(items))
    if rng.random() < (0.45 if capped else 0.08):
        parts.append("garbage_collection_threshold:%s" % rng.choice(["0.3", "0.5", "0.6", "0.7", "0.8", "0.9", "0.95"]))
    if rng.random() < 0.15:
        parts.append("max_non_split_rounding_mb:%d" % rng.choice([20, 40, 64, 128, 256]))
    if rng.random() < 0.35:
        parts.append("expandable_segments:%s" % ("True" if rng.random() < 0.9 else "False"))
    if rng.random() < 0.04:
        parts.append("release_lock_on_cudamalloc:True")
    if rng.random() < 0.04:
        parts.append("graph_capture_record_stream_reuse:True")
    if not parts:
        parts.append("expandable_segments:True")
    rng.shuffle(parts)
    return (", " if rng.random() < 0.1 else ",").join(parts)


class _Gen:
    """_Gen draws one program, keeping the state the ops leave (live slots
    and their bytes and home streams, live graphs and pools) so that every
    op it draws is valid where it stands."""

    def __init__(self, seed):
        self.rng = rng = random.Random(seed)
        self.seed = seed
        self.tiny = rng.random() < 0.25
        self.nops = rng.randint(20, 40) if self.tiny else rng.randint(40, 200)
        capped = rng.random() < 0.3
        if self.tiny:
            self.budget = rng.choice([64, 128, 256, 384]) * MiB
        else:
            self.budget = int(rng.uniform(0.25, 3.0) * GiB)
        self.cap = 0
        if capped:
            self.cap = odd_mib(max(96 * MiB, self.budget * rng.uniform(0.5, 1.1)))
            # a budget over the cap draws caught OOMs
            self.budget = int(self.cap * rng.uniform(0.7, 1.5))
        self.conf = draw_conf(rng, capped)
        self.roundup = "roundup_power2_divisions" in self.conf
        self.res_limit = (GiB if self.tiny else 6 * GiB) - 512 * MiB
        self.nstreams = rng.choice([0, 1, 1, 2, 2, 3])
        self.use_graphs = rng.random() < 0.25
        self.use_pools = rng.random() < 0.2
        self.use_compile = not capped and not self.tiny and rng.random() < 0.07
        self.ops = []
        self.live = {}  # slot -> {"bytes", "home", "owner"}
        self.recent_freed = []  # sizes of freed tensors, to draw again
        self.graphs = {}  # graph -> input slot
        self.graph_handle = {}  # live graph -> the pool handle it was captured into, or None
        self.pools = []
        self.nhandles = 0
        self.next = {"slot": 0, "graph": 0, "pool": 0}
        self.res_at_ec = 0  # reserved bound after the last empty_cache
        self.since_ec = 0  # segment bounds of the requests since

    def new(self, what):
        n = self.next[what]
        self.next[what] = n + 1
        return n

    # state

    def live_bytes(self):
        return sum(v["bytes"] for v in self.live.values())

    def reserved_bound(self):
        return self.res_at_ec + self.since_ec

    def on_malloc(self, slot, n, home, owner):
        self.live[slot] = {"bytes": n, "home": home, "owner": owner}
        self.since_ec += seg_bound(n, self.roundup)

    def on_free(self, slot):
        v = self.live.pop(slot)
        self.recent_freed = (self.recent_freed + [v["bytes"]])[-8:]

    def on_empty_cache(self):
        self.res_at_ec = sum(seg_bound(v["bytes"], self.roundup) for v in self.live.values())
        # private pools keep what their graphs captured
        self.res_at_ec += 64 * MiB * len(self.graphs)
        self.since_ec = 0

    def fits(self, n):
        """fits tells whether a request of n bytes keeps the program in its
        budget of live bytes and, without a cap, its bound of reserved
        bytes (a cap holds the reserved bytes itself)."""
        if self.live_bytes() + n > self.budget:
            return False
        if not self.cap and self.reserved_bound() + seg_bound(n, self.roundup) > self.res_limit:
            return False
        return True

    def stream(self):
        if not self.nstreams or self.rng.random() < 0.6:
            return 0
        return self.rng.randint(1, self.nstreams)

    def freeable(self):
        return sorted(k for k, v in self.live.items() if v["owner"] != "ginput")

    def pick_free(self):
        c = self.freeable()
        r = self.rng.random()
        if r < 0.5:
            return self.rng.choice(c)
        return c[-1] if r < 0.8 else c[0]

    def size(self):
        if self.recent_freed and self.rng.random() < 0.2:
            return self.rng.choice(self.recent_freed)
        return draw_size(self.rng, self.tiny)

    # making room

    def make_room(self, n):
        """make_room emits what a program needs before a request of n
        bytes: an empty_cache where cached segments would exceed the bound
        of reserved bytes, frees where live bytes would exceed the budget.
        It returns false where the request still does not fit."""
        for _ in range(64):
            if self.fits(n):
                return True
            if not self.cap and self.since_ec and self.live_bytes() + n <= self.budget:
                self.emit({"op": "empty_cache"})
                continue
            c = self.freeable()
            if not c:
                return False
            self.emit({"op": "free", "slot": self.pick_free()})
        return self.fits(n)

    def emit(self, op):
        """emit appends op and applies it to the state."""
        self.ops.append(op)
        k = op["op"]
        if k == "free":
            self.on_free(op["slot"])
        elif k == "empty_cache":
            self.on_empty_cache()

    # ops

    def op_malloc(self, side=False):
        n = self.size()
        if not self.make_room(n):
            return
        s = self.rng.randint(1, self.nstreams) if side else self.stream()
        slot = self.new("slot")
        self.emit({"op": "malloc", "slot": slot, "bytes": n, "stream": s, "fill": self.rng.random() < 0.5})
        self.on_malloc(slot, n, s, "dev")

    def op_use(self):
        slot = self.rng.choice(self.freeable())
        home = self.live[slot]["home"]
        others = [s for s in range(self.nstreams + 1) if s != home]
        if not others:
            return
        s = self.rng.choice(others)
        via = self.rng.choice(["wait_stream", "wait_stream", "event", "sync"])
        self.emit({"op": "use", "slot": slot, "stream": s, "via": via, "record": self.rng.random() < 0.8})

    def op_derived(self, kind):
        srcs = self.freeable()
        if kind == "cat":
            a, b = self.rng.choice(srcs), self.rng.choice(srcs)
            n = self.live[a]["bytes"] + self.live[b]["bytes"]
            op = {"op": "cat", "srcs": [a, b]}
        elif kind == "clone":
            src = self.rng.choice(srcs)
            n = self.rng.randint(1, self.live[src]["bytes"])
            op = {"op": "clone", "src": src, "bytes": n}
        else:
            src = self.rng.choice(srcs)
            n = self.live[src]["bytes"]
            op = {"op": "add", "src": src}
        if n > GiB or not self.fits(n):
            return
        s = self.stream()
        slot = self.new("slot")
        op.update({"slot": slot, "stream": s})
        self.emit(op)
        self.on_malloc(slot, n, s, "dev")

    def draw_matmul(self):
        dtype = self.rng.choice(["float16", "float16", "bfloat16", "float32"])
        es = 4 if dtype == "float32" else 2
        hi = 1024 if self.tiny else 4096
        m, k, n = (loguniform(self.rng, 1, hi) for _ in range(3))
        return {"m": m, "k": k, "n": n, "dtype": dtype}, es * (m * k + k * n + m * n), es * m * n

    def op_matmul(self):
        mm, peak, out = self.draw_matmul()
        if not self.make_room(peak):
            return
        s = self.stream()
        slot = self.new("slot")
        op = {"op": "matmul", "slot": slot, "stream": s}
        op.update(mm)
        self.emit(op)
        self.since_ec += 2 * seg_bound(peak // 2, self.roundup)
        self.on_malloc(slot, out, s, "dev")

    def op_streams(self, kind):
        a = self.rng.randint(0, self.nstreams)
        b = self.rng.choice([s for s in range(self.nstreams + 1) if s != a])
        if kind in ("event", "wait_stream"):
            self.emit({"op": kind, "src": a, "dst": b})
        elif kind == "sync_stream":
            self.emit({"op": kind, "stream": a})
        else:
            self.emit({"op": "sleep", "stream": a, "cycles": loguniform(self.rng, 1000, 2000000)})

    def op_graph(self):
        cap_room = None
        if self.cap:
            live_seg = sum(seg_bound(v["bytes"], self.roundup) for v in self.live.values())
            cap_room = self.cap - live_seg - 256 * MiB
            if cap_room < 64 * MiB:
                return
        limit = (32 if self.tiny else 256) * MiB
        if cap_room is not None:
            limit = min(limit, cap_room // 3)
        g = self.new("graph")
        inp = self.new("slot")
        inp_bytes = loguniform(self.rng, 1, min(16 * MiB, limit // 4))
        pool = {"kind": "own"}
        r = self.rng.random()
        if r < 0.3 and self.graphs:
            pool = {"kind": "graph", "graph": self.rng.choice(sorted(self.graphs))}
        elif r < 0.55:
            # a handle is shared only while a graph captured into it lives:
            # PyTorch refuses to share a pool that no graph holds any more
            held = sorted({h for h in self.graph_handle.values() if h is not None})
            if held and self.rng.random() < 0.7:
                h = self.rng.choice(held)
            else:
                h = self.nhandles
                self.nhandles += 1
            pool = {"kind": "handle", "handle": h}
        body, bl = [], {inp: inp_bytes}  # bl: slots the body can read
        total = inp_bytes
        for _ in range(self.rng.randint(1, 6)):
            r = self.rng.random()
            mine = [k for k in bl if k != inp]
            if r < 0.2 and mine:
                k = self.rng.choice(mine)
                body.append({"op": "free", "slot": k})
                del bl[k]
                continue
            slot = self.new("slot")
            if r < 0.55:
                n = loguniform(self.rng, 1, max(1, min(64 * MiB, limit // 4)))
                op = {"op": "malloc", "slot": slot, "bytes": n}
            elif r < 0.8:
                src = self.rng.choice(sorted(bl))
                n = bl[src]
                op = {"op": "add", "slot": slot, "src": src}
            else:
                mm, peak, n = self.draw_matmul()
                if peak > limit // 2:
                    mm = {"m": 64, "k": 64, "n": 64, "dtype": "float16"}
                    n = 2 * 64 * 64
                op = {"op": "matmul", "slot": slot}
                op.update(mm)
            if total + n > limit:
                continue
            total += n
            body.append(op)
            bl[slot] = n
        self.emit({"op": "graph", "graph": g, "input": inp, "input_bytes": inp_bytes, "pool": pool,
                   "warmup": self.rng.randint(1, 3), "replays": self.rng.randint(0, 2), "body": body})
        self.graphs[g] = inp
        self.graph_handle[g] = pool.get("handle")
        self.live[inp] = {"bytes": inp_bytes, "home": 0, "owner": "ginput"}
        for k, n in bl.items():
            if k != inp:
                self.live[k] = {"bytes": n, "home": -1, "owner": "graph"}
        self.since_ec += 2 * total + 20 * MiB

    def op_del_graph(self):
        g = self.rng.choice(sorted(self.graphs))
        inp = self.graphs.pop(g)
        self.graph_handle.pop(g, None)
        self.live.pop(inp, None)
        self.emit({"op": "del_graph", "graph": g})

    def op_in_pool(self):
        p = self.rng.choice(self.pools)
        body = []
        for _ in range(self.rng.randint(1, 6)):
            mine = sorted(k for k, v in self.live.items() if v["owner"] == ("pool", p))
            r = self.rng.random()
            if r < 0.25 and mine:
                k = self.rng.choice(mine)
                body.append({"op": "free", "slot": k})
                self.on_free(k)
                continue
            slot = self.new("slot")
            if r < 0.45 and self.freeable():
                src = self.rng.choice(self.freeable())
                n = self.live[src]["bytes"]
                op = {"op": "add", "slot": slot, "src": src}
            else:
                n = self.size()
                op = {"op": "malloc", "slot": slot, "bytes": n, "fill": self.rng.random() < 0.5}
            if not self.fits(n):
                continue
            body.append(op)
            self.on_malloc(slot, n, 0, ("pool", p))
        if body:
            self.ops.append({"op": "in_pool", "pool": p, "body": body})

    def op_pool_del(self):
        p = self.rng.choice(self.pools)
        if self.rng.random() < 0.4:
            self.emit({"op": "empty_cache"})
        for k in sorted(k for k, v in self.live.items() if v["owner"] == ("pool", p)):
            if self.rng.random() < 0.7:
                self.emit({"op": "free", "slot": k})
        for k in sorted(k for k, v in self.live.items() if v["owner"] == ("pool", p)):
            self.on_free(k)  # pool_del frees the rest
        self.pools.remove(p)
        self.emit({"op": "pool_del", "pool": p})
        if self.rng.random() < 0.6:
            self.emit({"op": "empty_cache"})

    def op_compile(self):
        d = self.rng.choice([64, 128, 256, 512])
        shapes = self.rng.sample([4, 8, 16, 32, 64, 128], self.rng.randint(1, 3))  # a compile each
        rows = [self.rng.choice(shapes) for _ in range(self.rng.randint(2, 5))]
        slot = self.new("slot")
        self.emit({"op": "compile", "slot": slot, "d": d, "rows": rows, "calls": 3,
                   "dynamic": False if self.rng.random() < 0.8 else None})
        self.on_malloc(slot, 4 * rows[-1] * d, 0, "dev")
        self.since_ec += 256 * MiB

    def weights(self):
        live = bool(self.freeable())
        side = self.nstreams > 0
        w = {
            "malloc": 30,
            "free": 24 if live else 0,
            "side_malloc": 6 if side else 0,
            "use": 5 if live and side else (1 if live and self.graphs else 0),
            "add": 4 if live else 0,
            "clone": 3 if live else 0,
            "cat": 2 if live else 0,
            "matmul": 3,
            "event": 2 if side else 0,
            "wait_stream": 2 if side else 0,
            "sync_stream": 1.5 if side else 0,
            "sleep": 3 if side else 0,
            "synchronize": 1,
            "empty_cache": 2,
            "gc": 0.5,
            "graph": 3 if self.use_graphs and len(self.graphs) < 4 else 0,
            "replay": 5 if self.graphs else 0,
            "del_graph": 1.5 if self.graphs else 0,
            "pool_new": 2 if self.use_pools and len(self.pools) < 3 else 0,
            "in_pool": 5 if self.pools else 0,
            "pool_del": 1.5 if self.pools else 0,
        }
        return [(k, v) for k, v in w.items() if v > 0]

    def generate(self):
        compile_at = set()
        if self.use_compile:
            compile_at = {self.rng.randint(0, self.nops - 1) for _ in range(self.rng.randint(1, 2))}
        tail = 0 if self.rng.random() < 0.7 else 1
        body_ops = self.nops - (2 if tail else 0)
        step = 0
        while len(self.ops) < body_ops:
            if step in compile_at:
                self.op_compile()
            step += 1
            ws = self.weights()
            k = self.rng.choices([k for k, _ in ws], [v for _, v in ws])[0]
            if k in ("malloc", "side_malloc"):
                self.op_malloc(side=k == "side_malloc")
            elif k == "free":
                self.emit({"op": "free", "slot": self.pick_free()})
            elif k == "use":
                self.op_use()
            elif k in ("add", "clone", "cat"):
                self.op_derived(k)
            elif k == "matmul":
                self.op_matmul()
            elif k in ("event", "wait_stream", "sync_stream", "sleep"):
                self.op_streams(k)
            elif k in ("synchronize", "gc"):
                self.emit({"op": k})
            elif k == "empty_cache":
                self.emit({"op": "empty_cache"})
            elif k == "graph":
                self.op_graph()
            elif k == "replay":
                g = self.rng.choice(sorted(self.graphs))
                self.emit({"op": "replay", "graph": g, "times": self.rng.randint(1, 3)})
            elif k == "del_graph":
                self.op_del_graph()
                if self.rng.random() < 0.5:
                    self.emit({"op": "empty_cache"})
            elif k == "pool_new":
                p = self.new("pool")
                self.pools.append(p)
                self.emit({"op": "pool_new", "pool": p})
            elif k == "in_pool":
                self.op_in_pool()
            elif k == "pool_del":
                self.op_pool_del()
            if step > 20 * self.nops:
                break
        limit = 40 if self.tiny else 200
        if tail and len(self.ops) + len(self.freeable()) < limit:
            for k in self.freeable():
                self.emit({"op": "free", "slot": k})
            self.emit({"op": "empty_cache"})
        # make_room's frees and a MemPool's release can run past the count:
        # any prefix of a program is a program
        self.ops = self.ops[:limit]
        return {
            "kind": "torch",
            "format": FORMAT,
            "seed": self.seed,
            "name": "torch_%d" % self.seed,
            "trace": "torch_%d.pickle.gz" % self.seed,
            "alloc_conf": self.conf,
            "cap_bytes": self.cap,
            "streams": self.nstreams,
            "tiny": self.tiny,
            "ops": self.ops,
        }


def generate(seed):
    """generate returns program seed: a JSON-serialisable dict, the same for
    the same seed on any machine (it draws from random.Random(seed) only)."""
    return _Gen(seed).generate()


def op_refs(op):
    """op_refs returns (defs, uses) of one op, without its body: the ids it
    makes and the ids it needs ("s5" a slot, "g2" a graph, "p1" a MemPool).
    A graph defines its static input too; its own pool's sharing names the
    graph whose pool it shares. run.py's shrinker drops, with an op, every
    op that uses what it defines."""
    k = op.get("op")
    defs, uses = [], []
    if "slot" in op:
        (uses if k in ("free", "use") else defs).append("s%d" % op["slot"])
    if "src" in op and k in ("add", "clone"):
        uses.append("s%d" % op["src"])
    if k == "cat":
        uses.extend("s%d" % s for s in op["srcs"])
    if k == "graph":
        defs.extend(["g%d" % op["graph"], "s%d" % op["input"]])
        if op["pool"].get("kind") == "graph":
            uses.append("g%d" % op["pool"]["graph"])
    elif k in ("replay", "del_graph"):
        uses.append("g%d" % op["graph"])
    elif k == "pool_new":
        defs.append("p%d" % op["pool"])
    elif k in ("in_pool", "pool_del"):
        uses.append("p%d" % op["pool"])
    return defs, uses


# --- running ---------------------------------------------------------------


class _Slot:
    """_Slot is a live tensor: its home stream (where it was made) and the
    streams that used it without record_stream (synchronized before its
    free)."""

    __slots__ = ("t", "home", "owner", "unrecorded")

    def __init__(self, t, home, owner):
        self.t, self.home, self.owner, self.unrecorded = t, home, owner, set()


class Runner:
    """Runner runs a program's ops against the real allocator."""

    def __init__(self, torch, prog):
        self.torch = torch
        self.prog = prog
        self.streams = [torch.cuda.current_stream()]
        for _ in range(int(prog.get("streams", 0))):
            self.streams.append(torch.cuda.Stream())
        self.capture = torch.cuda.Stream()
        self.slots = {}
        self.graphs = {}  # graph -> (CUDAGraph, input slot)
        self.handles = {}  # handle -> torch.cuda.graph_pool_handle()
        self.handle_users = {}  # handle -> the live graphs captured into it
        self.pools = {}
        self.ooms = []
        self.notes = []

    def stream(self, i):
        if i == -1:
            return self.capture
        if 0 <= i < len(self.streams):
            return self.streams[i]
        return self.streams[0]

    def dtype(self, name):
        return getattr(self.torch, name, self.torch.float16)

    def get(self, slot):
        return self.slots.get(slot)

    def order(self, rec, s, via="wait_stream", record=True):
        """order makes the tensor of rec usable on stream s: s ordered after
        the tensor's home stream (wait_stream, an event, or a host
        synchronize of the home stream), and record_stream(s), or s
        remembered for a synchronize before the free."""
        if rec.home == s:
            return
        consumer, producer = self.stream(s), self.stream(rec.home)
        if via == "event":
            e = self.torch.cuda.Event()
            e.record(producer)
            consumer.wait_event(e)
        elif via == "sync":
            producer.synchronize()
        else:
            consumer.wait_stream(producer)
        if record:
            rec.t.record_stream(consumer)
        else:
            rec.unrecorded.add(s)

    def put(self, slot, t, home, owner="dev"):
        old = self.slots.pop(slot, None)
        if old is not None:
            self.drop(old)
        self.slots[slot] = _Slot(t, home, owner)

    def drop(self, rec):
        for s in sorted(rec.unrecorded):
            self.stream(s).synchronize()
        rec.t = None

    def free(self, slot):
        rec = self.slots.pop(slot, None)
        if rec is not None:
            self.drop(rec)

    def flat(self, t):
        return t.reshape(-1).view(self.torch.uint8)

    def empty(self, n):
        return self.torch.empty(int(n), dtype=self.torch.uint8, device="cuda")

    # the ops

    def op_malloc(self, op):
        s = op.get("stream", 0)
        with self.torch.cuda.stream(self.stream(s)):
            t = self.empty(op["bytes"])
            if op.get("fill"):
                t.fill_(1)
        self.put(op["slot"], t, s)

    def op_free(self, op):
        self.free(op["slot"])

    def op_use(self, op):
        rec = self.get(op["slot"])
        if rec is None:
            return
        s = op["stream"]
        self.order(rec, s, op.get("via", "wait_stream"), op.get("record", True))
        with self.torch.cuda.stream(self.stream(s)):
            rec.t.add_(1)

    def derive(self, op, srcs, fn):
        s = op.get("stream", 0)
        recs = [self.get(k) for k in srcs]
        if any(r is None for r in recs):
            return
        for r in recs:
            self.order(r, s)
        with self.torch.cuda.stream(self.stream(s)):
            t = fn(*[r.t for r in recs])
        self.put(op["slot"], t, s)

    def op_add(self, op):
        self.derive(op, [op["src"]], lambda a: a + 1)

    def op_clone(self, op):
        def clone(a):
            f = self.flat(a)
            return f[: max(1, min(int(op["bytes"]), f.numel()))].clone()
        self.derive(op, [op["src"]], clone)

    def op_cat(self, op):
        self.derive(op, op["srcs"], lambda *ts: self.torch.cat([self.flat(t) for t in ts]))

    def matmul(self, op):
        dt = self.dtype(op.get("dtype", "float16"))
        a = self.torch.empty((op["m"], op["k"]), dtype=dt, device="cuda")
        a.fill_(0.5)
        b = self.torch.empty((op["k"], op["n"]), dtype=dt, device="cuda")
        b.fill_(0.25)
        c = a @ b
        del a, b
        return c

    def op_matmul(self, op):
        s = op.get("stream", 0)
        with self.torch.cuda.stream(self.stream(s)):
            c = self.matmul(op)
        self.put(op["slot"], c, s)

    def op_event(self, op):
        e = self.torch.cuda.Event()
        e.record(self.stream(op["src"]))
        self.stream(op["dst"]).wait_event(e)

    def op_wait_stream(self, op):
        self.stream(op["dst"]).wait_stream(self.stream(op["src"]))

    def op_sync_stream(self, op):
        self.stream(op["stream"]).synchronize()

    def op_sleep(self, op):
        with self.torch.cuda.stream(self.stream(op["stream"])):
            self.torch.cuda._sleep(int(op["cycles"]))

    def op_synchronize(self, op):
        self.torch.cuda.synchronize()

    def op_empty_cache(self, op):
        self.torch.cuda.empty_cache()

    def op_gc(self, op):
        gc.collect()

    def body(self, body, local, home, owner, capturing):
        """body runs a graph's or a MemPool's body ops on the current
        stream; local maps the slots it made to their tensors (what it
        frees is dropped from it). Outside a capture the tensors go to
        slots as they are made."""
        for bop in body:
            k = bop.get("op")
            if k == "free":
                if bop["slot"] in local:
                    del local[bop["slot"]]
                    if not capturing:
                        self.free(bop["slot"])
                continue
            if k == "malloc":
                t = self.empty(bop["bytes"])
                if bop.get("fill", True):
                    t.fill_(1)
            elif k == "add":
                src = local.get(bop["src"])
                if src is None:
                    rec = self.get(bop["src"]) if not capturing else None
                    if rec is None:
                        continue
                    self.order(rec, home)
                    src = rec.t
                t = src + 1
            elif k == "matmul":
                t = self.matmul(bop)
            else:
                continue
            local[bop["slot"]] = t
            if not capturing:
                self.put(bop["slot"], t, home, owner)

    def op_graph(self, op):
        torch = self.torch
        gid = op["graph"]
        if gid in self.graphs:
            return
        inp = self.empty(op["input_bytes"])
        inp.fill_(1)
        self.put(op["input"], inp, 0, "ginput")
        body = op.get("body", [])

        def run_body():
            inp.add_(1)
            local = {op["input"]: inp}
            self.body(body, local, -1, ("graph", gid), True)
            local.pop(op["input"], None)
            return local

        pool = None
        pk = op.get("pool", {})
        if pk.get("kind") == "graph" and pk.get("graph") in self.graphs:
            pool = self.graphs[pk["graph"]][0].pool()
        elif pk.get("kind") == "handle":
            h = pk.get("handle", 0)
            if not self.handle_users.get(h):
                # a handle no live graph holds is not shared again (PyTorch
                # refuses a pool that was released): a fresh one
                self.handles[h] = torch.cuda.graph_pool_handle()
                self.handle_users[h] = set()
            pool = self.handles[h]
        g = torch.cuda.CUDAGraph()
        outs = {}
        try:
            # warm-up on the capture stream, as PyTorch's docs do
            self.capture.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.capture):
                for _ in range(max(1, int(op.get("warmup", 1)))):
                    run_body()
            torch.cuda.current_stream().wait_stream(self.capture)
            with torch.cuda.graph(g, pool=pool, stream=self.capture):
                outs = run_body()
        except torch.cuda.OutOfMemoryError:
            # the graph is dropped, its static input freed
            outs = {}
            del g
            gc.collect()
            self.free(op["input"])
            raise
        if pk.get("kind") == "handle":
            self.handle_users[pk.get("handle", 0)].add(gid)
        self.graphs[gid] = (g, op["input"])
        for k, t in outs.items():
            self.put(k, t, -1, ("graph", gid))
        del outs
        for _ in range(int(op.get("replays", 0))):
            g.replay()

    def op_replay(self, op):
        g = self.graphs.get(op["graph"])
        if g is None:
            return
        for _ in range(int(op.get("times", 1))):
            g[0].replay()

    def op_del_graph(self, op):
        g = self.graphs.pop(op["graph"], None)
        if g is None:
            return
        for users in self.handle_users.values():
            users.discard(op["graph"])
        self.free(g[1])
        del g
        gc.collect()

    def op_pool_new(self, op):
        if op["pool"] not in self.pools:
            self.pools[op["pool"]] = self.torch.cuda.MemPool()

    def op_in_pool(self, op):
        pool = self.pools.get(op["pool"])
        if pool is None:
            return
        try:
            with self.torch.cuda.use_mem_pool(pool):
                self.body(op.get("body", []), {k: r.t for k, r in self.slots.items()
                                                if r.owner == ("pool", op["pool"])},
                          0, ("pool", op["pool"]), False)
        except RuntimeError as e:
            if isinstance(e, self.torch.cuda.OutOfMemoryError) or "expandable" not in str(e):
                raise
            # a PyTorch that refuses MemPool under expandable segments
            self.notes.append("in_pool refused: " + str(e).splitlines()[0])
            print("torchgen: " + self.notes[-1], file=sys.stderr)

    def op_pool_del(self, op):
        pool = self.pools.pop(op["pool"], None)
        if pool is None:
            return
        for k in sorted(k for k, r in self.slots.items() if r.owner == ("pool", op["pool"])):
            self.free(k)
        del pool
        gc.collect()

    def op_compile(self, op):
        torch = self.torch
        d = int(op["d"])
        w = torch.empty((d, d), dtype=torch.float32, device="cuda")
        w.fill_(0.01)

        def f(x):
            return torch.relu(x @ w) + 1

        last = None
        try:
            cf = torch.compile(f, mode="reduce-overhead", dynamic=op.get("dynamic", False))
            mark = getattr(getattr(torch, "compiler", None), "cudagraph_mark_step_begin", None)
            with torch.no_grad():
                for rows in op["rows"]:
                    for _ in range(int(op.get("calls", 3))):
                        if mark is not None:
                            mark()
                        x = torch.empty((int(rows), d), dtype=torch.float32, device="cuda")
                        x.fill_(1.0)
                        out = cf(x)
                        last = out.clone()
                        del out, x
        except torch.cuda.OutOfMemoryError:
            raise
        except Exception as e:  # noqa: BLE001 (no compiler on the machine)
            self.notes.append("compile failed: %s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else ""))
            print("torchgen: " + self.notes[-1], file=sys.stderr)
        del w
        if last is not None:
            self.put(op["slot"], last, 0)

    def relieve(self):
        """relieve frees every second live tensor (by slot, graph inputs
        kept): what the program does after a caught OOM."""
        live = sorted(k for k, r in self.slots.items() if r.owner != "ginput")
        for k in live[::2]:
            self.free(k)

    def run(self):
        torch = self.torch
        for i, op in enumerate(self.prog["ops"]):
            fn = getattr(self, "op_" + str(op.get("op")), None)
            if fn is None:
                raise ValueError("op %d: unknown op %r" % (i, op.get("op")))
            msg = None
            try:
                fn(op)
            except torch.cuda.OutOfMemoryError as e:
                msg = str(e).split(".")[0] + "."
            if msg is not None:
                self.ooms.append(msg)
                self.relieve()
        torch.cuda.synchronize()


def run_program(prog, outdir, name):
    """run_program runs prog in this process and writes outdir/NAME.pickle.gz
    and outdir/NAME.stats.json. It sets PYTORCH_CUDA_ALLOC_CONF before it
    imports torch, so it must be the first to import torch in the process."""
    conf = prog.get("alloc_conf", "")
    os.environ.pop("PYTORCH_ALLOC_CONF", None)  # the newer name would win
    if conf:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = conf
    else:
        os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if any(op.get("op") == "compile" for op in prog.get("ops", [])):
        os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    if "torch" in sys.modules:
        raise RuntimeError("torch was imported before the settings were set")
    try:
        # This file's folder is first on sys.path when it runs as a
        # script, and its name is PyTorch's own torchgen package's, which
        # torch imports: take the folder off before the import.
        here = os.path.dirname(os.path.abspath(__file__))
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
        sys.modules.pop("torchgen", None)
        import torch
    except ImportError as e:
        print("torchgen: cannot import torch: %s" % e, file=sys.stderr)
        sys.exit(2)
    if not torch.cuda.is_available():
        print("torchgen: no CUDA device", file=sys.stderr)
        sys.exit(2)
    torch.cuda.init()
    total = torch.cuda.mem_get_info()[1]
    cap_bytes = 0
    cap = int(prog.get("cap_bytes", 0) or 0)
    if cap:
        frac = min(1.0, cap / total)
        torch.cuda.set_per_process_memory_fraction(frac, 0)
        cap_bytes = int(frac * total)
    # As users record (the README's recipe): PyTorch's defaults.
    torch.cuda.memory._record_memory_history(max_entries=1_000_000)
    t0 = time.time()
    r = Runner(torch, prog)
    r.run()
    wall = time.time() - t0
    path = os.path.join(outdir, name)
    torch.cuda.memory._dump_snapshot(path + ".pickle")
    with open(path + ".pickle", "rb") as fin, gzip.open(path + ".pickle.gz", "wb") as fout:
        fout.write(fin.read())
    os.remove(path + ".pickle")
    snap = torch.cuda.memory._snapshot()
    stats = {
        "workload": "fuzz_torch",
        "label": name,
        "seed": prog.get("seed"),
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(0),
        "wall_s": wall,
        "mem_cap_bytes": cap_bytes,
        "oom": r.ooms[0] if r.ooms else "",
        "ooms_caught": len(r.ooms),
        "max_memory_reserved": torch.cuda.max_memory_reserved(),
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
        "memory_reserved_end": torch.cuda.memory_reserved(),
        "memory_allocated_end": torch.cuda.memory_allocated(),
        "trace_entries": len(snap["device_traces"][0]),
        "memory_stats": dict(torch.cuda.memory_stats()),
    }
    with open(path + ".stats.json", "w") as f:
        json.dump(stats, f, indent=1, sort_keys=False)
    print(name, {k: stats[k] for k in ("max_memory_reserved", "max_memory_allocated", "mem_cap_bytes", "ooms_caught", "trace_entries")},
          {k: stats["memory_stats"].get(k) for k in ("num_device_alloc", "num_device_free", "num_alloc_retries", "num_ooms")},
          "notes=%d" % len(r.notes) if r.notes else "", flush=True)
    return stats


def write_program(prog, f):
    """write_program writes prog as JSON to the file f: the header's keys
    one a line, then the ops one a line (so that two programs diff op by
    op)."""
    f.write("{\n")
    for k, v in prog.items():
        if k != "ops":
            f.write(" %s: %s,\n" % (json.dumps(k), json.dumps(v)))
    ops = prog.get("ops", [])
    f.write(' "ops": [')
    f.write(",".join("\n  " + json.dumps(op, separators=(",", ":")) for op in ops))
    f.write("\n ]\n}\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--program", help="run this program (JSON) instead of generating one")
    ap.add_argument("--name", help="output name (default: the program's, torch_SEED)")
    ap.add_argument("--generate-only", action="store_true", help="write NAME.prog.json and stop (no torch)")
    a = ap.parse_args(argv)
    if a.program:
        with open(a.program) as f:
            prog = json.load(f)
        if not isinstance(prog, dict) or not isinstance(prog.get("ops"), list):
            print("torchgen: %s: not a program (no ops list)" % a.program, file=sys.stderr)
            return 1
    else:
        prog = generate(a.seed)
    name = a.name or prog.get("name") or "torch_%d" % a.seed
    prog["name"] = name
    prog["trace"] = name + ".pickle.gz"
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, name + ".prog.json"), "w") as f:
        write_program(prog, f)
    if a.generate_only:
        return 0
    try:
        run_program(prog, a.out, name)
    except SystemExit:
        raise
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
        print("torchgen: %s: the program failed" % name, file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    # Everything is written: leave without tearing down what the program
    # left (graphs, pools, tensors, compile workers) at interpreter exit,
    # where a failure would turn a good recording into a crash.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Seeded random CuPy programs, run and recorded as testdata/cupy/record.py
records, for differential testing of the cupy policy against CuPy's pool.

    python3 cupygen.py --seed S --out DIR [--program FILE.json] [--name NAME]
                       [--no-run] [--timeout SECONDS]

Without --program it draws program S from random.Random(S) (the same
program for the same S, on any machine) and writes it to DIR/NAME.prog.json
(NAME defaults to cupy_S); with --program it runs that program instead (a
shrunk one, say; NAME then defaults to the program's "name", else the file's
name less .prog.json) and writes it again as DIR/NAME.prog.json. --no-run
(or --generate-only) stops there. Otherwise it
runs the program in a fresh process (the pool starts empty), under CuPy's
DebugPrintHook, and writes beside it

  NAME.jsonl       the lines DebugPrintHook prints (flush=False), one JSON
                   object per device alloc, pool malloc and pool free; the
                   program's "trace": what `replay fidelity` is given;
  NAME.stats.json  the pool's real figures, as record.py writes them and
                   fidelity reads them: peak_total_bytes (the peak of
                   total_bytes(), read in a hook after every device alloc and
                   pool malloc), device_allocs, limit_bytes (set_limit),
                   ooms_caught; and what the log cannot show: the
                   free_all_blocks() calls the program made
                   (free_all_blocks_calls, and free_all_blocks_at: per call
                   the op, the log line it came before and the bytes it gave
                   back) and the other drops of total_bytes() between two
                   hooked calls (unlogged_device_frees: CuPy's own
                   free_all_blocks before an OOM under the limit, or cuFFT's);
  NAME.streams     one line per malloc line of the log with size > 0 (each
                   malloc or failed-malloc event the importer makes): the
                   stream it was made on, 0 the default stream and K the
                   program's K-th side stream (the pool keeps an arena per
                   stream; the log names none), as testdata/cupy/*.streams;
  NAME.log         the child's output.

It exits 0 when the program ran (the OutOfMemoryErrors, and MemoryErrors of
thrust's allocator, that the program caught are part of it), 1 with a
message when it did not, 2 with a message for a bad program or arguments,
or where there is no CuPy or no GPU (not the program's failure).

A program is JSON: a header and "ops", a list of operations on slots
(integer ids, each made by one op, never reused):

  {"format": "allocsim-fuzz/cupy/1", "kind": "cupy", "seed": S, "name": ...,
   "trace": "NAME.jsonl", "limit_bytes": L (0: no set_limit),
   "streams": [{"non_blocking": bool}, ...] (the side streams 1..K),
   "budget_bytes": B (the live bytes the generator kept under), "ops": [...]}

Every op has "op"; one that makes an array has "out" (its slot), with the
"shape" and "dtype" the generator expects; one that reads arrays has "args"
(their slots); one that computes has "stream" (0 or a side stream, entered
with a `with` block). Dropping an op that has "out" X means dropping every
op whose "args" hold X (drop_ops does it; op_refs gives an op's (defs,
uses) for run.py's shrinker); the runner also skips, and counts in
skipped_ops, an op whose args were never made (its maker was dropped or ran
out of memory).

  empty   {out, nbytes, fill: empty|zeros|ones}  a uint8 array of nbytes
          (log-uniform 1 B .. 64 MiB mostly, to 1 GiB at times, odd counts,
          some multiples of 512 and powers of two, a few of 0 bytes)
  mat     {out, n, dtype}  cupy.random.standard_normal((n, n)), n 64..3000
          (log-uniform), float32 or float64
  vec     {out, length, dtype}  a random float32/float64/complex64 vector
  matmul  {out, args [a, b], transpose_b}  a @ b (or b.T)
  solve   {out, args [a, b], k}  cupy.linalg.solve(a, b[:, :k]) (k 0: b[:, 0])
  svd     {out, args [a], full_matrices, compute_uv, keep: u|s|vh|all}  (n up
          to 2048, on a matrix of random normals or a copy of one)
  fft     {out, args [x], kind: fft|ifft|rfft|irfft|fft2|ifft2|rfft2, n}
  sort    {out, args [x], kind: sort|argsort}, or kind inplace (no out)
  slice   {out, args [x], start, stop, step, copy}  x[start:stop:step], a
          view (holding x's memory) or a copy
  copy    {out, args [x], transpose}
  ew      {out, args [x], fn: tanh_mean|abs|add1|astype_f32|cumsum}
  reduce  {out, args [x], fn: sum|mean|max, axis}
  free    {args [x]}  del
  sync    {stream}  the side stream's synchronize(), or (-1) the device's
  free_all_blocks {}  cupy.get_default_memory_pool().free_all_blocks()
  fft_cache_clear {}  cupy.fft.config.clear_plan_cache() (frees the plans'
          work areas)

The limit, when there is one, is set before the hooks, as record.py sets
it; every other CuPy call is made under them. The slots alive at the end are
released in slot order inside the hooks, and the device synchronized, before
the figures are read.
"""
import argparse
import json
import math
import os
import random
import subprocess
import sys
import time
import traceback

KIND = "cupy"
FORMAT = "allocsim-fuzz/cupy/1"
KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30

ITEMSIZE = {"uint8": 1, "uint64": 8, "int64": 8, "float32": 4, "float64": 8, "complex64": 8, "complex128": 16}
REAL = ("float32", "float64")
COMPLEX = ("complex64", "complex128")
FLOAT = REAL + COMPLEX
COMPLEX_OF = {"float32": "complex64", "complex64": "complex64", "float64": "complex128", "complex128": "complex128"}
REAL_OF = {"float32": "float32", "complex64": "float32", "float64": "float64", "complex128": "float64"}

OPS = ("empty", "mat", "vec", "matmul", "solve", "svd", "fft", "sort", "slice", "copy", "ew", "reduce", "free", "sync",
       "free_all_blocks", "fft_cache_clear")


def log_uniform(r, lo, hi):
    return int(math.exp(r.uniform(math.log(lo), math.log(hi))))


def rounded(n):
    """CuPy's pool rounds every malloc up to 512 bytes."""
    return (n + 511) // 512 * 512


def prod(shape):
    p = 1
    for d in shape:
        p *= d
    return p


def nbytes_of(shape, dtype):
    return prod(shape) * ITEMSIZE[dtype]


# ---------------------------------------------------------------------------
# Generation


class Gen:
    """Draws one program from random.Random(seed), keeping its live bytes
    (memory held by live slots, views included, plus each op's estimated
    temporaries) under a budget."""

    def __init__(self, seed):
        self.seed = seed
        r = self.rng = random.Random(seed)
        self.n_ops = r.randint(20, 300)
        nside = r.choice([0, 0, 0, 1, 1, 2, 3])
        self.streams = [{"non_blocking": r.random() < 0.5} for _ in range(nside)]
        self.side_share = r.uniform(0.2, 0.6) if nside else 0.0
        budget = log_uniform(r, 256 * MiB, 5 * GiB // 2)
        # Each stream keeps its own free chunks: leave room for them.
        self.budget = min(budget, int(7 * GiB // 2 / (1 + 0.5 * nside)))
        u = r.random()
        if u < 0.3:  # tight: OOMs expected
            self.limit = int(self.budget * r.uniform(0.3, 0.9)) // MiB * MiB + r.randrange(1, MiB)
        elif u < 0.55:  # loose: a cap no program should reach
            self.limit = 4 * GiB + r.randrange(1, MiB)
        else:
            self.limit = 0
        self.fab_rate = r.choice([0.0, 0.0, 0.01, 0.02, 0.04, 0.08])
        self.big_share = r.choice([0.05, 0.12, 0.2])
        # cuSOLVER's gesvd is slow: the program's svds on n up to 2048, the
        # sum of their n^3 at most 2048^3.
        self.svd_left = 2048 ** 3
        self.svd_count = 0
        self.ops = []
        self.slots = {}  # slot -> {"shape", "dtype", "bufs": [buf ids], "parts": for svd tuples}
        # CuPy's cuFFT plan cache (16 plans, least recently used out) holds
        # each plan's work area from the pool: key -> bytes, about.
        self.plans = {}
        self.bufs = {}  # buf -> [bytes, refs]
        self.next_slot = 0
        self.next_buf = 0

    # -- bookkeeping

    def live_bytes(self):
        return sum(b[0] for b in self.bufs.values()) + sum(self.plans.values())

    def use_plan(self, key, nbytes):
        self.plans.pop(key, None)
        self.plans[key] = rounded(nbytes)
        while len(self.plans) > 16:
            del self.plans[next(iter(self.plans))]

    def new_buf(self, n):
        b = self.next_buf
        self.next_buf += 1
        self.bufs[b] = [rounded(n) if n else 0, 0]
        return b

    def add_slot(self, shape, dtype, bufs, parts=None):
        s = self.next_slot
        self.next_slot += 1
        for b in bufs:
            self.bufs[b][1] += 1
        # contig: known C-contiguous (in-place sort needs it); clean: random
        # normal values, or a copy of them (svd iterates: kept off the
        # infinities a chain of matmuls can reach).
        self.slots[s] = {"shape": list(shape), "dtype": dtype, "bufs": list(bufs), "parts": parts,
                         "contig": False, "clean": False}
        return s

    def emit(self, op):
        self.ops.append(op)
        return op

    def drop_slot(self, s):
        info = self.slots.pop(s)
        for b in info["bufs"]:
            self.bufs[b][1] -= 1
            if self.bufs[b][1] == 0:
                del self.bufs[b]

    def free(self, s):
        self.emit({"op": "free", "args": [s]})
        self.drop_slot(s)

    def pick_free(self):
        keys = list(self.slots)
        u = self.rng.random()
        if u < 0.25:
            return keys[0]
        if u < 0.4:
            return keys[-1]
        return self.rng.choice(keys)

    def make_room(self, need, keep=()):
        """Frees slots (not those in keep) until need more bytes fit, and
        the FFT plans first when they hold much."""
        if self.live_bytes() + need > self.budget and sum(self.plans.values()) > self.budget // 4:
            self.emit({"op": "fft_cache_clear"})
            self.plans.clear()
        while self.live_bytes() + need > self.budget:
            cand = [s for s in self.slots if s not in keep]
            if not cand:
                return False
            s = self.pick_free()
            if s in keep:
                s = self.rng.choice(cand)
            self.free(s)
        return True

    def stream(self):
        if self.streams and self.rng.random() < self.side_share:
            return self.rng.randint(1, len(self.streams))
        return 0

    def arrays(self, pred):
        """The live array slots (not svd tuples, not empty) that pred takes."""
        return [s for s, i in self.slots.items() if i["parts"] is None and prod(i["shape"]) > 0 and pred(i)]

    def produce(self, op, shape, dtype, temps, args=(), parts=None, view_of=None, contig=False, clean=False):
        """Emits op making one array (or an svd tuple of parts), after making
        room for it and its temporaries; returns its slot, None if it made
        none."""
        r = self.rng
        if parts is None:
            out_bytes = 0 if view_of is not None else rounded(nbytes_of(shape, dtype))
        else:
            out_bytes = sum(rounded(nbytes_of(sh, dt)) for sh, dt in parts)
        if not self.make_room(out_bytes + temps, keep=args):
            if self.limit == 0 or self.limit > self.budget:
                return None  # does not fit without an OOM the limit would not give
        if "stream" not in op:
            op["stream"] = self.stream()
        s = self.next_slot
        op["out"] = s
        if parts is None:
            op["shape"], op["dtype"] = list(shape), dtype
            bufs = self.slots[view_of]["bufs"] if view_of is not None else [self.new_buf(nbytes_of(shape, dtype))]
        else:
            op["shape"] = [list(sh) for sh, _ in parts]
            op["dtype"] = [dt for _, dt in parts]
            bufs = [self.new_buf(nbytes_of(sh, dt)) for sh, dt in parts]
        self.emit(op)
        self.add_slot(shape if parts is None else [], dtype if parts is None else "tuple", bufs,
                      parts=None if parts is None else list(parts))
        self.slots[s]["contig"], self.slots[s]["clean"] = contig, clean
        return s

    # -- sizes

    def draw_nbytes(self):
        r = self.rng
        u = r.random()
        if u < 0.01:
            return 0
        if u < 1 - self.big_share:
            n = log_uniform(r, 1, 64 * MiB)
        else:
            n = log_uniform(r, 64 * MiB, GiB)
        v = r.random()
        if v < 0.08:
            n = max(512, n // 512 * 512)
        elif v < 0.12:
            n = 1 << max(0, n.bit_length() - 1)
        if rounded(n) > self.budget * 0.8:
            n = int(self.budget * r.uniform(0.05, 0.5)) | 1
        return max(n, 1)

    # -- ops

    def op_empty(self):
        n = self.draw_nbytes()
        fill = self.rng.choice(["empty", "empty", "empty", "zeros", "ones"])
        return self.produce({"op": "empty", "nbytes": n, "fill": fill}, [n], "uint8", 0, contig=True)

    def op_mat(self):
        r = self.rng
        n = log_uniform(r, 64, 3000)
        dt = "float32" if r.random() < 0.6 else "float64"
        return self.produce({"op": "mat", "n": n, "dtype": dt}, [n, n], dt, nbytes_of([n + 1, n], dt), contig=True,
                            clean=True)

    def op_vec(self):
        r = self.rng
        length = log_uniform(r, 16, 1 << 24)
        dt = r.choice(["float32", "float32", "float64", "complex64"])
        return self.produce({"op": "vec", "length": length, "dtype": dt}, [length], dt,
                            nbytes_of([length + 1], "float64") * 2, contig=True)

    def square(self, i):
        return len(i["shape"]) == 2 and i["shape"][0] == i["shape"][1] and i["dtype"] in FLOAT

    def op_matmul(self):
        r = self.rng
        cands = self.arrays(self.square)
        if not cands:
            return None
        a = r.choice(cands)
        ia = self.slots[a]
        bs = [s for s in cands if self.slots[s]["shape"] == ia["shape"] and self.slots[s]["dtype"] == ia["dtype"]]
        b = r.choice(bs)
        return self.produce({"op": "matmul", "args": [a, b], "transpose_b": r.random() < 0.3}, ia["shape"],
                            ia["dtype"], 0, args=(a, b), contig=True)

    def op_solve(self):
        r = self.rng
        cands = self.arrays(lambda i: self.square(i) and i["dtype"] in REAL)
        if not cands:
            return None
        a = r.choice(cands)
        ia = self.slots[a]
        n = ia["shape"][0]
        bs = [s for s in cands if self.slots[s]["shape"] == ia["shape"] and self.slots[s]["dtype"] == ia["dtype"]]
        b = r.choice(bs)
        k = r.choice([0, 1, r.randint(1, n), n])
        shape = [n] if k == 0 else [n, k]
        temps = nbytes_of([n, n], ia["dtype"]) * 2 + nbytes_of([n, max(k, 1)], ia["dtype"]) + 8 * n
        return self.produce({"op": "solve", "args": [a, b], "k": k}, shape, ia["dtype"], temps, args=(a, b))

    def op_svd(self):
        r = self.rng
        if self.svd_count >= 4:
            return None
        cands = self.arrays(lambda i: self.square(i) and i["clean"] and i["dtype"] in REAL
                            and i["shape"][0] ** 3 <= self.svd_left)
        if not cands:
            return None
        a = r.choice(cands)
        ia = self.slots[a]
        n, dt = ia["shape"][0], ia["dtype"]
        full = r.random() < 0.5
        uv = r.random() < 0.8
        keep = r.choice(["u", "s", "vh", "all"]) if uv else "s"
        temps = nbytes_of([n, n], dt) * 4
        op = {"op": "svd", "args": [a], "full_matrices": full, "compute_uv": uv, "keep": keep}
        if keep == "all":
            parts = [([n, n], dt), ([n], dt), ([n, n], dt)]
            s = self.produce(op, None, None, temps, args=(a,), parts=parts)
        else:
            s = self.produce(op, [n] if keep == "s" else [n, n], dt, temps, args=(a,))
        if s is not None:
            self.svd_left -= n ** 3
            self.svd_count += 1
        return s

    def op_fft(self):
        r = self.rng
        cands = self.arrays(lambda i: i["dtype"] in FLOAT and len(i["shape"]) in (1, 2))
        if not cands:
            return None
        x = r.choice(cands)
        ix = self.slots[x]
        shape, dt = ix["shape"], ix["dtype"]
        cplx = dt in COMPLEX
        n = None
        if len(shape) == 1:
            kinds = ["fft", "ifft", "irfft"] if cplx else ["fft", "ifft", "rfft"]
            kind = r.choice(kinds)
            if kind == "irfft" and shape[0] < 2:
                kind = "fft"
            if r.random() < 0.3:
                n = log_uniform(r, 2, max(3, shape[0] * 2))
            L = n if n is not None else shape[0]
            if kind == "rfft":
                out = ([L // 2 + 1], COMPLEX_OF[dt])
            elif kind == "irfft":
                out = ([n if n is not None else 2 * (shape[0] - 1)], REAL_OF[dt])
            else:
                out = ([L], COMPLEX_OF[dt])
        else:
            kinds = ["fft2", "ifft2"] if cplx else ["fft2", "ifft2", "rfft2", "fft"]
            kind = r.choice(kinds)
            if kind == "rfft2":
                out = ([shape[0], shape[1] // 2 + 1], COMPLEX_OF[dt])
            else:
                out = (list(shape), COMPLEX_OF[dt])
        ob = nbytes_of(*out)
        if ob > 128 * MiB:
            return None
        work = 2 * max(ob, nbytes_of(shape, COMPLEX_OF[dt]))  # the plan's work area, about
        temps = ob + nbytes_of(shape, COMPLEX_OF[dt]) + work
        op = {"op": "fft", "args": [x], "kind": kind}
        if n is not None:
            op["n"] = n
        s = self.produce(op, out[0], out[1], temps, args=(x,))
        if s is not None:
            self.use_plan(json.dumps([kind, shape, dt, n, op["stream"]]), work)
        return s

    def op_sort(self):
        r = self.rng
        cands = self.arrays(lambda i: i["dtype"] in ("uint8",) + REAL and len(i["shape"]) in (1, 2)
                            and nbytes_of(i["shape"], i["dtype"]) <= 256 * MiB)
        if not cands:
            return None
        x = r.choice(cands)
        ix = self.slots[x]
        nb = nbytes_of(ix["shape"], ix["dtype"])
        kind = r.choice(["sort", "sort", "inplace", "argsort"])
        if kind == "argsort" and (prod(ix["shape"]) * 8 > 64 * MiB or not ix["contig"]):
            kind = "sort"
        if kind == "inplace" and not ix["contig"]:
            kind = "sort"  # CuPy sorts no view in place
        if kind == "inplace":
            if not self.make_room(2 * nb, keep=(x,)):
                return None
            return self.emit({"op": "sort", "args": [x], "kind": "inplace", "stream": self.stream()})
        if kind == "argsort":
            return self.produce({"op": "sort", "args": [x], "kind": kind}, ix["shape"], "int64", 3 * nb, args=(x,),
                                contig=True)
        return self.produce({"op": "sort", "args": [x], "kind": kind}, ix["shape"], ix["dtype"], 2 * nb, args=(x,),
                            contig=True)

    def op_slice(self):
        r = self.rng
        cands = self.arrays(lambda i: len(i["shape"]) in (1, 2))
        if not cands:
            return None
        x = r.choice(cands)
        ix = self.slots[x]
        n = ix["shape"][0]
        start = r.randrange(n)
        stop = r.randint(start + 1, n)
        step = r.choice([1, 1, 1, 2, 3, 7])
        length = len(range(start, stop, step))
        shape = [length] + ix["shape"][1:]
        copy = r.random() < 0.5
        op = {"op": "slice", "args": [x], "start": start, "stop": stop, "step": step, "copy": copy}
        if copy:
            return self.produce(op, shape, ix["dtype"], 0, args=(x,), contig=True)
        return self.produce(op, shape, ix["dtype"], 0, args=(x,), view_of=x, contig=ix["contig"] and step == 1)

    def op_copy(self):
        r = self.rng
        cands = self.arrays(lambda i: True)
        if not cands:
            return None
        x = r.choice(cands)
        ix = self.slots[x]
        tr = len(ix["shape"]) == 2 and r.random() < 0.5
        shape = ix["shape"][::-1] if tr else ix["shape"]
        return self.produce({"op": "copy", "args": [x], "transpose": tr}, shape, ix["dtype"], 0, args=(x,),
                            contig=True, clean=ix["clean"])

    def op_ew(self):
        r = self.rng
        cands = self.arrays(lambda i: True)
        if not cands:
            return None
        x = r.choice(cands)
        ix = self.slots[x]
        dt = ix["dtype"]
        fns = ["abs", "add1"]
        if dt in FLOAT:
            fns += ["tanh_mean", "tanh_mean"]
        if dt == "uint8":
            fns += ["astype_f32"]
        if len(ix["shape"]) == 1 and dt in ("uint8",) + REAL:
            fns += ["cumsum"]
        fn = r.choice(fns)
        if fn == "abs":
            odt = REAL_OF.get(dt, dt)
        elif fn == "astype_f32":
            odt = "float32"
        elif fn == "cumsum":
            odt = "uint64" if dt == "uint8" else dt
        else:
            odt = dt
        ob = nbytes_of(ix["shape"], odt)
        temps = {"tanh_mean": 2 * ob, "cumsum": ob}.get(fn, 0)
        if ob > 512 * MiB:
            return None
        return self.produce({"op": "ew", "args": [x], "fn": fn}, ix["shape"], odt, temps, args=(x,),
                            contig=ix["contig"])

    def op_reduce(self):
        r = self.rng
        cands = self.arrays(lambda i: i["dtype"] in ("uint8",) + FLOAT)
        if not cands:
            return None
        x = r.choice(cands)
        ix = self.slots[x]
        dt = ix["dtype"]
        fns = ["sum", "mean"] + (["max"] if dt not in COMPLEX else [])
        fn = r.choice(fns)
        axis = r.choice([None] + list(range(len(ix["shape"]))))
        shape = [] if axis is None else [d for k, d in enumerate(ix["shape"]) if k != axis]
        if fn == "sum":
            odt = "uint64" if dt == "uint8" else dt
        elif fn == "mean":
            odt = "float64" if dt == "uint8" else dt
        else:
            odt = dt
        return self.produce({"op": "reduce", "args": [x], "fn": fn, "axis": axis}, shape, odt, MiB, args=(x,))

    def op_free(self):
        if not self.slots:
            return None
        s = self.pick_free()
        self.free(s)
        return s

    def op_sync(self):
        r = self.rng
        k = r.randint(1, len(self.streams)) if self.streams and r.random() < 0.7 else -1
        return self.emit({"op": "sync", "stream": k})

    def generate(self):
        r = self.rng
        weights = {"empty": 24, "mat": 7, "vec": 6, "matmul": 7, "solve": 4, "svd": 2, "fft": 6, "sort": 4,
                   "slice": 5, "copy": 3, "ew": 5, "reduce": 3, "free": 16, "sync": 3}
        names = list(weights)
        w = [weights[k] for k in names]
        final_frees = r.random() < 0.5
        while len(self.ops) + (len(self.slots) if final_frees else 0) < self.n_ops:
            if r.random() < self.fab_rate:
                self.emit({"op": "free_all_blocks"})
                continue
            if r.random() < 0.005:
                self.emit({"op": "fft_cache_clear"})
                self.plans.clear()
                continue
            name = r.choices(names, w)[0]
            if name == "free" and len(self.slots) < 2 and r.random() < 0.8:
                continue
            if name == "sync" and not self.streams and r.random() < 0.7:
                continue
            getattr(self, "op_" + name)()
        # Free what is left, in a random order, or leave it to the end.
        if final_frees:
            rest = list(self.slots)
            r.shuffle(rest)
            for s in rest:
                self.free(s)
        return {
            "format": FORMAT,
            "kind": KIND,
            "generator": "cupygen.py",
            "seed": self.seed,
            "limit_bytes": self.limit,
            "streams": self.streams,
            "budget_bytes": self.budget,
            "ops": self.ops,
        }


def generate(seed):
    """Program seed: a JSON-serialisable dict (without name and trace)."""
    return Gen(seed).generate()


def op_refs(op):
    """(defs, uses) of op: the slot it makes and the slots it reads, as
    run.py's shrinker asks."""
    return ([op["out"]] if "out" in op else []), list(op.get("args", ()))


def drop_ops(prog, indices):
    """A copy of prog without the ops at indices and every op that reads a
    slot one of them made (transitively)."""
    drop = set(indices)
    gone = set()
    ops = []
    for i, op in enumerate(prog["ops"]):
        if i in drop or any(a in gone for a in op.get("args", ())):
            if "out" in op:
                gone.add(op["out"])
            continue
        ops.append(op)
    out = dict(prog)
    out["ops"] = ops
    return out


def check_program(prog):
    """Problems with prog's form (a list of strings, empty when none)."""
    errs = []
    if prog.get("kind") != KIND:
        errs.append("kind is %r, not %r" % (prog.get("kind"), KIND))
    if not isinstance(prog.get("ops"), list):
        return errs + ["no ops list"]
    if not isinstance(prog.get("limit_bytes", 0), int) or prog.get("limit_bytes", 0) < 0:
        errs.append("bad limit_bytes")
    nstreams = len(prog.get("streams", []))
    seen = set()
    for i, op in enumerate(prog["ops"]):
        if not isinstance(op, dict) or op.get("op") not in OPS:
            errs.append("op %d: unknown op %r" % (i, op.get("op") if isinstance(op, dict) else op))
            continue
        if "out" in op:
            if op["out"] in seen:
                errs.append("op %d: slot %r made twice" % (i, op["out"]))
            seen.add(op["out"])
        if not all(isinstance(a, int) for a in op.get("args", [])):
            errs.append("op %d: args not slots" % i)
        st = op.get("stream", 0)
        if op["op"] == "sync":
            if st != -1 and not 1 <= st <= nstreams:
                errs.append("op %d: sync of stream %r of %d" % (i, st, nstreams))
        elif not 0 <= st <= nstreams:
            errs.append("op %d: stream %r of %d" % (i, st, nstreams))
    return errs


def dump_program(prog, path):
    """Writes prog with one op a line, atomically."""
    head = {k: v for k, v in prog.items() if k != "ops"}
    text = json.dumps(head, indent=1)
    text = text[:text.rindex("}")].rstrip() + ',\n "ops": [\n'
    text += ",\n".join("  " + json.dumps(op) for op in prog["ops"]) + "\n ]\n}\n"
    tmp = path + ".tmp%d" % os.getpid()
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


# ---------------------------------------------------------------------------
# Running (in the child: needs CuPy and a GPU)


def run_op(cp, op, a, state):
    """Runs one op on its arguments a (arrays); returns what it makes."""
    kind = op["op"]
    if kind == "empty":
        f = {"empty": cp.empty, "zeros": cp.zeros, "ones": cp.ones}[op["fill"]]
        return f(op["nbytes"], dtype=cp.uint8)
    if kind == "mat":
        n = op["n"]
        return cp.random.standard_normal((n, n), dtype=getattr(cp, op["dtype"]))
    if kind == "vec":
        L, dt = op["length"], op["dtype"]
        if dt in COMPLEX:
            return cp.random.standard_normal(L, dtype=getattr(cp, REAL_OF[dt])).astype(getattr(cp, dt))
        return cp.random.standard_normal(L, dtype=getattr(cp, dt))
    if kind == "matmul":
        x, y = a
        return x @ (y.T if op["transpose_b"] else y)
    if kind == "solve":
        x, y = a
        k = op["k"]
        return cp.linalg.solve(x, y[:, 0] if k == 0 else y[:, :k])
    if kind == "svd":
        res = cp.linalg.svd(a[0], full_matrices=op["full_matrices"], compute_uv=op["compute_uv"])
        if not op["compute_uv"]:
            return res
        u, s, vh = res
        del res
        return {"u": u, "s": s, "vh": vh, "all": (u, s, vh)}[op["keep"]]
    if kind == "fft":
        x = a[0]
        k = op["kind"]
        n = op.get("n")
        if k in ("fft2", "ifft2", "rfft2"):
            return getattr(cp.fft, k)(x)
        return getattr(cp.fft, k)(x, n=n, axis=-1)
    if kind == "sort":
        x = a[0]
        if op["kind"] == "inplace":
            x.sort()
            return None
        return cp.sort(x) if op["kind"] == "sort" else cp.argsort(x)
    if kind == "slice":
        v = a[0][op["start"]:op["stop"]:op["step"]]
        return v.copy() if op["copy"] else v
    if kind == "copy":
        x = a[0]
        return cp.ascontiguousarray(x.T) if op["transpose"] else x.copy()
    if kind == "ew":
        x = a[0]
        fn = op["fn"]
        if fn == "tanh_mean":
            return cp.tanh(x) * 0.5 + x.mean()
        if fn == "abs":
            return cp.abs(x)
        if fn == "add1":
            return x + 1
        if fn == "astype_f32":
            return x.astype(cp.float32)
        if fn == "cumsum":
            return cp.cumsum(x)
        raise ValueError("unknown ew fn %r" % fn)
    if kind == "reduce":
        x = a[0]
        return getattr(x, op["fn"])(axis=op["axis"])
    raise ValueError("unknown op %r" % kind)


def shape_of(v):
    if isinstance(v, tuple):
        return [list(x.shape) for x in v]
    return list(v.shape)


def dtype_of(v):
    if isinstance(v, tuple):
        return [str(x.dtype) for x in v]
    return str(v.dtype)


def no_device(msg):
    """Exits 2: no framework or no GPU here (not the program's failure)."""
    print("cupygen: %s" % msg, file=sys.stderr)
    sys.exit(2)


def child(prog_path, outdir, name):
    try:
        import cupy as cp
        from cupy.cuda import memory_hooks
    except ImportError as e:
        no_device("cannot import cupy: %s" % e)
    try:
        n = cp.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001: CUDARuntimeError where there is no driver
        no_device("no CUDA device: %s" % e)
    if n < 1:
        no_device("no CUDA device")
    with open(prog_path) as f:
        prog = json.load(f)
    pool = cp.get_default_memory_pool()
    if prog.get("limit_bytes"):
        pool.set_limit(size=prog["limit_bytes"])

    class Watch(cp.cuda.MemoryHook):
        """record.py's peak, with what the log does not show."""
        name = "allocsim-fuzz"

        def __init__(self):
            self.peak = 0
            self.allocs = 0
            self.alloc_bytes = 0
            self.failed_allocs = 0
            self.mallocs = 0
            self.failed_mallocs = 0
            self.frees = 0
            self.lines = 0  # the log lines so far
            self.stream_of = {}  # stream ptr -> 0 (default), K (side stream K)
            self.streams = []  # per malloc line of size > 0
            self.last_total = pool.total_bytes()
            self.unlogged = []  # drops of total_bytes() the log does not show

        def _total(self, grow):
            t = pool.total_bytes()
            if t < self.last_total + grow:
                self.unlogged.append({"line": self.lines, "bytes": self.last_total + grow - t})
            self.last_total = t
            return t

        def alloc_postprocess(self, **kw):
            self.allocs += 1
            self.alloc_bytes += kw["mem_size"]
            if not kw["mem_ptr"]:
                self.failed_allocs += 1
            self.peak = max(self.peak, self._total(kw["mem_size"]))
            self.lines += 1

        def malloc_postprocess(self, **kw):
            self.mallocs += 1
            if kw["size"] > 0:
                if not kw["mem_ptr"]:
                    self.failed_mallocs += 1
                ptr = cp.cuda.get_current_stream().ptr
                k = self.stream_of.get(ptr)
                if k is None:
                    k = self.stream_of[ptr] = len(self.stream_of)
                self.streams.append(k)
            self.peak = max(self.peak, self._total(0))
            self.lines += 1

        def free_postprocess(self, **kw):
            self.frees += 1
            self._total(0)
            self.lines += 1

    watch = Watch()
    path = os.path.join(outdir, name)
    slots = {}
    ooms, oom_ops, skipped, mismatches, fab = [], [], [], [], []
    t0 = time.time()
    with open(path + ".jsonl", "w") as log:
        with memory_hooks.DebugPrintHook(file=log, flush=False), watch:
            cp.random.seed(prog.get("seed", 0) % (1 << 32))
            watch.stream_of[cp.cuda.get_current_stream().ptr] = 0
            streams = [cp.cuda.Stream(non_blocking=s.get("non_blocking", False)) for s in prog.get("streams", [])]
            for k, s in enumerate(streams):
                watch.stream_of.setdefault(s.ptr, k + 1)
            for i, op in enumerate(prog["ops"]):
                kind = op["op"]
                args = op.get("args", [])
                if any(s not in slots for s in args):
                    skipped.append(i)
                    continue
                if kind == "free":
                    for s in args:
                        del slots[s]
                    continue
                if kind == "sync":
                    if op["stream"] > 0:
                        streams[op["stream"] - 1].synchronize()
                    else:
                        cp.cuda.Device().synchronize()
                    continue
                if kind == "free_all_blocks":
                    before = pool.total_bytes()
                    watch._total(0)
                    pool.free_all_blocks()
                    watch.last_total = after = pool.total_bytes()
                    fab.append({"op": i, "line": watch.lines, "released_bytes": before - after})
                    continue
                if kind == "fft_cache_clear":
                    cp.fft.config.get_plan_cache().clear()
                    continue
                st = op.get("stream", 0)
                try:
                    if st:
                        with streams[st - 1]:
                            res = run_op(cp, op, [slots[s] for s in args], None)
                    else:
                        res = run_op(cp, op, [slots[s] for s in args], None)
                except MemoryError as e:
                    # The pool's OutOfMemoryError; or a MemoryError where
                    # thrust's allocator got none from the pool (CuPy 14.2
                    # turns its bad_alloc into one).
                    msg = str(e).splitlines()[0] if str(e) else ""
                    ooms.append("op %d (%s): %s: %s" % (i, kind, type(e).__name__, msg))
                    oom_ops.append(i)
                    continue
                if "out" in op:
                    if res is None:
                        raise RuntimeError("op %d (%s) made nothing" % (i, kind))
                    if "shape" in op and (shape_of(res) != op["shape"] or dtype_of(res) != op["dtype"]):
                        mismatches.append({"op": i, "kind": kind, "want": [op["shape"], op["dtype"]],
                                           "got": [shape_of(res), dtype_of(res)]})
                    slots[op["out"]] = res
                res = None
            for s in sorted(slots):
                del slots[s]
            cp.cuda.Device().synchronize()
            for s in streams:
                s.synchronize()
    wall = time.time() - t0
    stats = {
        "workload": "fuzz",
        "label": name,
        "seed": prog.get("seed"),
        "program": os.path.basename(prog_path),
        "generator": "cupygen.py",
        "cupy": cp.__version__,
        "cuda_runtime": cp.cuda.runtime.runtimeGetVersion(),
        "device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
        "limit_bytes": pool.get_limit(),
        "peak_total_bytes": watch.peak,
        "device_allocs": watch.allocs,
        "device_alloc_bytes": watch.alloc_bytes,
        "used_bytes_end": pool.used_bytes(),
        "total_bytes_end": pool.total_bytes(),
        "n_free_blocks_end": pool.n_free_blocks(),
        "ooms_caught": len(ooms),
        "ooms": ooms[:5],
        "oom_ops": oom_ops,
        "failed_mallocs": watch.failed_mallocs,
        "failed_allocs": watch.failed_allocs,
        "mallocs": watch.mallocs,
        "frees": watch.frees,
        "log_lines": watch.lines,
        "free_all_blocks_calls": len(fab),
        "free_all_blocks_at": fab,
        "free_all_blocks_released_bytes": sum(f["released_bytes"] for f in fab),
        "unlogged_device_frees": watch.unlogged,
        "streams": len(streams),
        "stream_mallocs": [watch.streams.count(k) for k in range(len(streams) + 1)],
        "skipped_ops": skipped,
        "shape_mismatches": mismatches[:20],
        "cupy_env": {k: v for k, v in os.environ.items() if k.startswith("CUPY_")},
        "wall_s": round(wall, 3),
    }
    with open(path + ".stats.json", "w") as f:
        json.dump(stats, f, indent=1)
    with open(path + ".streams", "w") as f:
        f.write("".join("%d\n" % k for k in watch.streams))
    if mismatches:
        print("warning: %d ops made another shape or dtype than the generator expected; first: %s"
              % (len(mismatches), mismatches[0]), flush=True)
    if watch.failed_mallocs != len(ooms):
        print("warning: %d failed mallocs in the log, %d OutOfMemoryErrors caught" % (watch.failed_mallocs, len(ooms)),
              flush=True)
    print(name, json.dumps({k: stats[k] for k in ("peak_total_bytes", "device_allocs", "mallocs", "ooms_caught",
                                                   "free_all_blocks_calls", "used_bytes_end", "total_bytes_end",
                                                   "wall_s")}), flush=True)


# ---------------------------------------------------------------------------
# Driver


def child_env():
    env = dict(os.environ)
    # The program's limit is the only one; one default stream per process.
    for k in ("CUPY_GPU_MEMORY_LIMIT", "CUPY_CUDA_PER_THREAD_DEFAULT_STREAM"):
        env.pop(k, None)
    return env


def main(argv=None):
    p = argparse.ArgumentParser(description="Generate, run and record a random CuPy program (see the docstring).")
    p.add_argument("--seed", type=int)
    p.add_argument("--out", required=True)
    p.add_argument("--program")
    p.add_argument("--name")
    p.add_argument("--no-run", "--generate-only", action="store_true", help="write DIR/NAME.prog.json only")
    p.add_argument("--timeout", type=float, default=900)
    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] == "--child":
        child(*argv[1:4])
        return 0
    args = p.parse_args(argv)
    if args.program:
        try:
            with open(args.program) as f:
                prog = json.load(f)
        except (OSError, ValueError) as e:
            print("cupygen: %s: %s" % (args.program, e), file=sys.stderr)
            return 2
        base = os.path.basename(args.program)
        for ext in (".prog.json", ".json"):
            if base.endswith(ext):
                base = base[:-len(ext)]
                break
        name = args.name or prog.get("name") or base
        if args.seed is not None and prog.get("seed") is None:
            prog["seed"] = args.seed
    else:
        if args.seed is None:
            p.error("--seed or --program is required")
        prog = generate(args.seed)
        name = args.name or "cupy_%d" % args.seed
    errs = check_program(prog)
    if errs:
        print("cupygen: bad program: " + "; ".join(errs[:10]), file=sys.stderr)
        return 2
    prog["name"] = name
    prog["trace"] = name + ".jsonl"
    os.makedirs(args.out, exist_ok=True)
    prog_path = os.path.join(args.out, name + ".prog.json")
    dump_program(prog, prog_path)
    if args.no_run:
        print(prog_path)
        return 0
    path = os.path.join(args.out, name)
    for ext in (".jsonl", ".stats.json", ".streams"):
        if os.path.exists(path + ext):
            os.remove(path + ext)
    t0 = time.time()
    with open(path + ".log", "w") as log:
        try:
            r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", prog_path, args.out, name],
                               env=child_env(), stdout=log, stderr=subprocess.STDOUT, timeout=args.timeout)
            rc = r.returncode
        except subprocess.TimeoutExpired:
            rc = None
    with open(path + ".log") as f:
        out = f.read()
    if rc != 0:
        why = "timed out after %gs" % args.timeout if rc is None else "exit status %d" % rc
        print("cupygen: %s: the program did not run (%s); %s.log ends:\n%s" % (name, why, path, out[-3000:]),
              file=sys.stderr)
        return 2 if rc == 2 else 1
    for ext in (".jsonl", ".stats.json"):
        if not os.path.exists(path + ext):
            print("cupygen: %s: no %s%s written" % (name, path, ext), file=sys.stderr)
            return 1
    sys.stdout.write(out)
    print("%s: %d ops ran in %.1fs; give `replay fidelity` %s" % (name, len(prog["ops"]), time.time() - t0,
                                                                 os.path.join(args.out, prog["trace"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())

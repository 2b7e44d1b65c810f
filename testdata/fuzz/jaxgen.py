#!/usr/bin/env python3
"""Seeded random JAX programs, run and recorded as testdata/jax/record.py
--xspace records, for differential testing of the bfc policy against XLA's
BFC allocator.

    python3 jaxgen.py --seed S --out DIR [--program FILE.json] [--name NAME]
                      [--no-run] [--timeout SECONDS]

Without --program it draws program S from random.Random(S) (the same
program for the same S, on any machine) and writes it to DIR/NAME.prog.json
(NAME defaults to jax_S); with --program it runs that program instead (NAME
then defaults to the program's "name", else the file's name less
.prog.json) and writes it again as DIR/NAME.prog.json. --no-run (or
--generate-only) stops there. Otherwise it runs the program in a
fresh process, with the allocator environment the program names set before
jax is imported:

  XLA_PYTHON_CLIENT_MEM_FRACTION  the program's mem_fraction (0.02 to 0.04,
                   drawn: several programs share one GPU);
  XLA_PYTHON_CLIENT_PREALLOCATE   unset (BFC preallocates the whole fraction,
                   JAX's default) for mode "prealloc", "false" (BFC grows its
                   regions on demand) for mode "growth";
  XLA_PYTHON_CLIENT_ALLOCATOR, XLA_CLIENT_MEM_FRACTION, TF_GPU_ALLOCATOR
                   removed (BFC, one fraction);

under jax.profiler.trace as record.py's child does (python_tracer_level 0,
enable_hlo_proto False), and writes beside the program

  NAME.xplane.pb.gz  the profiler's XSpace (plugins/profile/RUN/HOST.xplane.pb,
                   gzip-compressed): BFC's every malloc and free with its own
                   figures; the program's "trace": what `replay fidelity` is
                   given;
  NAME.json        as record.py writes it: jax.devices()[0].memory_stats() at
                   the end ("stats": bytes_limit, peak_bytes_in_use,
                   peak_pool_bytes, num_allocs, ... which fidelity reads,
                   taking the memory limit and the preallocation from them),
                   the allocator environment (allocator, preallocate,
                   mem_fraction), the versions, and the program's own
                   counts (compilations, oom_errors_caught, skipped_ops);
  NAME.log         the child's output.

It exits 0 when the program ran (RESOURCE_EXHAUSTED errors it caught are
part of it), 1 with a message when it did not, 2 with a message for a bad
program or arguments, or where there is no JAX or no GPU (not the program's
failure).

A program is JSON: a header and "ops", a list of operations on slots
(integer ids, each made by one op, never reused):

  {"format": "allocsim-fuzz/jax/1", "kind": "jax", "seed": S, "name": ...,
   "trace": "NAME.xplane.pb.gz", "mode": "prealloc"|"growth",
   "preallocate": "true"|"false", "mem_fraction": "0.031",
   "budget_bytes": B, "templates": {"t0": TEMPLATE, ...}, "ops": [...]}

Every op has "op"; one that makes an array has "out" (its slot), with the
"shape" and "dtype" the generator expects; one that reads arrays has "args"
(their slots). Dropping an op that has "out" X means dropping every op whose
"args" hold X (drop_ops does it; op_refs gives an op's (defs, uses) for
run.py's shrinker); the runner also skips, and counts in skipped_ops, an op
whose args were never made.

  put    {out, shape, dtype, seed}  jax.device_put of a host array (numpy's
         standard normals, float32 or bfloat16)
  rand   {out, shape, dtype, seed}  jax.random.normal(PRNGKey(seed), shape)
  full   {out, shape, dtype, value}  jnp.full
  call   {out, template, args, donate}  the template's function, jitted once
         per template (and donation), called on the args: one compilation per
         template and shapes; donate (one arg) gives the arg's buffer to XLA,
         and the arg's slot ends there
  big    {out, nbytes, how: zeros|put}  a large uint8 array (odd sizes)
  drop   {args [x], how: del|delete}  del, or x.delete()
  block  {args}  jax.block_until_ready on them (all live slots if empty)
  host   {args [x]}  numpy.asarray(x)

A TEMPLATE is {"arity": 1|2, "combine": null|"add"|"mul"|"matmul"|
"matmul_t", "steps": [STEP, ...]}: the function combines its two args (x + y,
x * y, x @ y, x @ y.T), then applies each step to the value in turn. Steps
({"s": NAME, params}): tanh, sin, relu, square, gauss (exp(-v*v)), affine
(v*a+b), gram (v @ v.T), gram_t (v.T @ v), transpose, reduce (fn sum|mean|max,
axis, keepdims), softmax (last axis), concat (v with itself on axis), slice
(v[:k]), flatten, split_last (..., n) -> (..., n/k, k), merge_first, swap_reshape
((m, n) -> (n, m) by reshape), sort and cumsum (last axis), outer (1-D v ->
v[:, None] * v[None, :]). The generator calls each template on several shapes
(each a new compilation), and infer() says which shapes a template takes.

The slots alive at the end are blocked on and released in slot order before
the trace stops.
"""
import argparse
import glob
import gzip
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

KIND = "jax"
FORMAT = "allocsim-fuzz/jax/1"
KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
TOTAL_EST = 150 * 10 ** 9  # an H200's memory as XLA counts it, about
ITEMSIZE = {"float32": 4, "bfloat16": 2, "uint8": 1}
MAX_ELEMS = 8 << 20  # the most elements of any value a template makes
OPS = ("put", "rand", "full", "call", "big", "drop", "block", "host")
UNARY = ("tanh", "sin", "relu", "square", "gauss", "affine")
COMBINE = ("add", "mul", "matmul", "matmul_t")


def log_uniform(r, lo, hi):
    return int(math.exp(r.uniform(math.log(lo), math.log(hi))))


def prod(shape):
    p = 1
    for d in shape:
        p *= d
    return p


def nbytes_of(shape, dtype):
    return prod(shape) * ITEMSIZE[dtype]


def promote(a, b):
    return "float32" if "float32" in (a, b) else a


# ---------------------------------------------------------------------------
# Templates: shape inference (here) and the function (in the child)


def step_shape(st, shape):
    """The shape step st makes of a value of shape, or None if it takes no
    value of that shape."""
    s = st["s"]
    nd = len(shape)
    if s in UNARY:
        return list(shape)
    if s == "gram":
        return [shape[0], shape[0]] if nd == 2 else None
    if s == "gram_t":
        return [shape[1], shape[1]] if nd == 2 else None
    if s == "transpose":
        return list(shape[::-1]) if nd >= 2 else None
    if s == "reduce":
        if nd < 1:
            return None
        ax = st["axis"]
        if ax is None:
            return [1] * nd if st["keepdims"] else []
        if ax >= nd:
            return None
        if st["keepdims"]:
            return [1 if k == ax else d for k, d in enumerate(shape)]
        return [d for k, d in enumerate(shape) if k != ax]
    if s in ("softmax", "sort", "cumsum"):
        return list(shape) if nd >= 1 else None
    if s == "concat":
        ax = st["axis"]
        if ax >= nd:
            return None
        return [2 * d if k == ax else d for k, d in enumerate(shape)]
    if s == "slice":
        if nd < 1:
            return None
        return [min(st["k"], shape[0])] + list(shape[1:])
    if s == "flatten":
        return [prod(shape)] if nd >= 1 else None
    if s == "split_last":
        k = st["k"]
        if nd < 1 or shape[-1] % k:
            return None
        return list(shape[:-1]) + [shape[-1] // k, k]
    if s == "merge_first":
        return [shape[0] * shape[1]] + list(shape[2:]) if nd >= 2 else None
    if s == "swap_reshape":
        return [shape[1], shape[0]] if nd == 2 else None
    if s == "outer":
        return [shape[0], shape[0]] if nd == 1 else None
    raise ValueError("unknown step %r" % s)


def combine_shape(c, xs, ys):
    if c in ("add", "mul"):
        return list(xs) if list(xs) == list(ys) else None
    if len(xs) != 2 or len(ys) != 2:
        return None
    if c == "matmul":
        return [xs[0], ys[1]] if xs[1] == ys[0] else None
    if c == "matmul_t":
        return [xs[0], ys[0]] if xs[1] == ys[1] else None
    raise ValueError("unknown combine %r" % c)


def infer(t, shapes, dtypes):
    """(shape, dtype, bytes of the values made on the way) of template t on
    args of shapes and dtypes, or None if it takes no such args (or makes a
    value over MAX_ELEMS)."""
    if len(shapes) != t["arity"]:
        return None
    dt = dtypes[0]
    cur = list(shapes[0])
    made = 0
    if t["arity"] == 2:
        cur = combine_shape(t["combine"], shapes[0], shapes[1])
        dt = promote(dtypes[0], dtypes[1])
        if cur is None or prod(cur) > MAX_ELEMS:
            return None
        made += nbytes_of(cur, dt)
    for st in t["steps"]:
        cur = step_shape(st, cur)
        if cur is None or prod(cur) > MAX_ELEMS:
            return None
        made += nbytes_of(cur, dt)
    return cur, dt, made


def apply_step(jnp, st, v):
    s = st["s"]
    if s == "tanh":
        return jnp.tanh(v)
    if s == "sin":
        return jnp.sin(v)
    if s == "relu":
        return jnp.maximum(v, 0)
    if s == "square":
        return v * v
    if s == "gauss":
        return jnp.exp(-(v * v))
    if s == "affine":
        return v * st["a"] + st["b"]
    if s == "gram":
        return v @ v.T
    if s == "gram_t":
        return v.T @ v
    if s == "transpose":
        return jnp.transpose(v)
    if s == "reduce":
        return getattr(jnp, st["fn"])(v, axis=st["axis"], keepdims=st["keepdims"])
    if s == "softmax":
        e = jnp.exp(v - jnp.max(v, axis=-1, keepdims=True))
        return e / jnp.sum(e, axis=-1, keepdims=True)
    if s == "concat":
        return jnp.concatenate([v, v], axis=st["axis"])
    if s == "slice":
        return v[:st["k"]]
    if s == "flatten":
        return jnp.reshape(v, (-1,))
    if s == "split_last":
        k = st["k"]
        return jnp.reshape(v, tuple(v.shape[:-1]) + (v.shape[-1] // k, k))
    if s == "merge_first":
        return jnp.reshape(v, (v.shape[0] * v.shape[1],) + tuple(v.shape[2:]))
    if s == "swap_reshape":
        return jnp.reshape(v, (v.shape[1], v.shape[0]))
    if s == "sort":
        return jnp.sort(v, axis=-1)
    if s == "cumsum":
        return jnp.cumsum(v, axis=-1)
    if s == "outer":
        return v[:, None] * v[None, :]
    raise ValueError("unknown step %r" % s)


def make_fn(jnp, t):
    """The Python function of template t (to be jitted)."""
    steps, comb = t["steps"], t.get("combine")

    def f(*xs):
        v = xs[0]
        if comb == "add":
            v = v + xs[1]
        elif comb == "mul":
            v = v * xs[1]
        elif comb == "matmul":
            v = v @ xs[1]
        elif comb == "matmul_t":
            v = v @ xs[1].T
        for st in steps:
            v = apply_step(jnp, st, v)
        return v

    return f


# ---------------------------------------------------------------------------
# Generation


class Gen:
    def __init__(self, seed):
        self.seed = seed
        r = self.rng = random.Random(seed)
        self.mode = r.choice(["prealloc", "growth"])
        self.frac = round(r.uniform(0.02, 0.04), 3)
        self.limit_est = int(self.frac * TOTAL_EST)
        self.budget = int(self.limit_est * 0.35)
        self.n_ops = r.randint(10, 60)
        self.big_left = r.choice([0, 1, 2, 3, 4])
        self.templates = {}
        self.ops = []
        self.slots = {}  # slot -> {"shape", "dtype", "bytes", "big"}
        self.next_slot = 0

    # -- bookkeeping

    def live_bytes(self):
        return sum(i["bytes"] for i in self.slots.values())

    def emit(self, op):
        self.ops.append(op)
        return op

    def add(self, op, shape, dtype, big=False):
        s = self.next_slot
        self.next_slot += 1
        op["out"] = s
        op["shape"], op["dtype"] = list(shape), dtype
        self.emit(op)
        self.slots[s] = {"shape": list(shape), "dtype": dtype, "bytes": (nbytes_of(shape, dtype) + 255) // 256 * 256,
                         "big": big}
        return s

    def drop(self, s):
        self.emit({"op": "drop", "args": [s], "how": self.rng.choice(["del", "delete"])})
        del self.slots[s]

    def make_room(self, need, keep=()):
        r = self.rng
        while self.live_bytes() + need > self.budget:
            cand = [s for s in self.slots if s not in keep]
            if not cand:
                return False
            bigs = [s for s in cand if self.slots[s]["big"]]
            self.drop(r.choice(bigs) if bigs and r.random() < 0.7 else r.choice(cand))
        return True

    # -- shapes and inputs

    def draw_shape(self):
        r = self.rng
        if r.random() < 0.2:
            return [log_uniform(r, 1, 1 << 22)]
        while True:
            m, n = log_uniform(r, 1, 4096), log_uniform(r, 1, 4096)
            if m * n <= 1 << 22:
                return [m, n]

    def draw_dtype(self):
        return "bfloat16" if self.rng.random() < 0.2 else "float32"

    def new_input(self, shape, dtype, keep=()):
        r = self.rng
        if not self.make_room(nbytes_of(shape, dtype), keep=keep):
            return None
        how = r.choice(["put", "put", "rand", "full"])
        op = {"op": how}
        if how == "full":
            op["value"] = round(r.uniform(-2, 2), 3)
        else:
            op["seed"] = r.randrange(1 << 31)
        return self.add(op, shape, dtype)

    # -- templates

    def random_step(self, shape):
        """A random step that takes a value of shape (None if none is
        drawn)."""
        r = self.rng
        nd = len(shape)
        names = list(UNARY) * 2 + ["reduce", "softmax", "concat", "slice", "sort", "cumsum", "flatten"]
        if nd == 2:
            names += ["gram", "gram_t", "transpose", "merge_first", "swap_reshape", "split_last"]
        if nd == 1:
            names += ["outer", "split_last"]
        if nd >= 3:
            names += ["transpose", "merge_first"]
        s = r.choice(names)
        st = {"s": s}
        if s == "affine":
            st["a"], st["b"] = round(r.uniform(-2, 2), 3), round(r.uniform(-1, 1), 3)
        elif s == "reduce":
            st["fn"] = r.choice(["sum", "mean", "max"])
            st["axis"] = r.choice([None] + list(range(nd))) if nd else None
            st["keepdims"] = r.random() < 0.4
        elif s == "concat":
            st["axis"] = r.randrange(max(nd, 1))
        elif s == "slice":
            st["k"] = r.randint(1, max(1, shape[0] if nd else 1))
        elif s == "split_last":
            divs = [k for k in (2, 3, 4, 8, 16, 64) if nd and shape[-1] % k == 0]
            if not divs:
                return None
            st["k"] = r.choice(divs)
        return st

    def new_template(self):
        r = self.rng
        arity = 2 if r.random() < 0.35 else 1
        xs = self.draw_shape()
        t = {"arity": arity, "combine": None, "steps": []}
        shapes = [xs]
        if arity == 2:
            c = r.choice(COMBINE)
            if len(xs) == 1 and c.startswith("matmul"):
                c = r.choice(["add", "mul"])
            t["combine"] = c
            if c in ("add", "mul"):
                ys = list(xs)
            elif c == "matmul":
                ys = [xs[-1], log_uniform(r, 1, 2048)]
            else:
                ys = [log_uniform(r, 1, 2048), xs[-1]]
            shapes.append(ys)
        res = infer(t, shapes, ["float32"] * arity)
        if res is None:
            return None
        cur = res[0]
        for _ in range(r.randint(1, 6)):
            st = self.random_step(cur)
            if st is None:
                continue
            t["steps"].append(st)
            res = infer(t, shapes, ["float32"] * arity)
            if res is None:
                t["steps"].pop()
                continue
            cur = res[0]
            if not cur:
                break  # a scalar: nothing more to do
        tid = "t%d" % len(self.templates)
        self.templates[tid] = t
        return tid, shapes

    def args_for(self, t, fresh_shapes):
        """Slots to call t on: live ones it takes, or new inputs (of
        fresh_shapes, the template's first shapes, or of new shapes drawn
        near them)."""
        r = self.rng
        if t["arity"] == 1:
            live = [s for s, i in self.slots.items()
                    if not i["big"] and infer(t, [i["shape"]], [i["dtype"]]) is not None]
            if live and r.random() < 0.4:
                return [r.choice(live)]
            for shape in self.shape_candidates(fresh_shapes[0]):
                if infer(t, [shape], ["float32"]) is not None:
                    s = self.new_input(shape, self.draw_dtype())
                    return None if s is None else [s]
            return None
        # arity 2: x, then a y that fits it
        xs_live = [s for s, i in self.slots.items() if not i["big"] and len(i["shape"]) == len(fresh_shapes[0])]
        cands = []
        if xs_live and r.random() < 0.4:
            cands.append(self.slots[r.choice(xs_live)]["shape"])
        cands += self.shape_candidates(fresh_shapes[0])
        for xshape in cands:
            yshape = self.y_shape(t["combine"], xshape, fresh_shapes[1])
            if infer(t, [xshape, yshape], ["float32", "float32"]) is None:
                continue
            x = next((s for s in xs_live if self.slots[s]["shape"] == xshape), None)
            if x is None:
                x = self.new_input(xshape, self.draw_dtype())
                if x is None:
                    return None
            ys = [s for s, i in self.slots.items() if not i["big"] and i["shape"] == yshape and s != x]
            y = r.choice(ys) if ys and r.random() < 0.7 else self.new_input(yshape, self.draw_dtype(), keep=(x,))
            if y is None or x not in self.slots:
                return None
            return [x, y]
        return None

    def y_shape(self, c, xs, ys0):
        r = self.rng
        if c in ("add", "mul"):
            return list(xs)
        p = ys0[1] if c == "matmul" else ys0[0]
        if r.random() < 0.5:
            p = log_uniform(r, 1, 2048)
        return [xs[-1], p] if c == "matmul" else [p, xs[-1]]

    def shape_candidates(self, base):
        """The template's first shape, shapes near it, and new ones."""
        r = self.rng
        out = [list(base)]
        for _ in range(6):
            out.append([max(1, int(d * r.choice([0.25, 0.5, 0.75, 1, 1.5, 2, 3]))) for d in base])
        r.shuffle(out)
        out += [self.draw_shape() for _ in range(4)]
        return out

    # -- ops

    def op_input(self):
        return self.new_input(self.draw_shape(), self.draw_dtype())

    def op_call(self):
        r = self.rng
        if not self.templates or r.random() < 0.2:
            made = self.new_template()
            if made is None:
                return None
            tid, shapes = made
        else:
            tid = r.choice(list(self.templates))
            shapes = self.first_shapes[tid]
        self.first_shapes.setdefault(tid, shapes)
        t = self.templates[tid]
        args = self.args_for(t, shapes)
        if args is None:
            return None
        res = infer(t, [self.slots[a]["shape"] for a in args], [self.slots[a]["dtype"] for a in args])
        if res is None:
            return None
        shape, dt, made = res
        if not self.make_room(made + nbytes_of(shape, dt), keep=args):
            return None
        donate = t["arity"] == 1 and r.random() < 0.2
        s = self.add({"op": "call", "template": tid, "args": args, "donate": donate}, shape, dt)
        if donate:
            del self.slots[args[0]]  # its buffer is XLA's now
        return s

    def op_big(self):
        r = self.rng
        if self.big_left <= 0:
            return None
        n = log_uniform(r, 16 * MiB, self.limit_est // 4)
        if r.random() < 0.2:
            n = n // MiB * MiB
        if not self.make_room(n):
            return None
        self.big_left -= 1
        return self.add({"op": "big", "nbytes": n, "how": r.choice(["zeros", "zeros", "put"])}, [n], "uint8",
                        big=True)

    def op_drop(self):
        r = self.rng
        if not self.slots:
            return None
        bigs = [s for s in self.slots if self.slots[s]["big"]]
        s = r.choice(bigs) if bigs and r.random() < 0.5 else r.choice(list(self.slots))
        self.drop(s)
        return s

    def op_block(self):
        r = self.rng
        live = list(self.slots)
        args = [] if not live or r.random() < 0.5 else r.sample(live, r.randint(1, min(3, len(live))))
        return self.emit({"op": "block", "args": args})

    def op_host(self):
        small = [s for s, i in self.slots.items() if not i["big"] and i["bytes"] <= 64 * MiB]
        if not small:
            return None
        return self.emit({"op": "host", "args": [self.rng.choice(small)]})

    def generate(self):
        r = self.rng
        self.first_shapes = {}
        weights = {"input": 16, "call": 42, "drop": 18, "big": 7, "block": 7, "host": 3}
        names = list(weights)
        w = [weights[k] for k in names]
        final_drops = r.random() < 0.5
        tries = 0
        while len(self.ops) + (len(self.slots) if final_drops else 0) < self.n_ops and tries < 2000:
            tries += 1
            name = r.choices(names, w)[0]
            if name == "drop" and len(self.slots) < 2 and r.random() < 0.8:
                continue
            getattr(self, "op_" + name)()
        if final_drops:
            rest = list(self.slots)
            r.shuffle(rest)
            for s in rest:
                self.drop(s)
        return {
            "format": FORMAT,
            "kind": KIND,
            "generator": "jaxgen.py",
            "seed": self.seed,
            "mode": self.mode,
            "preallocate": "true" if self.mode == "prealloc" else "false",
            "mem_fraction": "%.3f" % self.frac,
            "budget_bytes": self.budget,
            "templates": self.templates,
            "ops": self.ops,
        }


def generate(seed):
    """Program seed: a JSON-serialisable dict (without name and trace)."""
    return Gen(seed).generate()


def op_refs(op):
    """(defs, uses) of op: the slot it makes and the slots it reads (a
    donated arg is a use: its slot ends there), as run.py's shrinker
    asks."""
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
    if prog.get("preallocate") not in ("true", "false"):
        errs.append("preallocate is %r" % prog.get("preallocate"))
    try:
        if not 0 < float(prog.get("mem_fraction")) <= 1:
            errs.append("mem_fraction out of range")
    except (TypeError, ValueError):
        errs.append("bad mem_fraction %r" % prog.get("mem_fraction"))
    templates = prog.get("templates", {})
    for tid, t in templates.items():
        try:
            if t["arity"] not in (1, 2) or (t["arity"] == 2) != (t.get("combine") in COMBINE):
                errs.append("template %s: bad arity or combine" % tid)
            for st in t["steps"]:
                step_shape(st, [2, 2, 2][:2])
        except (KeyError, TypeError, ValueError) as e:
            errs.append("template %s: %s" % (tid, e))
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
        if op["op"] == "call" and op.get("template") not in templates:
            errs.append("op %d: no template %r" % (i, op.get("template")))
    return errs


def dump_program(prog, path):
    """Writes prog with one op a line, atomically."""
    head = {k: v for k, v in prog.items() if k not in ("ops", "templates")}
    text = json.dumps(head, indent=1)
    text = text[:text.rindex("}")].rstrip() + ',\n "templates": {\n'
    text += ",\n".join("  %s: %s" % (json.dumps(k), json.dumps(v)) for k, v in prog.get("templates", {}).items())
    text += '\n },\n "ops": [\n'
    text += ",\n".join("  " + json.dumps(op) for op in prog["ops"]) + "\n ]\n}\n"
    tmp = path + ".tmp%d" % os.getpid()
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


# ---------------------------------------------------------------------------
# Running (in the child: needs JAX and a GPU)


def is_oom(e):
    s = str(e)
    return "RESOURCE_EXHAUSTED" in s or "Out of memory" in s or "out of memory" in s


def no_device(msg):
    """Exits 2: no framework or no GPU here (not the program's failure)."""
    print("jaxgen: %s" % msg, file=sys.stderr)
    sys.exit(2)


def child(prog_path, outdir, name):
    with open(prog_path) as f:
        prog = json.load(f)
    # The allocator environment, before jax is imported (the parent set it
    # too).
    for k in ("XLA_PYTHON_CLIENT_ALLOCATOR", "XLA_CLIENT_MEM_FRACTION", "TF_GPU_ALLOCATOR",
              "XLA_PYTHON_CLIENT_PREALLOCATE"):
        os.environ.pop(k, None)
    os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] = prog["mem_fraction"]
    if prog["preallocate"] == "false":
        os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    try:
        import numpy as np
        import jax
        import jax.numpy as jnp
    except ImportError as e:
        no_device("cannot import jax: %s" % e)
    tmp = tempfile.mkdtemp(prefix=".jaxgen-%s-" % name, dir=outdir)
    # As record.py: the host tracer at its default level holds the
    # allocator's events; the Python tracer and the HLO protos only make the
    # file large.
    try:
        opts = jax.profiler.ProfileOptions()
        opts.python_tracer_level = 0
        opts.enable_hlo_proto = False
        jax.profiler.start_trace(tmp, profiler_options=opts)
    except (TypeError, AttributeError):  # a JAX without profiler_options
        jax.profiler.start_trace(tmp)
    dev = jax.devices()[0]
    if dev.platform not in ("gpu", "cuda"):
        jax.profiler.stop_trace()
        shutil.rmtree(tmp, ignore_errors=True)
        no_device("jax's first device is %s, not a GPU" % dev.platform)
    path = os.path.join(outdir, name)
    dtypes = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "uint8": jnp.uint8}
    fns = {}  # (template, donate) -> jitted function
    slots = {}
    ooms, skipped, mismatches = [], [], []
    shapes_seen = {}  # template -> the arg shapes it was called on
    t0 = time.time()
    for i, op in enumerate(prog["ops"]):
        kind = op["op"]
        args = op.get("args", [])
        if any(s not in slots for s in args):
            skipped.append(i)
            continue
        try:
            res = None
            if kind == "put":
                h = np.random.default_rng(op["seed"]).standard_normal(tuple(op["shape"]), dtype=np.float32)
                if op["dtype"] != "float32":
                    h = h.astype(dtypes[op["dtype"]])
                res = jax.device_put(h)
                del h
            elif kind == "rand":
                res = jax.random.normal(jax.random.PRNGKey(op["seed"]), tuple(op["shape"]), dtype=dtypes[op["dtype"]])
            elif kind == "full":
                res = jnp.full(tuple(op["shape"]), op["value"], dtype=dtypes[op["dtype"]])
            elif kind == "call":
                key = (op["template"], bool(op.get("donate")))
                if key not in fns:
                    f = make_fn(jnp, prog["templates"][op["template"]])
                    fns[key] = jax.jit(f, donate_argnums=(0,) if key[1] else ())
                xs = [slots[s] for s in args]
                shapes_seen.setdefault(op["template"], set()).add(
                    tuple((tuple(x.shape), str(x.dtype)) for x in xs) + (key[1],))
                if key[1]:
                    for s in args:
                        del slots[s]  # donated: the slot ends here
                res = fns[key](*xs)
                del xs
            elif kind == "big":
                n = op["nbytes"]
                if op["how"] == "put":
                    h = np.zeros(n, dtype=np.uint8)
                    res = jax.device_put(h)
                    del h
                else:
                    res = jnp.zeros((n,), dtype=jnp.uint8)
            elif kind == "drop":
                for s in args:
                    x = slots.pop(s)
                    if op.get("how") == "delete":
                        x.delete()
                    del x
            elif kind == "block":
                jax.block_until_ready([slots[s] for s in args] if args else list(slots.values()))
            elif kind == "host":
                np.asarray(slots[args[0]])
            else:
                raise ValueError("unknown op %r" % kind)
        except Exception as e:  # noqa: BLE001: XLA's errors have no one class across versions
            if not is_oom(e):
                raise
            ooms.append("op %d (%s): %s" % (i, kind, str(e).splitlines()[0][:300]))
            continue
        if "out" in op:
            if res is None:
                raise RuntimeError("op %d (%s) made nothing" % (i, kind))
            got = [list(res.shape), str(res.dtype)]
            if got != [op.get("shape"), op.get("dtype")]:
                mismatches.append({"op": i, "kind": kind, "want": [op.get("shape"), op.get("dtype")], "got": got})
            slots[op["out"]] = res
        res = None
    try:
        jax.block_until_ready(list(slots.values()))
    except Exception as e:  # noqa: BLE001
        if not is_oom(e):
            raise
        ooms.append("end: %s" % str(e).splitlines()[0][:300])
    for s in sorted(slots):
        del slots[s]
    wall = time.time() - t0
    jax.profiler.stop_trace()
    pbs = sorted(glob.glob(os.path.join(tmp, "plugins", "profile", "*", "*.xplane.pb")))
    if not pbs:
        sys.exit("jaxgen: the profiler wrote no .xplane.pb under %s" % tmp)
    with open(pbs[0], "rb") as src, open(path + ".xplane.pb.gz.tmp", "wb") as raw:
        with gzip.GzipFile(filename=name + ".xplane.pb", fileobj=raw, mode="wb", mtime=0) as dst:
            shutil.copyfileobj(src, dst)
    os.replace(path + ".xplane.pb.gz.tmp", path + ".xplane.pb.gz")
    shutil.rmtree(tmp, ignore_errors=True)
    rec = {
        "workload": "fuzz",
        "label": name,
        "seed": prog.get("seed"),
        "program": os.path.basename(prog_path),
        "generator": "jaxgen.py",
        "mode": prog.get("mode"),
        "allocator": os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "default"),
        "preallocate": os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "true"),
        "mem_fraction": os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", ""),
        "jax": jax.__version__,
        "jaxlib": getattr(__import__("jaxlib"), "__version__", ""),
        "device": dev.device_kind,
        "stats": dev.memory_stats(),
        "compilations": sum(len(v) for v in shapes_seen.values()),
        "oom_errors_caught": len(ooms),
        "oom_errors": ooms[:5],
        "skipped_ops": skipped,
        "shape_mismatches": mismatches[:20],
        "profiles": len(pbs),
        "wall_s": round(wall, 3),
    }
    with open(path + ".json", "w") as f:
        json.dump(rec, f, indent=1)
    if mismatches:
        print("warning: %d ops made another shape or dtype than the generator expected; first: %s"
              % (len(mismatches), mismatches[0]), flush=True)
    print(name, json.dumps(rec["stats"]), json.dumps({k: rec[k] for k in ("compilations", "oom_errors_caught",
                                                                            "wall_s")}), flush=True)


# ---------------------------------------------------------------------------
# Driver


def child_env(prog):
    env = dict(os.environ)
    for k in ("XLA_PYTHON_CLIENT_ALLOCATOR", "XLA_CLIENT_MEM_FRACTION", "TF_GPU_ALLOCATOR",
              "XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION"):
        env.pop(k, None)
    env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = prog["mem_fraction"]
    if prog["preallocate"] == "false":
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    return env


def main(argv=None):
    p = argparse.ArgumentParser(description="Generate, run and record a random JAX program (see the docstring).")
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
            print("jaxgen: %s: %s" % (args.program, e), file=sys.stderr)
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
        name = args.name or "jax_%d" % args.seed
    errs = check_program(prog)
    if errs:
        print("jaxgen: bad program: " + "; ".join(errs[:10]), file=sys.stderr)
        return 2
    prog["name"] = name
    prog["trace"] = name + ".xplane.pb.gz"
    os.makedirs(args.out, exist_ok=True)
    prog_path = os.path.join(args.out, name + ".prog.json")
    dump_program(prog, prog_path)
    if args.no_run:
        print(prog_path)
        return 0
    path = os.path.join(args.out, name)
    for ext in (".xplane.pb.gz", ".json"):
        if os.path.exists(path + ext):
            os.remove(path + ext)
    t0 = time.time()
    with open(path + ".log", "w") as log:
        try:
            r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", prog_path, args.out, name],
                               env=child_env(prog), stdout=log, stderr=subprocess.STDOUT, timeout=args.timeout)
            rc = r.returncode
        except subprocess.TimeoutExpired:
            rc = None
    with open(path + ".log") as f:
        out = f.read()
    if rc != 0:
        why = "timed out after %gs" % args.timeout if rc is None else "exit status %d" % rc
        print("jaxgen: %s: the program did not run (%s); %s.log ends:\n%s" % (name, why, path, out[-3000:]),
              file=sys.stderr)
        return 2 if rc == 2 else 1
    for ext in (".xplane.pb.gz", ".json"):
        if not os.path.exists(path + ext):
            print("jaxgen: %s: no %s%s written" % (name, path, ext), file=sys.stderr)
            return 1
    sys.stdout.write("".join(l for l in out.splitlines(True) if l.startswith((name + " ", "warning"))))
    print("%s: %d ops ran in %.1fs; give `replay fidelity` %s" % (name, len(prog["ops"]), time.time() - t0,
                                                                 os.path.join(args.out, prog["trace"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())

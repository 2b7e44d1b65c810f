#!/usr/bin/env python3
"""Run seeded random GPU programs, replay each recording with `replay
fidelity`, and shrink the programs whose replay fails.

    python3 run.py --out DIR --replay PATH/TO/replay [--torch N] [--cupy N]
                   [--jax N] [--jobs J] [--seed-base B] [--shrink-budget S]
                   [--timeout S] [--max-wall S] [--export DIR]

For each kind K with N > 0 (torch, cupy, jax), programs B .. B+N-1 of
K's generator, testdata/fuzz/Kgen.py beside this file (a kind whose
generator is missing is skipped), each run as a fresh process

    python3 Kgen.py --seed S --out DIR/K --name K_S

J at a time over all kinds, killed (with its process group) after
--timeout seconds. A generator writes DIR/K/NAME.prog.json (the program; its
"trace" key names the recording beside it) and the recording with the real
allocator's figures beside it, and exits 0 when the program ran. Then, in
the same worker, `REPLAY fidelity TRACE` (the trace the program names, else
the first of NAME.pickle.gz, NAME.pickle, NAME.jsonl, NAME.xplane.pb.gz,
NAME.xplane.pb, NAME.trace that exists). Each program is then

  identical  fidelity exited 0 and every line it printed says identical
             (or, for a recording without device calls, figures agree)
  warned     fidelity exited 0 but printed anything else (a warning: an
             inferred call, a pool it could not tell), or it exited
             non-zero after a warning that names an event (the recording
             does not show what made the replay part from it there)
  failed     fidelity exited non-zero with no such warning: a divergence
             at an event, figures
             that differ from the real allocator's, events it could not
             replay, a recording it could not read, or a timeout
  crashed    the program itself failed (non-zero exit, timeout, no
             recording): not a fidelity failure (when the first 2J
             programs of a kind all crash, the rest of that kind is
             skipped: no framework or no GPU)

A failed program is then replayed as a user replays it, `REPLAY sim TRACE`
(with --capacity set to the job's cap where its figures give one): it
"says where" when the replay warns, naming the event, that the simulation
parts from the recording or that its peak may be lower by what a release
the log does not show would give back; else it is silently wrong ("silent" in the
table), the figure that matters most.

and a failure's signature is its first divergence with the numbers taken
out ("diverges at event #: real allocator: malloc of # bytes at #; ..."),
the first figure that differs, or the error. The driver prints a line per
program with the elapsed time, then a table per kind (programs, identical,
warned, failed, crashed, and the pass rate: identical and warned over the
programs that ran), the failures grouped by signature, and writes
DIR/summary.json (every program's verdict, the first line of fidelity's
output, its signature) and DIR/K/NAME.gen.log, DIR/K/NAME.fidelity.txt.

The whole run keeps to --max-wall seconds (default 480): no program starts
after 80% of it, a program still running 20 s before its end is killed and
counted as skipped (not crashed), and DIR/summary.json is written every 30 s
while programs run, so that a run cut short still leaves what it found.

Then it shrinks the failed programs within --shrink-budget seconds in all
(and so that the whole run ends by --max-wall seconds): first one program of
each signature (the smallest), then the others while time is left. A
shrink is delta debugging over the program's "ops": chunks of ops dropped
(halves, then quarters, ... then single ops), then the ops of the bodies of
compound ops (an op with a "body" list) the same way, then the keys of its
alloc_conf one by one, each
candidate run on the GPU again (J at a time) and replayed, and kept when it
fails with the same signature. Dropping an op drops every op that depends on
it: where K's generator module defines op_refs(op) -> (defs, uses) (ids an op
makes and needs, without its body), an op whose uses include an id that a
dropped op defines is dropped too; generators must also run any
subsequence of their ops (skipping an op whose inputs are gone). The
smallest failing program goes to DIR/K/shrunk/NAME.* (prog.json, the
recording, stats, fidelity.txt). --export DIR copies at the end what is worth
keeping (see export). Exit status: 0 when every program that ran
replayed identical or warned, 1 when any failed or crashed, 2 on a usage
error.
"""
import argparse
import concurrent.futures as cf
import importlib.util
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

KINDS = ("torch", "cupy", "jax")
TRACE_SUFFIXES = (".pickle.gz", ".pickle", ".jsonl", ".xplane.pb.gz", ".xplane.pb", ".trace")
HERE = os.path.dirname(os.path.abspath(__file__))

_print_lock = threading.Lock()
T0 = time.time()


def log(msg):
    """log prints msg after the time elapsed since the driver started."""
    with _print_lock:
        print("[%7.1fs] %s" % (time.time() - T0, msg), flush=True)


# --- processes -------------------------------------------------------------


def run_child(cmd, log_path, timeout, env=None, deadline=None, stop=None):
    """run_child runs cmd with its output (stdout and stderr) to log_path,
    in a session of its own, and kills that session's processes when it
    runs past timeout seconds or past the absolute time deadline, or when
    the event stop is set. It returns (exit status, seconds, how it ended:
    "" for an exit, "timeout", "deadline" or "stopped")."""
    t = time.time()
    limit = t + timeout
    if deadline is not None:
        limit = min(limit, deadline)
    with open(log_path, "wb") as out:
        try:
            p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                 start_new_session=True, stdin=subprocess.DEVNULL)
        except OSError as e:
            out.write(("run.py: cannot start %s: %s\n" % (cmd[0], e)).encode())
            return 127, 0.0, ""
        why = ""
        while True:
            try:
                rc = p.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                pass
            now = time.time()
            if stop is not None and stop.is_set():
                why = "stopped"
            elif now >= limit:
                why = "timeout" if deadline is None or limit < deadline else "deadline"
            if why:
                _kill(p)
                rc = p.wait()
                break
    if why:
        with open(log_path, "ab") as out:
            out.write(("\nrun.py: killed (%s after %.0f s)\n" % (why, time.time() - t)).encode())
    return rc, time.time() - t, why


def _kill(p):
    """_kill kills the process group of p (the child's own session)."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        try:
            p.kill()
        except ProcessLookupError:
            pass


def tail(path, n=3):
    """tail returns the last n non-empty lines of the file at path."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - 8192))
            lines = [l for l in f.read().decode("utf-8", "replace").splitlines() if l.strip()]
    except OSError:
        return []
    return lines[-n:]


# --- recordings and fidelity -----------------------------------------------


def find_trace(d, name):
    """find_trace returns the recording of program NAME in directory d: the
    file NAME.prog.json names in its "trace" key, else the first of NAME
    with TRACE_SUFFIXES that exists, else None."""
    try:
        with open(os.path.join(d, name + ".prog.json")) as f:
            t = json.load(f).get("trace")
        if isinstance(t, str) and t:
            p = os.path.join(d, os.path.basename(t))
            if os.path.exists(p):
                return p
    except (OSError, ValueError, AttributeError):
        pass
    for suf in TRACE_SUFFIXES:
        p = os.path.join(d, name + suf)
        if os.path.exists(p):
            return p
    return None


_NUM = re.compile(r"0x[0-9a-fA-F]+|\d+")
_FIGURE = re.compile(r"^\S.*?:   (.+?): real allocator")
_OK = re.compile(r"^\S.*?: (identical|figures agree) \(")


def normalize(line, trace_name=""):
    """normalize takes the trace's name and every number out of a line of
    fidelity's output, so that two failures of one kind read the same."""
    if trace_name and line.startswith(trace_name + ":"):
        line = line[len(trace_name) + 1:]
    return _NUM.sub("#", line).strip()


_EVENT = re.compile(r"\b(event|entry) \d+")


def classify(rc, out, err, why="", trace_name=""):
    """classify returns (verdict, first line, signature) of one run of
    replay fidelity: its exit status rc, its stdout and stderr, and why it
    was killed ("" when it exited)."""
    lines = [l for l in (out.splitlines() + err.splitlines()) if l.strip()]
    first = lines[0] if lines else ""
    if why:
        return "failed", first or "fidelity killed (%s)" % why, "fidelity " + why
    if rc == 0:
        if lines and all(_OK.match(l) for l in lines):
            return "identical", first, ""
        warn = next((l for l in lines if not _OK.match(l)), "")
        return "warned", first, "warning: " + normalize(warn, trace_name)
    # A replay that parts from the recording after saying, naming the
    # event, what the recording does not show (a call inferred, a pool it
    # could not tell) is warned, not silently wrong.
    verdict = "failed"
    if any(": warning: " in l and _EVENT.search(l) for l in lines):
        verdict = "warned"
    for l in lines:
        if " diverges at " in l or l.startswith("diverges at "):
            return verdict, first, "diverges: " + normalize(l.split("diverges at ", 1)[1])
    figs = [m.group(1) for m in map(_FIGURE.match, lines) if m]
    if figs:
        return verdict, first, "figures: " + figs[0]
    for l in lines:
        if "could not be replayed as recorded" in l:
            return "failed", first, "anomaly: " + normalize(l, trace_name)
    errs = [l for l in err.splitlines() if l.strip()]
    return "failed", first, "error: " + normalize(errs[0] if errs else first, trace_name)


def fidelity(replay, trace, out_path, timeout, deadline=None, stop=None):
    """fidelity runs `replay fidelity trace`, writes what it printed to
    out_path and returns (verdict, first line, signature, exit status)."""
    errp = out_path + ".stderr"
    t = time.time()
    limit = t + timeout if deadline is None else min(t + timeout, deadline)
    with open(out_path, "wb") as fo, open(errp, "wb") as fe:
        try:
            p = subprocess.Popen([replay, "fidelity", trace], stdout=fo, stderr=fe,
                                 start_new_session=True, stdin=subprocess.DEVNULL)
        except OSError as e:
            return "failed", "cannot run %s: %s" % (replay, e), "error: cannot run replay", 127
        why = ""
        while True:
            try:
                rc = p.wait(timeout=0.1)
                break
            except subprocess.TimeoutExpired:
                pass
            if stop is not None and stop.is_set():
                why = "stopped"
            elif time.time() >= limit:
                why = "timeout"
            if why:
                _kill(p)
                rc = p.wait()
                break
    with open(out_path, "r", errors="replace") as f:
        out = f.read()
    with open(errp, "r", errors="replace") as f:
        err = f.read()
    os.remove(errp)
    if err:
        with open(out_path, "a") as f:
            f.write(err)
    v, first, sig = classify(rc, out, err, why, os.path.basename(trace))
    return v, first, sig, rc


# --- programs --------------------------------------------------------------


class Program:
    """Program is one generated program and what became of it."""

    def __init__(self, kind, seed, outdir):
        self.kind, self.seed = kind, seed
        self.name = "%s_%d" % (kind, seed)
        self.dir = os.path.join(outdir, kind)
        self.verdict = ""
        self.first_line = ""
        self.signature = ""
        self.gen_rc = None
        self.gen_wall = 0.0
        self.gen_why = ""
        self.fid_rc = None
        self.sim_says = None  # a failed program's replay sim warning of its parting, "" if none
        self.trace = None
        self.crash = []
        self.shrunk = None

    def prog(self):
        try:
            with open(os.path.join(self.dir, self.name + ".prog.json")) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def record(self):
        p = self.prog() or {}
        ops = p.get("ops") if isinstance(p, dict) else None
        r = {"kind": self.kind, "seed": self.seed, "name": self.name, "verdict": self.verdict,
             "first_line": self.first_line, "signature": self.signature,
             "gen_rc": self.gen_rc, "gen_wall_s": round(self.gen_wall, 2), "gen_killed": self.gen_why,
             "fidelity_rc": self.fid_rc, "sim_says": self.sim_says,
             "trace": os.path.relpath(self.trace, os.path.dirname(self.dir)) if self.trace else None,
             "ops": len(ops) if isinstance(ops, list) else None,
             "trace_bytes": os.path.getsize(self.trace) if self.trace and os.path.exists(self.trace) else None}
        for k in ("alloc_conf", "cap_bytes", "tiny"):
            if isinstance(p, dict) and k in p:
                r[k] = p[k]
        if self.crash:
            r["crash"] = self.crash
        if self.shrunk is not None:
            r["shrunk"] = self.shrunk
        return r


def child_env(kind):
    """child_env is the environment of a generator of kind."""
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("OMP_NUM_THREADS", "2")
    if kind == "jax" and "XLA_PYTHON_CLIENT_MEM_FRACTION" not in os.environ:
        # several JAX processes share one GPU; jaxgen.py may set its own
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = ".05"
    return env


def run_one(args, prog, gen, stop, deadline):
    """run_one runs program prog's generator and, when it ran, fidelity on
    its recording; it fills in prog's verdict. A program the driver had to
    kill at deadline (the end of its wall time) is skipped, not crashed."""
    os.makedirs(prog.dir, exist_ok=True)
    glog = os.path.join(prog.dir, prog.name + ".gen.log")
    cmd = [sys.executable, gen, "--seed", str(prog.seed), "--out", prog.dir, "--name", prog.name]
    rc, wall, why = run_child(cmd, glog, args.timeout, child_env(prog.kind), deadline=deadline, stop=stop)
    prog.gen_rc, prog.gen_wall, prog.gen_why = rc, wall, why
    if why in ("deadline", "stopped"):
        prog.verdict = "skipped"
        prog.crash = ["killed at the end of the driver's time (%s)" % why]
        return prog
    if rc != 0 or why:
        prog.verdict = "crashed"
        prog.crash = tail(glog, 3)
        return prog
    prog.trace = find_trace(prog.dir, prog.name)
    if prog.trace is None:
        prog.verdict = "crashed"
        prog.crash = ["no recording written"] + tail(glog, 2)
        return prog
    v, first, sig, frc = fidelity(args.replay, prog.trace, os.path.join(prog.dir, prog.name + ".fidelity.txt"),
                                  args.fidelity_timeout, deadline=deadline, stop=stop)
    prog.verdict, prog.first_line, prog.signature, prog.fid_rc = v, first, sig, frc
    if v == "failed":
        prog.sim_says = sim_says(args.replay, prog.trace, args.fidelity_timeout)
    return prog


def job_cap(trace):
    """job_cap returns the memory cap in bytes the figures beside trace
    give (PyTorch's mem_cap_bytes, CuPy's limit_bytes), 0 if none."""
    for ext in (".pickle.gz", ".pickle", ".jsonl"):
        if trace.endswith(ext):
            try:
                with open(trace[:-len(ext)] + ".stats.json") as f:
                    st = json.load(f)
            except (OSError, ValueError):
                return 0
            return int(st.get("mem_cap_bytes") or st.get("limit_bytes") or 0)
    return 0


def sim_says(replay, trace, timeout):
    """sim_says runs `replay sim TRACE` as a user would (under the job's
    cap) and returns its warning, naming the event, that the simulation
    parts from the recording, or that its peak may be lower than reported
    (a release the log does not show), "" when it gives neither."""
    cmd = [replay, "sim", trace]
    cap = job_cap(trace)
    if cap:
        cmd += ["--capacity", str(cap)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=timeout,
                           stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return next((l for l in p.stderr.splitlines() if "parts from the recording at event " in l or
                 ("reserved bytes (event " in l and "wholly free" in l)), "")


# --- shrinking -------------------------------------------------------------


def load_refs(gen):
    """load_refs returns the op_refs function of the generator module at
    path gen, or one that knows no dependencies when it has none (or cannot
    be imported without its framework)."""
    sys.dont_write_bytecode = True  # no __pycache__ beside the generators
    try:
        spec = importlib.util.spec_from_file_location("_fuzzgen_" + os.path.basename(gen)[:-3], gen)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        fn = getattr(mod, "op_refs", None)
        if callable(fn):
            return fn
    except Exception as e:  # noqa: BLE001
        log("shrink: %s: no op_refs (%s: %s): ops are dropped one by one" % (gen, type(e).__name__, e))
    return lambda op: ([], [])


def _refs(refs, op):
    try:
        d, u = refs(op)
        return set(d), set(u)
    except Exception:  # noqa: BLE001 (an op the generator does not know)
        return set(), set()


def units(ops, bodies):
    """units lists the addresses of a program's ops: (i,) for op i and,
    with bodies, (i, j) for op j of op i's body."""
    out = []
    for i, op in enumerate(ops):
        out.append((i,))
        if bodies and isinstance(op, dict) and isinstance(op.get("body"), list):
            out.extend((i, j) for j in range(len(op["body"])))
    return out


def count_units(ops):
    return len(units(ops, True))


def remove(ops, drop, refs):
    """remove returns ops without the units in the set drop and without
    every op (or body op) that uses an id a removed one defines."""
    gone = set()
    out = []
    for i, op in enumerate(ops):
        d, u = _refs(refs, op)
        body = op.get("body") if isinstance(op, dict) else None
        if (i,) in drop or u & gone:
            gone |= d
            if isinstance(body, list):
                for b in body:
                    gone |= _refs(refs, b)[0]
            continue
        if isinstance(body, list):
            nb = []
            for j, b in enumerate(body):
                bd, bu = _refs(refs, b)
                if (i, j) in drop or bu & gone:
                    gone |= bd
                    continue
                nb.append(b)
            if len(nb) != len(body):
                op = dict(op)
                op["body"] = nb
        out.append(op)
    return out


def split_conf(conf):
    """split_conf cuts a settings string into its key:value items, keeping
    a bracketed list whole."""
    items, depth, cur = [], 0, ""
    for c in conf:
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
        if c == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += c
    items.append(cur)
    return [i.strip() for i in items if i.strip()]


class Shrinker:
    """Shrinker makes a failing program smaller while it fails the same
    way, running candidates J at a time."""

    def __init__(self, args, prog, gen, refs, stop):
        self.args, self.p, self.gen, self.refs, self.stop = args, prog, gen, refs, stop
        self.root = os.path.join(prog.dir, "shrink", prog.name)
        shutil.rmtree(self.root, ignore_errors=True)
        os.makedirs(self.root, exist_ok=True)
        self.n = 0
        self.tried = {}  # candidates known not to fail the same way
        self.best_dir = None
        self.runs = 0
        self.lock = threading.Lock()

    def test(self, cand, deadline):
        """test runs one candidate program and tells whether it fails with
        the target signature; it keeps the candidate's directory when it
        does."""
        key = json.dumps(cand, sort_keys=True)
        if key in self.tried:  # a candidate that passed, or failed otherwise
            return False, None
        with self.lock:
            self.n += 1
            d = os.path.join(self.root, "c%04d" % self.n)
        os.makedirs(d)
        path = os.path.join(d, "candidate.json")
        with open(path, "w") as f:
            json.dump(cand, f)
        name = self.p.name
        cmd = [sys.executable, self.gen, "--seed", str(self.p.seed), "--out", d, "--program", path, "--name", name]
        rc, _, why = run_child(cmd, os.path.join(d, name + ".gen.log"), self.args.timeout,
                               child_env(self.p.kind), deadline=deadline, stop=self.stop)
        self.runs += 1
        ok = False
        if rc == 0 and not why:
            tr = find_trace(d, name)
            if tr is not None:
                v, _, sig, _ = fidelity(self.args.replay, tr, os.path.join(d, name + ".fidelity.txt"),
                                        self.args.fidelity_timeout, deadline=deadline, stop=self.stop)
                ok = v == "failed" and (sig == self.p.signature or self.args.shrink_match == "fails")
        if why in ("deadline", "stopped"):
            shutil.rmtree(d, ignore_errors=True)
            return False, None  # not known: not remembered
        if not ok:
            self.tried[key] = True
            shutil.rmtree(d, ignore_errors=True)
            return False, None
        return True, d

    def first(self, cands, deadline):
        """first runs the candidates J at a time and returns the smallest
        one that fails the same way in the first batch that has one (with
        its directory), or (None, None)."""
        j = max(1, self.args.jobs)
        for b in range(0, len(cands), j):
            if time.time() >= deadline or self.stop.is_set():
                return None, None
            batch = cands[b:b + j]
            with cf.ThreadPoolExecutor(len(batch)) as ex:
                res = list(ex.map(lambda c: self.test(c, deadline), batch))
            good = [(count_units(c["ops"]), i) for i, (c, (ok, _)) in enumerate(zip(batch, res)) if ok]
            for i, (ok, d) in enumerate(res):
                if ok and (not good or i != min(good)[1]) and d:
                    shutil.rmtree(d, ignore_errors=True)
            if good:
                i = min(good)[1]
                return batch[i], res[i][1]
        return None, None

    def accept(self, cand, d):
        if self.best_dir and self.best_dir != d:
            shutil.rmtree(self.best_dir, ignore_errors=True)
        self.best_dir = d
        return cand

    def ddmin(self, cur, bodies, deadline):
        """ddmin drops chunks of units (ops, or with bodies the ops of
        bodies) from cur while the result still fails the same way: the
        halves first, then quarters, ... down to single units. A batch of J
        candidates holds the chunks of the current granularity and, to fill
        it, those of finer ones; the smallest program that fails the same
        way wins, and the search goes on from it."""
        n = 2
        while time.time() < deadline and not self.stop.is_set():
            us = units(cur["ops"], bodies)
            if bodies:
                us = [u for u in us if len(u) == 2]
            if not us:
                break
            n = min(n, len(us))
            cands, seen = [], set()
            m, size = n, len(us)
            while m <= len(us) and (m == n or len(cands) < self.args.jobs):
                size = int(math.ceil(len(us) / float(m)))
                for i in range(0, len(us), size):
                    ops = remove(cur["ops"], set(us[i:i + size]), self.refs)
                    key = json.dumps(ops, sort_keys=True)
                    if ops == cur["ops"] or key in seen:
                        continue
                    seen.add(key)
                    c = dict(cur)
                    c["ops"] = ops
                    cands.append(c)
                if size <= 1:
                    break
                m *= 2
            best, d = self.first(cands, deadline)
            if best is not None:
                cur = self.accept(best, d)
                n = max(n // 2, 2)
            elif size <= 1:
                break
            else:
                n = min(m, len(us))
        return cur

    def simplify_conf(self, cur, deadline):
        """simplify_conf drops the keys of the program's alloc_conf one at a
        time while it still fails the same way."""
        conf = cur.get("alloc_conf")
        if not isinstance(conf, str) or not conf:
            return cur
        changed = True
        while changed and time.time() < deadline and not self.stop.is_set():
            changed = False
            items = split_conf(cur["alloc_conf"])
            cands = []
            for i in range(len(items)):
                c = dict(cur)
                c["alloc_conf"] = ",".join(items[:i] + items[i + 1:])
                cands.append(c)
            best, d = self.first(cands, deadline)
            if best is not None:
                cur = self.accept(best, d)
                changed = True
        return cur

    def run(self, deadline):
        """run shrinks the program until deadline and returns a summary of
        what it reached."""
        t = time.time()
        orig = self.p.prog()
        if not isinstance(orig, dict) or not isinstance(orig.get("ops"), list):
            return {"note": "no ops list in the program: not shrunk"}
        cur = self.ddmin(orig, False, deadline)
        cur = self.ddmin(cur, True, deadline)
        cur = self.simplify_conf(cur, deadline)
        out = {"ops_before": len(orig["ops"]), "ops_after": len(cur["ops"]),
               "units_before": count_units(orig["ops"]), "units_after": count_units(cur["ops"]),
               "alloc_conf": cur.get("alloc_conf"), "runs": self.runs, "seconds": round(time.time() - t, 1)}
        if self.best_dir is None:
            out["note"] = "no smaller program failed the same way"
        else:
            dst = os.path.join(self.p.dir, "shrunk")
            os.makedirs(dst, exist_ok=True)
            name = self.p.name
            for f in os.listdir(self.best_dir):
                if f.startswith(name + "."):
                    shutil.copy(os.path.join(self.best_dir, f), os.path.join(dst, f))
            tr = find_trace(dst, name)
            out["prog"] = os.path.relpath(os.path.join(dst, name + ".prog.json"), os.path.dirname(self.p.dir))
            out["trace"] = os.path.relpath(tr, os.path.dirname(self.p.dir)) if tr else None
            fl = os.path.join(dst, name + ".fidelity.txt")
            try:
                with open(fl) as f:
                    out["first_line"] = next((l.rstrip("\n") for l in f if l.strip()), "")
            except OSError:
                pass
        if not self.args.keep_shrink_dirs:
            shutil.rmtree(self.root, ignore_errors=True)
        return out


def shrink_all(args, progs, gens, stop, t_end):
    """shrink_all shrinks the failed programs until t_end: one of each
    signature first (the smallest), then the others."""
    failed = [p for p in progs if p.verdict == "failed"]
    if not failed or time.time() >= t_end:
        return
    groups = {}
    for p in failed:
        groups.setdefault((p.kind, p.signature), []).append(p)

    def size(p):
        pr = p.prog()
        return count_units(pr["ops"]) if isinstance(pr, dict) and isinstance(pr.get("ops"), list) else 1 << 30

    for g in groups.values():
        g.sort(key=size)
    reps = [g[0] for g in sorted(groups.values(), key=lambda g: (-len(g), size(g[0])))]
    rest = sorted((p for g in groups.values() for p in g[1:]), key=size)
    log("shrink: %d failed programs, %d signatures, %.0f s" % (len(failed), len(groups), t_end - time.time()))
    refs = {}
    for rnd in (reps, rest):
        for i, p in enumerate(rnd):
            left = t_end - time.time()
            if left < 5 or stop.is_set():
                log("shrink: out of time")
                return
            slice_ = max(min(left, 20.0), left / (len(rnd) - i))
            if p.kind not in refs:
                refs[p.kind] = load_refs(gens[p.kind])
            s = Shrinker(args, p, gens[p.kind], refs[p.kind], stop)
            p.shrunk = s.run(min(t_end, time.time() + slice_))
            r = p.shrunk
            log("shrink: %s (%s): %s -> %s ops in %s s, %d runs%s" % (
                p.name, p.signature[:80], r.get("ops_before"), r.get("ops_after"), r.get("seconds"),
                r.get("runs", 0), ("; " + r["note"]) if r.get("note") else ""))


# --- the run ---------------------------------------------------------------


def table(progs, kinds):
    """table returns the per-kind counts and the text of the table."""
    rows = {}
    for k in kinds:
        ps = [p for p in progs if p.kind == k]
        c = {v: sum(1 for p in ps if p.verdict == v) for v in ("identical", "warned", "failed", "crashed", "skipped")}
        c["says_where"] = sum(1 for p in ps if p.verdict == "failed" and p.sim_says)
        c["silent"] = c["failed"] - c["says_where"]
        ran = len(ps) - c["crashed"] - c["skipped"]
        c["programs"] = len(ps)
        c["pass_rate"] = round((c["identical"] + c["warned"]) / float(ran), 4) if ran else None
        rows[k] = c
    lines = ["%-6s %9s %9s %7s %7s %11s %7s %8s %10s" % ("kind", "programs", "identical", "warned", "failed",
                                                         "says where", "silent", "crashed", "pass rate")]
    for k, c in rows.items():
        pr = "-" if c["pass_rate"] is None else "%.1f%%" % (100 * c["pass_rate"])
        extra = " (%d skipped)" % c["skipped"] if c["skipped"] else ""
        lines.append("%-6s %9d %9d %7d %7d %11d %7d %8d %10s%s" % (k, c["programs"], c["identical"], c["warned"],
                                                                 c["failed"], c["says_where"], c["silent"],
                                                                 c["crashed"], pr, extra))
    return rows, "\n".join(lines)


def signatures(progs):
    out = {}
    for p in progs:
        if p.verdict in ("failed", "warned"):
            e = out.setdefault((p.kind, p.verdict, p.signature), {"kind": p.kind, "verdict": p.verdict,
                                                                  "signature": p.signature, "count": 0,
                                                                  "programs": [], "example": p.first_line})
            e["count"] += 1
            e["programs"].append(p.name)
        elif p.verdict == "crashed":
            why = p.crash[-1] if p.crash else ""
            key = normalize(why)
            e = out.setdefault((p.kind, "crashed", key), {"kind": p.kind, "verdict": "crashed", "signature": key,
                                                          "count": 0, "programs": [], "example": why})
            e["count"] += 1
            e["programs"].append(p.name)
    return sorted(out.values(), key=lambda e: (e["kind"], e["verdict"], -e["count"]))


def write_summary(args, progs, kinds, path, done):
    rows, _ = table(progs, kinds)
    s = {"version": 1, "done": done, "elapsed_s": round(time.time() - T0, 1),
         "args": {k: v for k, v in vars(args).items()},
         "kinds": rows, "signatures": signatures(progs), "programs": [p.record() for p in progs]}
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(s, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def export(args, progs, dest):
    """export copies what is worth keeping of the run to dest, in the same
    layout: summary.json; every program's NAME.prog.json and
    NAME.fidelity.txt; every file NAME.* of a program that did not replay
    identical (its log, recording, figures); those of the identical tiny
    programs whose recording is at most --export-max-kib but their log; and
    every kind's shrunk/ directory."""
    os.makedirs(dest, exist_ok=True)
    shutil.copy(os.path.join(args.out, "summary.json"), os.path.join(dest, "summary.json"))
    n = 0
    for p in progs:
        d = os.path.join(dest, p.kind)
        os.makedirs(d, exist_ok=True)
        small = False
        if p.trace and os.path.exists(p.trace):
            pr = p.prog() or {}
            small = bool(pr.get("tiny")) and os.path.getsize(p.trace) <= args.export_max_kib * 1024
        try:
            files = sorted(f for f in os.listdir(p.dir) if f.startswith(p.name + "."))
        except OSError:
            files = []
        for f in files:
            if p.verdict == "identical" and not small and f not in (p.name + ".prog.json", p.name + ".fidelity.txt"):
                continue
            if p.verdict == "identical" and f.endswith(".gen.log"):
                continue
            shutil.copy(os.path.join(p.dir, f), os.path.join(d, f))
            n += 1
    for k in {p.kind for p in progs}:
        src = os.path.join(args.out, k, "shrunk")
        if os.path.isdir(src):
            shutil.copytree(src, os.path.join(dest, k, "shrunk"), dirs_exist_ok=True)
    log("exported %d files and the shrunk programs to %s" % (n, dest))


def main(argv=None):
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--replay", required=True, help="the replay binary (bin/replay)")
    for k in KINDS:
        ap.add_argument("--" + k, type=int, default=0, metavar="N", help="number of %s programs (default 0)" % k)
    ap.add_argument("--jobs", type=int, default=12, help="programs at once (default 12)")
    ap.add_argument("--seed-base", type=int, default=0, help="first seed (default 0)")
    ap.add_argument("--shrink-budget", type=float, default=240, help="seconds for shrinking, in all (default 240)")
    ap.add_argument("--timeout", type=float, default=180, help="seconds a program may run (default 180)")
    ap.add_argument("--fidelity-timeout", type=float, default=300, help="seconds a replay may run (default 300)")
    ap.add_argument("--max-wall", type=float, default=480,
                    help="the run's wall time: no program starts after 80%% of it, shrinking ends 10 s before it (default 480)")
    ap.add_argument("--shrink-match", choices=("signature", "fails"), default="signature",
                    help="a shrunk program must fail with the same signature (default) or fail at all")
    ap.add_argument("--keep-shrink-dirs", action="store_true", help="keep DIR/K/shrink/NAME/c* (default: removed)")
    ap.add_argument("--export", metavar="DIR",
                    help="at the end, copy what is worth keeping to DIR (summary, programs, failures, small tiny recordings, shrunk)")
    ap.add_argument("--export-max-kib", type=int, default=512,
                    help="largest recording of an identical tiny program that --export copies, KiB (default 512)")
    args = ap.parse_args(argv)
    if args.jobs < 1:
        ap.error("--jobs must be at least 1")
    args.replay = os.path.abspath(args.replay)
    if not (os.path.isfile(args.replay) and os.access(args.replay, os.X_OK)):
        ap.error("--replay %s: not an executable file" % args.replay)
    gens = {}
    for k in KINDS:
        n = getattr(args, k)
        if n <= 0:
            continue
        g = os.path.join(HERE, k + "gen.py")
        if not os.path.exists(g):
            log("skip %s: no %s" % (k, g))
            continue
        gens[k] = g
    if not gens:
        ap.error("no programs to run (give --torch N, --cupy N or --jax N with their generators beside run.py)")
    os.makedirs(args.out, exist_ok=True)
    kinds = list(gens)
    per = {k: [Program(k, args.seed_base + i, args.out) for i in range(getattr(args, k))] for k in kinds}
    progs = []
    for i in range(max(len(v) for v in per.values())):  # kinds interleaved
        for k in kinds:
            if i < len(per[k]):
                progs.append(per[k][i])
    total = len(progs)
    log("running %d programs (%s), %d at a time; replay %s" % (
        total, ", ".join("%s %d" % (k, len(per[k])) for k in kinds), args.jobs, args.replay))
    stop = threading.Event()
    done = [0]
    dead = {k: [0, 0] for k in kinds}  # finished, crashed
    skip = set()
    lock = threading.Lock()

    last_start = T0 + 0.8 * args.max_wall
    kill_at = T0 + args.max_wall - 20

    def work(p):
        if p.kind in skip or stop.is_set():
            p.verdict = "skipped"
            return p
        if time.time() > last_start:
            p.verdict = "skipped"
            p.crash = ["not started: past 80% of --max-wall"]
            return p
        try:
            run_one(args, p, gens[p.kind], stop, kill_at)
        except Exception as e:  # noqa: BLE001 (the driver goes on)
            p.verdict = "crashed"
            p.crash = ["run.py: %s: %s" % (type(e).__name__, e)]
        with lock:
            done[0] += 1
            dead[p.kind][0] += 1
            dead[p.kind][1] += p.verdict == "crashed"
            if dead[p.kind][0] >= 2 * args.jobs and dead[p.kind][0] == dead[p.kind][1] and p.kind not in skip:
                skip.add(p.kind)
                log("every one of the first %d %s programs crashed: the rest are skipped (see %s)" % (
                    dead[p.kind][0], p.kind, os.path.join(p.dir, p.name + ".gen.log")))
            n = done[0]
        what = p.verdict
        if p.verdict in ("crashed", "skipped"):
            what += ": " + (p.crash[-1] if p.crash else "")
        elif p.verdict != "identical":
            what += ": " + p.first_line
        log("%d/%d %s %s (%.1f s)" % (n, total, p.name, what[:160], p.gen_wall))
        return p

    summary = os.path.join(args.out, "summary.json")
    ex = cf.ThreadPoolExecutor(args.jobs)
    try:
        futs = [ex.submit(work, p) for p in progs]
        pending = set(futs)
        while pending:
            _, pending = cf.wait(pending, timeout=30)
            write_summary(args, progs, kinds, summary, False)  # what is known so far
        for f in futs:
            f.result()
        ex.shutdown(wait=True)
        n_skip = sum(1 for p in progs if p.verdict == "skipped")
        if n_skip:
            log("%d programs skipped (out of time: raise --max-wall, or fewer programs)" % n_skip)
        write_summary(args, progs, kinds, summary, False)
        _, text = table(progs, kinds)
        print(text, flush=True)
        t_end = min(time.time() + args.shrink_budget, T0 + args.max_wall - 10)
        shrink_all(args, progs, gens, stop, t_end)
    except KeyboardInterrupt:
        stop.set()
        log("interrupted: stopping the programs that run")
        ex.shutdown(wait=True, cancel_futures=True)
        for p in progs:
            if not p.verdict:
                p.verdict = "skipped"
    write_summary(args, progs, kinds, summary, True)
    rows, text = table(progs, kinds)
    print(text)
    for e in signatures(progs):
        print("%-5s %-8s %4d  %s  (e.g. %s)" % (e["kind"], e["verdict"], e["count"], e["signature"][:110],
                                              e["programs"][0]))
    shr = [p for p in progs if p.shrunk and p.shrunk.get("prog")]
    for p in shr:
        print("shrunk %s: %d -> %d ops: %s" % (p.name, p.shrunk["ops_before"], p.shrunk["ops_after"], p.shrunk["prog"]))
    if args.export:
        try:
            export(args, progs, args.export)
        except OSError as e:
            log("export to %s failed: %s" % (args.export, e))
    log("done; %s" % summary)
    bad = any(p.verdict in ("failed", "crashed") for p in progs)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

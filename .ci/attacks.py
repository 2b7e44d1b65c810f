#!/usr/bin/env python3
"""The attacks of issue 36, run against a build of replay and record.

usage: .ci/attacks.py BINDIR [--only NAME,...] [--small]

BINDIR holds `replay` and `record` (a `make build`, or binaries built at
another commit to compare). Each attack writes its input into a scratch
directory, runs the command with a memory limit (RLIMIT_AS 8 GiB) and a
time limit (120 s), and prints one row: the attack, the exit status, peak
RSS, wall time, what happened (a check of the outputs where the attack is
about them) and the first line of stderr. --small shrinks the bombs ten
times for a quick look. Needs root only for the full-disk attack (a 1 MiB
tmpfs); it is skipped otherwise.
"""

import gzip
import os
import pickle
import resource
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

AS_LIMIT = 8 << 30
TIMEOUT = 120
SCALE = 1


def run(argv, cwd, stdout=None, interrupt_after=None, interrupt_when=None, env=None):
    """Runs argv; returns (status, peak RSS in MiB, seconds, stdout, stderr)."""
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))
    out = stdout if stdout is not None else subprocess.PIPE
    t0 = time.monotonic()
    p = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=subprocess.PIPE,
                         preexec_fn=limit, env=env)
    if interrupt_after is not None:
        time.sleep(interrupt_after)
        p.send_signal(signal.SIGINT)
    if interrupt_when is not None:
        while p.poll() is None and not interrupt_when():
            time.sleep(0.002)
        p.send_signal(signal.SIGINT)
    try:
        so, se = p.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        p.kill()
        so, se = p.communicate()
        status = "timeout"
    else:
        status = p.returncode
    dt = time.monotonic() - t0
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return status, dt, so or b"", se or b""


def peak_rss_mib(before):
    return (resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss - 0) / 1024


def gz(path, chunks):
    with gzip.open(path, "wb", compresslevel=6) as f:
        for c in chunks:
            f.write(c)
    return path


def repeat(b, n, chunk=1 << 20):
    per = max(1, chunk // len(b))
    block = b * per
    while n >= per:
        yield block
        n -= per
    if n:
        yield b * n


# Pickle pieces (protocol 2 and 4 opcodes).
PROTO2 = b"\x80\x02"
PROTO4 = b"\x80\x04"
STOP = b"."


def snapshot_with_settings(extra):
    """A minimal snapshot whose allocator_settings holds extra's value."""
    d = {"segments": [], "device_traces": [[]], "allocator_settings": {"x": extra}}
    return pickle.dumps(d, protocol=4)


ATTACKS = []


def attack(name, defect):
    def reg(f):
        ATTACKS.append((name, defect, f))
        return f
    return reg


@attack("full disk: sim --json/--csv/--sites-csv over good files", "1")
def a_fulldisk(d, b):
    if os.geteuid() != 0:
        return None
    tfs = os.path.join(d, "tfs")
    os.mkdir(tfs)
    subprocess.check_call(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", tfs])
    try:
        outs = {k: os.path.join(tfs, "out." + k) for k in ("json", "csv", "sites.csv")}
        for p in outs.values():
            with open(p, "w") as f:
                f.write("good\n")
        subprocess.call(["dd", "if=/dev/zero", "of=" + os.path.join(tfs, "fill"), "bs=4k"],
                        stderr=subprocess.DEVNULL)
        tr = os.path.join(d, "t.trace")
        with open(tr, "w") as f:
            f.write('stack id=1 frame="a.py:1:f"\nmalloc id=1 size=4096 stack=1\nfree id=1\n')
        r = run([b + "/replay", "sim", "--from", "text", "--policy", "pytorch", "--sites", "3", "--json", outs["json"],
                 "--csv", outs["csv"], "--sites-csv", outs["sites.csv"], tr], d)
        lost = [k for k, p in outs.items() if open(p).read() != "good\n"]
        return r, "previous files kept" if not lost else "LOST: " + ", ".join(lost)
    finally:
        subprocess.call(["umount", tfs])


@attack("sim > /dev/full", "1")
def a_devfull(d, b):
    tr = os.path.join(REPO, "testdata/pytorch/train_gpt.pickle.gz")
    with open("/dev/full", "wb") as full:
        r = run([b + "/replay", "sim", "--policy", "pytorch", tr], d, stdout=full)
    return r, ""


@attack("pickle: 4M nested lists", "2")
def a_nested(d, b):
    n = 4_000_000 // SCALE
    p = gz(os.path.join(d, "nested.pickle.gz"),
           [PROTO2] + list(repeat(b"]", n)) + list(repeat(b"a", n - 1)) + [STOP])
    return run([b + "/replay", "stats", p], d), ""


@attack("pickle: 100M MARK", "2")
def a_marks(d, b):
    n = 100_000_000 // SCALE
    p = gz(os.path.join(d, "marks.pickle.gz"), [PROTO2] + list(repeat(b"(", n)) + [STOP])
    return run([b + "/replay", "stats", p], d), ""


@attack("pickle: BINUNICODE8 of 1 GiB", "2")
def a_bigstr(d, b):
    n = (1 << 30) // SCALE
    p = gz(os.path.join(d, "bigstr.pickle.gz"),
           [PROTO4, b"\x8d" + struct.pack("<Q", n)] + list(repeat(b"a", n)) + [STOP])
    return run([b + "/replay", "stats", p], d), ""


def profiler_json(d, name, pre, body, post):
    return gz(os.path.join(d, name), [pre] + list(body) + [post])


@attack("profiler JSON: 1 GiB trace_id", "2")
def a_json_str(d, b):
    n = (1 << 30) // SCALE
    p = profiler_json(d, "bigid.json.gz", b'{"schemaVersion": 1, "traceEvents": [], "trace_id": "',
                      repeat(b"a", n), b'"}')
    return run([b + "/replay", "stats", "--from", "kineto", p], d), ""


@attack("profiler JSON: 1 GiB string under an unknown key", "2")
def a_json_unknown(d, b):
    n = (1 << 30) // SCALE
    p = profiler_json(d, "bigunk.json.gz", b'{"schemaVersion": 1, "traceEvents": [], "zz": "',
                      repeat(b"a", n), b'"}')
    return run([b + "/replay", "stats", "--from", "kineto", p], d), ""


@attack("profiler JSON: 50M-deep array under an unknown key", "2")
def a_json_deep(d, b):
    n = 50_000_000 // SCALE
    p = profiler_json(d, "deep.json.gz", b'{"schemaVersion": 1, "traceEvents": [], "zz": ',
                      list(repeat(b"[", n)) + list(repeat(b"]", n)), b"}")
    return run([b + "/replay", "stats", "--from", "kineto", p], d), ""


@attack("text: 10M device_sync lines", "2")
def a_text(d, b):
    n = 10_000_000 // SCALE
    p = gz(os.path.join(d, "sync.trace.gz"), repeat(b"device_sync\n", n))
    return run([b + "/replay", "stats", "--from", "text", p], d), ""


@attack("text: 10M device_sync lines, sim", "2")
def a_text_sim(d, b):
    n = 10_000_000 // SCALE
    p = gz(os.path.join(d, "sync.trace.gz"), repeat(b"device_sync\n", n))
    return run([b + "/replay", "sim", "--policy", "pytorch", "--from", "text", p], d), ""


@attack("MiniMalloc: 10M rows", "2")
def a_minimalloc(d, b):
    n = 10_000_000 // SCALE

    def rows():
        yield b"id,lower,upper,size\n"
        buf = []
        for i in range(n):
            buf.append(b"%d,%d,%d,64\n" % (i, i, i + 2))
            if len(buf) == 65536:
                yield b"".join(buf)
                buf = []
        yield b"".join(buf)
    p = gz(os.path.join(d, "big.problem.csv.gz"), rows())
    return run([b + "/replay", "stats", "--from", "minimalloc", p], d), ""


@attack("pickle: LONG4 of 16 MiB in allocator_settings", "3")
def a_long4(d, b):
    nbytes = (16 << 20) // SCALE
    p = os.path.join(d, "long4.pickle")
    with open(p, "wb") as f:
        f.write(snapshot_with_settings(1 << (8 * nbytes - 2)))
    return run([b + "/replay", "stats", p], d), ""


def streams_trace(d, n):
    p = os.path.join(d, "streams%d.trace" % n)
    with open(p, "w") as f:
        for i in range(n):
            f.write("malloc id=%d size=4096 stream=%d\nfree id=%d stream=%d\n" % (i + 1, i + 1, i + 1, i + 1))
    return p


def pools_trace(d, n):
    p = os.path.join(d, "pools%d.trace" % n)
    with open(p, "w") as f:
        f.write('header source=text\n')
        for i in range(n):
            f.write("malloc id=%d size=4096 pool=%d\nfree id=%d\n" % (i + 1, i + 1, i + 1))
        for i in range(n):
            f.write("pool_release pool=%d\n" % (i + 1))
    return p


def policy_attack(kind, n, policy):
    @attack("%d %s, %s" % (n, kind, policy), "3")
    def a(d, b):
        p = streams_trace(d, n // SCALE) if kind == "streams" else pools_trace(d, n // SCALE)
        return run([b + "/replay", "sim", "--policy", policy, "--from", "text", p], d), ""


for pol in ["pytorch", "paddle", "offline", "greedy-by-size", "greedy-by-lifetime", "rmm-pool", "async-pool", "bfc", "cupy"]:
    policy_attack("streams", 20000, pol)
policy_attack("streams", 100000, "pytorch")
policy_attack("pools", 20000, "pytorch")


@attack("--viz DIR over an input", "4")
def a_viz_over(d, b):
    # --viz v writes v/TRACE.POLICY.pickle: with v/t.trace and v/t.pytorch.pickle
    # (a real snapshot) replayed together, t.trace's output is the second input.
    v = os.path.join(d, "v")
    os.mkdir(v)
    with open(os.path.join(v, "t.trace"), "w") as f:
        f.write("malloc id=1 size=4096\nfree id=1\n")
    snap = os.path.join(v, "t.pytorch.pickle")
    with gzip.open(os.path.join(REPO, "testdata/pytorch/train_gpt.pickle.gz")) as f, open(snap, "wb") as g:
        g.write(f.read())
    before = open(snap, "rb").read()
    r = run([b + "/replay", "sim", "--policy", "pytorch", "--viz", v, os.path.join(v, "t.trace"), snap], d)
    kept = open(snap, "rb").read() == before
    return r, "input kept" if kept else "input OVERWRITTEN"


@attack("record run -o ./prog -- ./prog", "4")
def a_record_over(d, b):
    prog = os.path.join(d, "prog")
    with open(prog, "w") as f:
        f.write("#!/bin/sh\nexit 0\n")
    os.chmod(prog, 0o755)
    before = open(prog, "rb").read()
    r = run([b + "/record", "run", "-o", "./prog", "--", "./prog"], d)
    kept = open(prog, "rb").read() == before
    return r, "program kept" if kept else "program OVERWRITTEN"


@attack("record run -o EXISTING_DIR -- prog (exit 4)", "4")
def a_record_dir(d, b):
    os.mkdir(os.path.join(d, "out"))
    mark = os.path.join(d, "ran")
    prog = os.path.join(d, "prog")
    with open(prog, "w") as f:
        f.write("#!/bin/sh\ntouch %s\nexit 4\n" % mark)
    os.chmod(prog, 0o755)
    r = run([b + "/record", "run", "-o", "out", "--", "./prog"], d)
    return r, "program RAN first" if os.path.exists(mark) else "refused before running"


@attack("two sweeps in one directory at once", "4")
def a_two_sweeps(d, b):
    tr = os.path.join(REPO, "testdata/pytorch/train_gpt.pickle.gz")
    out = os.path.join(d, "sw")
    lim = lambda: resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))
    t0 = time.monotonic()
    p1 = subprocess.Popen([b + "/replay", "sweep", "--traces", tr, "--policy", "all", "-o", out],
                          cwd=d, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=lim)
    p2 = subprocess.Popen([b + "/replay", "sweep", "--traces", tr, "--policy", "pytorch", "--capacity", "8GiB", "-o", out],
                          cwd=d, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=lim)
    _, e1 = p1.communicate()
    _, e2 = p2.communicate()
    st = "%s/%s" % (p1.returncode, p2.returncode)
    what = "both said they succeeded" if p1.returncode == 0 and p2.returncode == 0 else "one refused"
    return (st, time.monotonic() - t0, b"", e2 if p2.returncode else e1), what


@attack("terminal escapes in a header's device name (stats)", "5")
def a_term(d, b):
    p = os.path.join(d, "esc.trace")
    with open(p, "w") as f:
        f.write('header source=text device="\x1b]0;pwned\x07\x1b[2J"\nmalloc id=1 size=4096\nfree id=1\n')
    r = run([b + "/replay", "stats", "--from", "text", p], d)
    raw = b"\x1b" in r[2]
    return r, "ESC reaches the terminal" if raw else "escaped"


@attack("CSV cell starting with = (trace name)", "5")
def a_csv(d, b):
    p = "=HYPERLINK(1).trace"
    with open(os.path.join(d, p), "w") as f:
        f.write("malloc id=1 size=4096\nfree id=1\n")
    csv = os.path.join(d, "out.csv")
    r = run([b + "/replay", "sim", "--policy", "pytorch", "--from", "text", "--csv", csv, p], d)
    data = open(csv, "rb").read() if os.path.exists(csv) else b""
    bad = any(cell.startswith(b"=") for line in data.splitlines() for cell in line.split(b","))
    return r, "formula cell" if bad else "quoted"


@attack("trace name with ESC in SVG charts", "5")
def a_svg(d, b):
    import xml.dom.minidom
    p = os.path.join(d, "a\x1bb.trace")
    with open(p, "w") as f:
        f.write("malloc id=1 size=4096\nfree id=1\n")
    pd = os.path.join(d, "plots")
    r = run([b + "/replay", "sim", "--policy", "pytorch", "--from", "text", "--plots", pd, p], d)
    bad = 0
    svgs = [n for n in os.listdir(pd) if n.endswith(".svg")] if os.path.isdir(pd) else []
    for n in svgs:
        try:
            xml.dom.minidom.parse(os.path.join(pd, n))
        except Exception:
            bad += 1
    return r, "%d of %d SVG invalid" % (bad, len(svgs))


@attack("frame with invalid UTF-8 in a --viz pickle", "5")
def a_viz_utf8(d, b):
    p = os.path.join(d, "u.trace")
    with open(p, "wb") as f:
        f.write(b'stack id=1 frame=a\xffb.py:1:f\nmalloc id=1 size=4096 stack=1\nfree id=1\n')
    vd = os.path.join(d, "viz")
    r = run([b + "/replay", "sim", "--policy", "pytorch", "--from", "text", "--viz", vd, p], d)
    ok = 0
    pk = [n for n in os.listdir(vd)] if os.path.isdir(vd) else []
    for n in pk:
        try:
            with open(os.path.join(vd, n), "rb") as f:
                pickle.load(f)
            ok += 1
        except Exception:
            pass
    return r, "%d of %d pickles load in Python" % (ok, len(pk))


def huge_attack(policy):
    @attack("five live mallocs of 2^62 bytes, %s" % policy, "6")
    def a(d, b):
        p = os.path.join(d, "huge.trace")
        with open(p, "w") as f:
            for i in range(5):
                f.write("malloc id=%d size=%d\n" % (i + 1, 1 << 62))
        r = run([b + "/replay", "sim", "--policy", policy, "--from", "text", p], d)
        row = [l.split() for l in r[2].decode().splitlines() if l.split()[1:2] == [policy]]
        return r, "reserved %s MiB, alloc %s ms" % (row[0][2], row[0][-2]) if row else ""


huge_attack("greedy-by-lifetime")
huge_attack("workspace")


@attack("SIGINT during sim --plots --viz", "7")
def a_sigint(d, b):
    tr = os.path.join(REPO, "testdata/pytorch/train_gpt.pickle.gz")

    def some_output():
        # The first chart written (in place, or staged under a temporary
        # name): the replays are done and the outputs are being written.
        p = os.path.join(d, "plots")
        return os.path.isdir(p) and any(".png" in n for n in os.listdir(p))
    r = run([b + "/replay", "sim", "--policy", "all", "--plots", "plots", "--viz", "viz", tr], d,
            interrupt_when=some_output)
    left = [n for x in ("plots", "viz") if os.path.isdir(os.path.join(d, x)) for n in os.listdir(os.path.join(d, x))]
    return r, "%d files left (%d pickles, %d charts)" % (len(left), sum(n.endswith(".pickle") for n in left),
                                                      sum(n.endswith((".png", ".svg")) for n in left))


def main():
    global SCALE, REPO
    args = sys.argv[1:]
    only = None
    if "--small" in args:
        args.remove("--small")
        SCALE = 10
    if "--only" in args:
        i = args.index("--only")
        only = args[i + 1].split(",")
        del args[i:i + 2]
    if len(args) != 1:
        sys.exit(__doc__)
    bindir = os.path.abspath(args[0])
    REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
    print("| attack | defect | exit | peak RSS MiB | s | outcome | stderr |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, defect, f in ATTACKS:
        if only and not any(o in name for o in only):
            continue
        d = tempfile.mkdtemp(prefix="attack-")
        try:
            # Peak RSS per attack: a fresh process measures its children.
            res = subprocess.run([sys.executable, __file__, "--one", name, bindir, str(SCALE)],
                                 capture_output=True, text=True)
            sys.stdout.write(res.stdout)
            sys.stderr.write(res.stderr)
            sys.stdout.flush()
        finally:
            shutil.rmtree(d, ignore_errors=True)


def one(name, bindir, scale):
    global SCALE, REPO
    SCALE = scale
    REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
    for n, defect, f in ATTACKS:
        if n != name:
            continue
        d = tempfile.mkdtemp(prefix="attack-")
        try:
            got = f(d, bindir)
            if got is None:
                print("| %s | %s | skipped (not root) | | | | |" % (n, defect))
                return
            (status, dt, so, se), what = got
            rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
            line = se.decode("utf-8", "backslashreplace").strip().splitlines()
            first = line[0] if line else ""
            first = first.replace("|", "\\|")[:110]
            print("| %s | %s | %s | %.0f | %.1f | %s | %s |" % (n, defect, status, rss, dt, what, first))
        finally:
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        one(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        main()

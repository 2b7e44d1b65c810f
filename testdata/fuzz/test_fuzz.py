#!/usr/bin/env python3
"""Tests of torchgen.py and run.py that need no GPU and no PyTorch:

    python3 testdata/fuzz/test_fuzz.py [-v]

They run the generated programs against a stand-in for torch (FAKE_TORCH,
written to a temporary directory put first on PYTHONPATH) that keeps the
rules a valid program must keep and fails the program where it breaks one:
a tensor used on another stream and freed without record_stream or a
synchronize of that stream, an allocation outside the graph's pool during a
capture, a synchronize or empty_cache during a capture, a pool shared after
it was released, a MemPool deleted with live tensors, a history recorded
with other than PyTorch's defaults. The driver runs against a stand-in for
`replay fidelity` (FAKE_REPLAY) that fails a recording by a rule, so that
shrinking has something to find.
"""
import gzip
import json
import re
import os
import pickle
import random
import subprocess
import sys
import tempfile
import unittest

sys.dont_write_bytecode = True  # no __pycache__ beside the files under test
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import run  # noqa: E402
import torchgen  # noqa: E402

MiB = 1 << 20
GiB = 1 << 30

FAKE_TORCH = r'''
"""A stand-in for torch that checks the rules of the caching allocator's
users (test_fuzz.py)."""
import contextlib
import pickle
import types

__version__ = "0.0+fake"
version = types.SimpleNamespace(cuda="0.0")
uint8, float16, bfloat16, float32 = "uint8", "float16", "bfloat16", "float32"
_ES = {uint8: 1, float16: 2, bfloat16: 2, float32: 4}


class _St:
    pass


S = _St()
S.total = 80 << 30
S.cap = None
S.allocated = 0
S.peak = 0
S.entries = []
S.violations = []
S.recording = False
S.capturing = None  # (graph, stream, pool id)
S.pools = {}  # pool id -> {"use": n, "live": n}
S.mempool = None
S.cur = None
S.next_pool = [1]
S.ooms = 0


def _violate(msg):
    S.violations.append(msg)
    raise AssertionError("fake torch: " + msg)


class OutOfMemoryError(RuntimeError):
    pass


class Stream:
    def __init__(self):
        self.seq = 0
        self.synced = 0
        self.waited = {}  # stream -> the last of its kernels this one waits for

    def synchronize(self):
        if S.capturing is not None:
            _violate("stream synchronize during capture")
        self.synced = self.seq

    def wait_stream(self, other):
        self.waited[other] = max(self.waited.get(other, 0), other.seq)

    def wait_event(self, e):
        if e.stream is not None:
            self.waited[e.stream] = max(self.waited.get(e.stream, 0), e.seq)

    def launch(self):
        self.seq += 1
        return self.seq


_default = Stream()
_streams = [_default]


def _cur():
    return S.cur or _default


class Event:
    stream, seq = None, 0

    def record(self, stream=None):
        self.stream = stream or _cur()
        self.seq = self.stream.seq


class _Storage:
    def __init__(self, nbytes):
        st = _cur()
        pool = None
        if S.capturing is not None:
            if st is not S.capturing[1]:
                _violate("allocation on a stream other than the capture stream during capture")
            pool = S.capturing[2]
        elif S.mempool is not None:
            pool = S.mempool
        r = -(-max(nbytes, 1) // 512) * 512
        if S.cap is not None and S.allocated + r > S.cap:
            S.entries.append(("oom", nbytes))
            S.ooms += 1
            raise OutOfMemoryError("CUDA out of memory. Tried to allocate %d bytes. More text" % nbytes)
        S.allocated += r
        S.peak = max(S.peak, S.allocated)
        self.r, self.nbytes, self.stream, self.pool = r, nbytes, st, pool
        self.uses = {}
        if pool is not None:
            S.pools[pool]["live"] += 1
        S.entries.append(("alloc", nbytes, pool))

    def use(self, st):
        if S.capturing is not None:
            if st is not S.capturing[1]:
                _violate("kernel on a stream other than the capture stream during capture")
            return  # a captured kernel runs where the graph is replayed
        seq = st.launch()
        if st is not self.stream and self.uses.get(st) != "rec":
            self.uses[st] = seq

    def __del__(self):
        for st, seq in self.uses.items():
            # a use on another stream is safe once that stream is
            # synchronized or the tensor's own stream waits for it
            if seq != "rec" and st.synced < seq and self.stream.waited.get(st, 0) < seq:
                S.violations.append("freed while used on another stream without record_stream or a sync")
        S.allocated -= self.r
        if self.pool is not None and self.pool in S.pools:
            S.pools[self.pool]["live"] -= 1
        S.entries.append(("free", self.nbytes))


class Tensor:
    def __init__(self, storage, numel, dtype, shape=None):
        self.s, self._numel, self.dtype = storage, numel, dtype
        self.shape = shape or (numel,)

    def numel(self):
        return self._numel

    def fill_(self, v):
        self.s.use(_cur())
        return self

    def add_(self, v):
        self.s.use(_cur())
        return self

    def __add__(self, v):
        self.s.use(_cur())
        return _new(self._numel, self.dtype, self.shape)

    def __matmul__(self, o):
        if len(self.shape) != 2 or len(o.shape) != 2 or self.shape[1] != o.shape[0]:
            raise RuntimeError("fake torch: matmul shapes %s %s" % (self.shape, o.shape))
        self.s.use(_cur())
        o.s.use(_cur())
        return _new(self.shape[0] * o.shape[1], self.dtype, (self.shape[0], o.shape[1]))

    def reshape(self, *shape):
        if shape != (-1,):
            raise RuntimeError("fake torch: reshape")
        return Tensor(self.s, self._numel, self.dtype)

    def view(self, dtype):
        n = self._numel * _ES[self.dtype] // _ES[dtype]
        return Tensor(self.s, n, dtype)

    def __getitem__(self, sl):
        a, b, _ = sl.indices(self._numel)
        return Tensor(self.s, max(0, b - a), self.dtype)

    def clone(self):
        self.s.use(_cur())
        return _new(self._numel, self.dtype, self.shape)

    def record_stream(self, st):
        if st is not self.s.stream:
            self.s.uses[st] = "rec"


def _new(numel, dtype, shape=None):
    t = Tensor(_Storage(numel * _ES[dtype]), numel, dtype, shape)
    return t


def empty(size, dtype=float32, device=None):
    if device != "cuda":
        raise RuntimeError("fake torch: not a cuda tensor")
    if isinstance(size, tuple):
        shape = tuple(int(x) for x in size)
        n = 1
        for x in shape:
            n *= x
    else:
        shape, n = (int(size),), int(size)
    if n < 0:
        raise RuntimeError("negative size")
    return _new(n, dtype, shape)


def cat(ts):
    for t in ts:
        t.s.use(_cur())
    return _new(sum(t.numel() for t in ts), ts[0].dtype)


def relu(x):
    x.s.use(_cur())
    return _new(x.numel(), x.dtype, x.shape)


@contextlib.contextmanager
def no_grad():
    yield


def compile(f, mode=None, dynamic=None):
    if mode != "reduce-overhead":
        raise RuntimeError("fake torch: mode")
    return f


compiler = types.SimpleNamespace(cudagraph_mark_step_begin=lambda: None)


class _Cuda(types.ModuleType):
    pass


cuda = _Cuda("torch.cuda")
cuda.OutOfMemoryError = OutOfMemoryError
cuda.Stream = lambda: (_streams.append(Stream()) or _streams[-1])
cuda.Event = Event
cuda.is_available = lambda: True
cuda.init = lambda: None
cuda.mem_get_info = lambda: (S.total - S.allocated, S.total)
cuda.get_device_name = lambda d=0: "Fake GPU"
cuda.current_stream = _cur


def _set_fraction(frac, device=None):
    if not isinstance(frac, float) or not 0 <= frac <= 1:
        raise TypeError("fraction")
    S.cap = int(frac * S.total)


cuda.set_per_process_memory_fraction = _set_fraction


@contextlib.contextmanager
def _stream(st):
    old = S.cur
    S.cur = st
    try:
        yield
    finally:
        S.cur = old


cuda.stream = _stream


def _synchronize():
    if S.capturing is not None:
        _violate("synchronize during capture")
    for st in _streams:
        st.synced = st.seq


cuda.synchronize = _synchronize


def _empty_cache():
    if S.capturing is not None:
        _violate("empty_cache during capture")
    S.entries.append(("empty_cache",))
    for pid in [p for p, v in S.pools.items() if v["use"] == 0 and v["live"] == 0]:
        del S.pools[pid]


cuda.empty_cache = _empty_cache


def _sleep(cycles):
    _cur().launch()


cuda._sleep = _sleep


def _new_pool_id():
    S.next_pool[0] += 1
    return (0, S.next_pool[0])


def _incref(pid):
    if pid in S.pools:
        if S.pools[pid]["use"] <= 0:
            _violate("pool %r shared after it was released" % (pid,))
        S.pools[pid]["use"] += 1
    else:
        S.pools[pid] = {"use": 1, "live": 0}


def _release(pid):
    if pid in S.pools:
        S.pools[pid]["use"] -= 1


class CUDAGraph:
    def __init__(self):
        self._pool = None
        self.captured = False

    def pool(self):
        return self._pool

    def replay(self):
        if not self.captured:
            raise RuntimeError("fake torch: replay of a graph not captured")
        _cur().launch()

    def __del__(self):
        if self._pool is not None:
            _release(self._pool)


cuda.CUDAGraph = CUDAGraph
cuda.graph_pool_handle = _new_pool_id


class _Graph:
    def __init__(self, g, pool=None, stream=None):
        self.g, self.pool, self.stream = g, pool, stream or Stream()

    def __enter__(self):
        _synchronize()
        _empty_cache()
        pid = self.pool if self.pool is not None else _new_pool_id()
        _incref(pid)
        self.g._pool = pid
        self.old = S.cur
        S.cur = self.stream
        S.capturing = (self.g, self.stream, pid)
        S.entries.append(("capture_begin", pid))

    def __exit__(self, *a):
        S.capturing = None
        S.cur = self.old
        self.g.captured = True
        S.entries.append(("capture_end",))


cuda.graph = _Graph


class MemPool:
    def __init__(self):
        self.id = _new_pool_id()
        _incref(self.id)

    def __del__(self):
        if self.id in S.pools and S.pools[self.id]["live"] > 0:
            S.violations.append("MemPool deleted with live tensors")
        _release(self.id)


cuda.MemPool = MemPool


@contextlib.contextmanager
def _use_mem_pool(pool):
    if S.capturing is not None or S.mempool is not None:
        _violate("use_mem_pool nested")
    _incref(pool.id)
    S.mempool = pool.id
    try:
        yield
    finally:
        S.mempool = None
        _release(pool.id)


cuda.use_mem_pool = _use_mem_pool

memory = types.ModuleType("torch.cuda.memory")
cuda.memory = memory


def _record(**kw):
    if set(kw) != {"max_entries"} or kw["max_entries"] != 1000000:
        _violate("history recorded with %r, not PyTorch's defaults" % (kw,))
    if S.entries:
        _violate("history recorded after the first allocation")
    S.recording = True


def _snapshot():
    return {"device_traces": [list(S.entries)], "segments": []}


def _dump(path):
    if not S.recording:
        _violate("no history")
    if S.capturing is not None:
        _violate("dump during capture")
    if S.violations:
        raise AssertionError("fake torch: " + "; ".join(sorted(set(S.violations))))
    with open(path, "wb") as f:
        pickle.dump(_snapshot(), f)


memory._record_memory_history = _record
memory._dump_snapshot = _dump
memory._snapshot = _snapshot
cuda.max_memory_reserved = lambda: S.peak
cuda.max_memory_allocated = lambda: S.peak
cuda.memory_reserved = lambda: S.allocated
cuda.memory_allocated = lambda: S.allocated
cuda.memory_stats = lambda: {"num_device_alloc": 1, "num_device_free": 0, "num_alloc_retries": 0,
                             "num_ooms": S.ooms, "allocated_bytes.all.peak": S.peak}
'''

FAKE_REPLAY = r'''#!/usr/bin/env python3
"""A stand-in for `replay fidelity` (test_fuzz.py): a recording with an
allocation of 13k+5 bytes followed later by an empty_cache diverges; one
with a capture is warned about; the rest are identical. As `replay sim`,
it warns of the parting of a diverging recording whose allocation is of
an even size, and says nothing of the others."""
import gzip, os, pickle, sys
sim = len(sys.argv) >= 3 and sys.argv[1] == "sim"
if not sim and (len(sys.argv) != 3 or sys.argv[1] != "fidelity"):
    print("usage", file=sys.stderr); sys.exit(2)
path = sys.argv[2]
name = os.path.basename(path)
try:
    with gzip.open(path) as f:
        snap = pickle.load(f)
except Exception as e:
    print("replay: %s: not a snapshot: %s" % (path, e), file=sys.stderr); sys.exit(1)
ev = snap["device_traces"][0]
bad = None
for i, e in enumerate(ev):
    if e[0] == "alloc" and e[1] % 13 == 5:
        if any(x[0] == "empty_cache" for x in ev[i + 1:]):
            bad = (i, e[1]); break
if sim:
    if bad and bad[1] % 2 == 0:
        print("%s: warning: the simulation of pytorch parts from the recording at event %d: ..." % (path, bad[0]), file=sys.stderr)
    sys.exit(0)
if bad:
    print("%s: diverges at event %d: real allocator: malloc of %d bytes at 0x7f00; simulation: placed at 0x7f%02x (policy pytorch)" % (name, bad[0], bad[1], bad[0] % 256))
    print("replay: fidelity: 1 of 1 traces diverge from their recording", file=sys.stderr)
    sys.exit(1)
if any(e[0] == "capture_begin" for e in ev):
    print("%s: warning: a pool the importer could not tell at event 3" % name)
print("%s: identical (3 device calls, %d mallocs; no measured figures beside it; policy pytorch, settings default)" % (name, len(ev)))
'''


def write_fakes(d):
    """write_fakes writes the stand-ins into d: d/stub/torch/__init__.py
    and the executable d/replay. It returns (PYTHONPATH entry, replay)."""
    os.makedirs(os.path.join(d, "stub", "torch"))
    with open(os.path.join(d, "stub", "torch", "__init__.py"), "w") as f:
        f.write(FAKE_TORCH)
    rp = os.path.join(d, "replay")
    with open(rp, "w") as f:
        f.write(FAKE_REPLAY)
    os.chmod(rp, 0o755)
    return os.path.join(d, "stub"), rp


def env_with(stub):
    env = dict(os.environ)
    env["PYTHONPATH"] = stub + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    return env


def walk(ops):
    for op in ops:
        yield op
        for b in op.get("body", []) if isinstance(op.get("body"), list) else []:
            yield b


class Generation(unittest.TestCase):
    def test_deterministic_and_json(self):
        for s in range(300):
            a, b = torchgen.generate(s), torchgen.generate(s)
            self.assertEqual(a, b)
            self.assertEqual(json.loads(json.dumps(a)), a)
        self.assertNotEqual(torchgen.generate(1)["ops"], torchgen.generate(2)["ops"])

    def test_shape(self):
        n, tiny, kinds, confs, caps, compiles = 600, 0, set(), 0, 0, 0
        for s in range(n):
            p = torchgen.generate(s)
            self.assertEqual(p["kind"], "torch")
            self.assertEqual(p["trace"], "torch_%d.pickle.gz" % s)
            ops = p["ops"]
            self.assertGreaterEqual(len(ops), 20 if not p["tiny"] else 20, s)
            self.assertLessEqual(len(ops), 40 if p["tiny"] else 200, s)
            tiny += p["tiny"]
            confs += bool(p["alloc_conf"])
            caps += bool(p["cap_bytes"])
            for op in walk(ops):
                kinds.add(op["op"])
                if op["op"] == "compile":
                    compiles += 1
                    self.assertFalse(p["cap_bytes"], s)
                if "bytes" in op:
                    self.assertGreaterEqual(op["bytes"], 1)
                    self.assertLessEqual(op["bytes"], GiB)
                    if p["tiny"]:
                        self.assertLess(op["bytes"], 64 * MiB, s)
            if p["cap_bytes"]:
                self.assertEqual(p["cap_bytes"] % (2 * MiB), MiB)
        self.assertTrue(0.18 < tiny / n < 0.32, tiny)
        self.assertTrue(0.4 < confs / n < 0.8, confs)
        self.assertTrue(0.2 < caps / n < 0.4, caps)
        self.assertTrue(compiles > 0)
        want = {"malloc", "free", "use", "add", "clone", "cat", "matmul", "event", "wait_stream", "sync_stream",
                "sleep", "synchronize", "empty_cache", "gc", "graph", "replay", "del_graph", "pool_new",
                "in_pool", "pool_del", "compile"}
        self.assertEqual(want - kinds, set())

    def test_conf_strings(self):
        seen = set()
        for s in range(2000):
            conf = torchgen.generate(s)["alloc_conf"]
            for item in run.split_conf(conf):
                k, v = item.split(":", 1)
                seen.add(k)
                if k in ("max_split_size_mb", "max_non_split_rounding_mb"):
                    self.assertGreaterEqual(int(v), 20)
                elif k == "garbage_collection_threshold":
                    self.assertTrue(0 < float(v) < 1)
                elif k == "roundup_power2_divisions":
                    if v.startswith("["):
                        self.assertTrue(v.endswith("]"))
                        keys = []
                        for kv in v[1:-1].split(","):
                            a, b = kv.split(":")
                            if a != ">":
                                keys.append(int(a))
                                self.assertEqual(int(a) & (int(a) - 1), 0)
                            self.assertIn(int(b), (0, 1, 2, 4, 8, 16))
                        self.assertEqual(keys, sorted(set(keys)))
                    else:
                        self.assertIn(int(v), (1, 2, 4, 8, 16))
                elif k in ("expandable_segments", "release_lock_on_cudamalloc",
                           "graph_capture_record_stream_reuse", "pinned_use_background_threads"):
                    self.assertIn(v, ("True", "False"))
                else:
                    self.fail("unknown key %r" % k)
        self.assertIn("roundup_power2_divisions", seen)
        self.assertIn("garbage_collection_threshold", seen)
        self.assertIn("expandable_segments", seen)
        self.assertIn("max_split_size_mb", seen)

    def test_sizes(self):
        rng = random.Random(5)
        xs = [torchgen.draw_size(rng, False) for _ in range(20000)]
        under = sum(x < 64 * MiB for x in xs) / len(xs)
        self.assertTrue(0.75 < under < 0.95, under)
        self.assertTrue(any(x % 512 == 0 and x % (2 * MiB) for x in xs))
        self.assertTrue(any(x % (2 * MiB) == 0 for x in xs))
        self.assertTrue(sum(x % 2 for x in xs) / len(xs) > 0.1)
        self.assertTrue(min(xs) < 64 and max(xs) > 256 * MiB)

    def test_valid_by_state(self):
        """Every op refers to what exists where it stands in the
        generated program (before any OOM)."""
        for s in range(400):
            p = torchgen.generate(s)
            live, graphs, pools = set(), set(), set()
            for op in p["ops"]:
                d, u = torchgen.op_refs(op)
                for x in u:
                    self.assertTrue(x in live or x in graphs or x in pools, (s, op))
                k = op["op"]
                if k == "free":
                    live.discard("s%d" % op["slot"])
                elif k == "del_graph":
                    graphs.discard("g%d" % op["graph"])
                    live.discard("s%d" % [q for q in p["ops"] if q["op"] == "graph" and q["graph"] == op["graph"]][0]["input"])
                elif k == "pool_del":
                    pools.discard("p%d" % op["pool"])
                for x in d:
                    (graphs if x[0] == "g" else pools if x[0] == "p" else live).add(x)
                for b in op.get("body", []):
                    bd, bu = torchgen.op_refs(b)
                    if b["op"] == "free":
                        live.discard("s%d" % b["slot"])
                    else:
                        live.update(bd)


class Shrinking(unittest.TestCase):
    def test_remove_closure(self):
        ops = [
            {"op": "malloc", "slot": 0, "bytes": 10, "stream": 0},
            {"op": "add", "slot": 1, "src": 0, "stream": 0},
            {"op": "free", "slot": 0},
            {"op": "cat", "slot": 2, "srcs": [1, 1], "stream": 0},
            {"op": "pool_new", "pool": 0},
            {"op": "in_pool", "pool": 0, "body": [{"op": "malloc", "slot": 3, "bytes": 5},
                                                  {"op": "add", "slot": 4, "src": 1}]},
            {"op": "free", "slot": 3},
            {"op": "graph", "graph": 0, "input": 5, "input_bytes": 1, "pool": {"kind": "own"}, "body": []},
            {"op": "graph", "graph": 1, "input": 6, "input_bytes": 1, "pool": {"kind": "graph", "graph": 0},
             "body": [{"op": "malloc", "slot": 7, "bytes": 3}]},
            {"op": "replay", "graph": 1, "times": 1},
            {"op": "free", "slot": 7},
        ]
        r = run.remove(ops, {(0,)}, torchgen.op_refs)
        self.assertEqual([o["op"] for o in r], ["pool_new", "in_pool", "free", "graph", "graph", "replay", "free"])
        self.assertEqual(r[1]["body"], [{"op": "malloc", "slot": 3, "bytes": 5}])
        r = run.remove(ops, {(4,)}, torchgen.op_refs)
        self.assertNotIn("in_pool", [o["op"] for o in r])
        self.assertEqual(sum(1 for o in r if o["op"] == "free"), 2)
        r = run.remove(ops, {(7,)}, torchgen.op_refs)  # a graph: the graph sharing its pool goes too
        self.assertFalse(any(o["op"] in ("graph", "replay") for o in r))
        self.assertFalse(any(o.get("slot") == 7 for o in r))
        r = run.remove(ops, {(8, 0)}, torchgen.op_refs)  # a body op: the free of what it made goes too
        self.assertEqual(r[-2]["body"], [])
        self.assertEqual(r[-1], {"op": "replay", "graph": 1, "times": 1})
        self.assertEqual(run.remove(ops, set(), torchgen.op_refs), ops)

    def test_split_conf(self):
        self.assertEqual(run.split_conf("a:1, roundup_power2_divisions:[1:2,>:4],b:True"),
                         ["a:1", "roundup_power2_divisions:[1:2,>:4]", "b:True"])
        self.assertEqual(run.split_conf(""), [])

    def test_classify(self):
        c = run.classify
        self.assertEqual(c(0, "x.pickle.gz: identical (31 device calls, 285 mallocs; peaks; policy pytorch, settings default)\n", "")[0], "identical")
        v, first, sig = c(0, "x.pickle.gz: warning: 3 calls the recording does not show were inferred from it; first: event 12\n"
                             "x.pickle.gz: identical (3 device calls, 5 mallocs; policy pytorch, settings default)\n", "", "", "x.pickle.gz")
        self.assertEqual(v, "warned")
        self.assertEqual(sig, "warning: warning: # calls the recording does not show were inferred from it; first: event #")
        v, first, sig = c(1, "x.pickle.gz: diverges at event 17: real allocator: malloc of 1234 bytes at 0x7f00; simulation: placed at 0x7f20 (policy pytorch)\n",
                          "replay: fidelity: 1 of 1 traces diverge from their recording\n")
        self.assertEqual((v, sig), ("failed", "diverges: event #: real allocator: malloc of # bytes at #; simulation: placed at # (policy pytorch)"))
        self.assertTrue(first.startswith("x.pickle.gz: diverges"))
        v, _, sig = c(1, "x.pickle.gz: same device calls and placements, but figures differ from the real allocator's (x.stats.json; policy pytorch):\n"
                         "x.pickle.gz:   peak reserved bytes: real allocator 1820327936, simulation 1818230784\n", "")
        self.assertEqual((v, sig), ("failed", "figures: peak reserved bytes"))
        v, _, sig = c(1, "", "replay: /t/y.pickle.gz: not a PyTorch snapshot (gzip content starts with 67 61)\n")
        self.assertEqual((v, sig), ("failed", "error: replay: /t/y.pickle.gz: not a PyTorch snapshot (gzip content starts with # #)"))
        self.assertEqual(c(-9, "", "", "timeout")[2], "fidelity timeout")
        v, _, sig = c(1, "x: 2 event(s) could not be replayed as recorded (first: free of 0x10 at event 4): not a whole recording (policy pytorch)\n", "", "", "x")
        self.assertEqual(v, "failed")
        self.assertTrue(sig.startswith("anomaly: # event(s)"))


class Running(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.stub, cls.replay = write_fakes(cls.tmp.name)
        cls.env = env_with(cls.stub)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def gen(self, *args):
        return subprocess.run([sys.executable, os.path.join(HERE, "torchgen.py")] + list(args),
                              env=self.env, capture_output=True, text=True, timeout=120)

    def test_programs_run_valid(self):
        out = os.path.join(self.tmp.name, "progs")
        ooms = 0
        for s in range(160):
            r = self.gen("--seed", str(s), "--out", out)
            self.assertEqual(r.returncode, 0, "seed %d: %s" % (s, r.stderr[-3000:]))
            name = "torch_%d" % s
            self.assertFalse(os.path.exists(os.path.join(out, name + ".pickle")))
            with gzip.open(os.path.join(out, name + ".pickle.gz")) as f:
                snap = pickle.load(f)
            with open(os.path.join(out, name + ".stats.json")) as f:
                st = json.load(f)
            with open(os.path.join(out, name + ".prog.json")) as f:
                prog = json.load(f)
            self.assertEqual(prog, torchgen.generate(s) | {"name": name, "trace": name + ".pickle.gz"})
            self.assertEqual(list(st), ["workload", "label", "seed", "alloc_conf", "torch", "cuda", "device", "wall_s",
                                        "mem_cap_bytes", "oom", "ooms_caught", "max_memory_reserved",
                                        "max_memory_allocated", "memory_reserved_end", "memory_allocated_end",
                                        "trace_entries", "memory_stats"])
            self.assertEqual(st["alloc_conf"], prog["alloc_conf"])
            self.assertEqual(st["trace_entries"], len(snap["device_traces"][0]))
            self.assertEqual(st["mem_cap_bytes"], int(prog["cap_bytes"] / (80 << 30) * (80 << 30)) if prog["cap_bytes"] else 0)
            ooms += st["ooms_caught"]
            if not prog["cap_bytes"]:
                self.assertEqual(st["ooms_caught"], 0)
                self.assertLess(st["max_memory_allocated"], 4 * GiB, s)
            if prog["tiny"]:
                self.assertLess(st["max_memory_allocated"], 512 * MiB, s)
        self.assertGreater(ooms, 0)

    def test_subsequences_run_valid(self):
        """Programs with random units dropped (and what depends on them)
        still run without breaking a rule."""
        out = os.path.join(self.tmp.name, "subs")
        os.makedirs(out)
        rng = random.Random(3)
        for s in range(60):
            p = torchgen.generate(1000 + s)
            us = run.units(p["ops"], True)
            drop = set(rng.sample(us, rng.randint(1, max(1, len(us) // 3))))
            p["ops"] = run.remove(p["ops"], drop, torchgen.op_refs)
            path = os.path.join(out, "p%d.json" % s)
            with open(path, "w") as f:
                json.dump(p, f)
            r = self.gen("--seed", "0", "--out", out, "--program", path, "--name", "sub%d" % s)
            self.assertEqual(r.returncode, 0, "program %d: %s" % (s, r.stderr[-3000:]))
            self.assertTrue(os.path.exists(os.path.join(out, "sub%d.pickle.gz" % s)))
            with open(os.path.join(out, "sub%d.prog.json" % s)) as f:
                self.assertEqual(json.load(f)["trace"], "sub%d.pickle.gz" % s)

    def test_failure_exits_nonzero(self):
        out = os.path.join(self.tmp.name, "bad")
        os.makedirs(out)
        path = os.path.join(out, "bad.json")
        with open(path, "w") as f:
            json.dump({"kind": "torch", "alloc_conf": "", "cap_bytes": 0, "streams": 0,
                       "ops": [{"op": "nosuch"}]}, f)
        r = self.gen("--seed", "1", "--out", out, "--program", path)
        self.assertEqual(r.returncode, 1)
        self.assertIn("unknown op", r.stderr)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.path.join(self.tmp.name, "nothing")
        r = subprocess.run([sys.executable, os.path.join(HERE, "torchgen.py"), "--seed", "1", "--out", out],
                           env=env, capture_output=True, text=True)
        if r.returncode != 0:  # no torch here (as on the test machine)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn("cannot import torch", r.stderr)

    def test_driver(self):
        out = os.path.join(self.tmp.name, "drv")
        env = self.env
        r = subprocess.run([sys.executable, os.path.join(HERE, "run.py"), "--out", out, "--replay", self.replay,
                            "--torch", "24", "--cupy", "2", "--jobs", "4", "--seed-base", "100",
                            "--shrink-budget", "60", "--timeout", "60", "--export", out + "-export"],
                           env=env, capture_output=True, text=True, timeout=600)
        with open(os.path.join(out, "summary.json")) as f:
            s = json.load(f)
        self.assertTrue(s["done"])
        self.assertEqual(len(s["programs"]), 24 if not os.path.exists(os.path.join(HERE, "cupygen.py")) else 26)
        k = s["kinds"]["torch"]
        self.assertEqual(k["programs"], 24)
        self.assertEqual(k["crashed"], 0, r.stdout[-3000:])
        self.assertGreater(k["failed"], 0)
        self.assertGreater(k["identical"], 0)
        self.assertEqual(r.returncode, 1)
        self.assertIn("pass rate", r.stdout)
        failed = [p for p in s["programs"] if p["verdict"] == "failed"]
        for p in failed:
            self.assertTrue(p["first_line"].startswith(p["name"] + ".pickle.gz: diverges at event"))
            self.assertTrue(p["signature"].startswith("diverges: event #"))
            size = int(re.search(r"malloc of (\d+) bytes", p["first_line"]).group(1))
            self.assertEqual(bool(p["sim_says"]), size % 2 == 0, p)
        self.assertEqual(k["says_where"], sum(1 for p in failed if p["sim_says"]))
        self.assertEqual(k["silent"], k["failed"] - k["says_where"])
        self.assertIn("says where", r.stdout)
        shr = [p for p in failed if p.get("shrunk", {}).get("prog")]
        self.assertGreater(len(shr), 0, r.stdout[-3000:])
        for p in shr:
            with open(os.path.join(out, p["shrunk"]["prog"])) as f:
                sp = json.load(f)
            self.assertLess(len(sp["ops"]), p["ops"])
            self.assertTrue(os.path.exists(os.path.join(out, p["shrunk"]["trace"])))
            self.assertTrue(os.path.exists(os.path.join(out, "torch", "shrunk", p["name"] + ".stats.json")))
        exp = out + "-export"
        self.assertTrue(os.path.exists(os.path.join(exp, "summary.json")))
        for p in s["programs"]:
            if p["kind"] != "torch":
                continue  # cupygen.py without CuPy here
            self.assertTrue(os.path.exists(os.path.join(exp, "torch", p["name"] + ".prog.json")))
            self.assertEqual(os.path.exists(os.path.join(exp, "torch", p["name"] + ".gen.log")), p["verdict"] != "identical")
        for p in shr:
            self.assertTrue(os.path.exists(os.path.join(exp, p["shrunk"]["prog"])))
        best = min(p["shrunk"]["units_after"] for p in shr)
        self.assertLessEqual(best, 4, r.stdout[-3000:])
        self.assertFalse(os.path.exists(os.path.join(out, "torch", "shrink")) and
                         any(os.listdir(os.path.join(out, "torch", "shrink", d)) for d in os.listdir(os.path.join(out, "torch", "shrink"))))

    def test_driver_timeout_and_missing(self):
        d = os.path.join(self.tmp.name, "hang")
        os.makedirs(d)
        # a generator that hangs, as a kind of its own beside a copy of run.py
        shutil_copy(os.path.join(HERE, "run.py"), os.path.join(d, "run.py"))
        with open(os.path.join(d, "jaxgen.py"), "w") as f:
            f.write("import os, sys, time\nif int(sys.argv[2]) % 2: time.sleep(600)\n"
                    "out = sys.argv[4]; os.makedirs(out, exist_ok=True)\n"
                    "name = sys.argv[6]\nopen(os.path.join(out, name + '.prog.json'), 'w').write('{\"ops\": [], \"trace\": \"' + name + '.xplane.pb.gz\"}')\n"
                    "import gzip, pickle\ngzip.open(os.path.join(out, name + '.xplane.pb.gz'), 'wb').write(pickle.dumps({'device_traces': [[]]}))\n")
        out = os.path.join(d, "out")
        r = subprocess.run([sys.executable, os.path.join(d, "run.py"), "--out", out, "--replay", self.replay,
                            "--jax", "4", "--torch", "3", "--jobs", "4", "--timeout", "3", "--shrink-budget", "5"],
                           capture_output=True, text=True, timeout=120)
        self.assertIn("skip torch", r.stdout)
        with open(os.path.join(out, "summary.json")) as f:
            s = json.load(f)
        v = {p["name"]: p["verdict"] for p in s["programs"]}
        self.assertEqual(v, {"jax_0": "identical", "jax_1": "crashed", "jax_2": "identical", "jax_3": "crashed"})
        self.assertIn("killed (timeout", json.dumps(s))
        self.assertEqual(r.returncode, 1)
        # out of wall time: the hanging programs are skipped, not crashed
        out = os.path.join(d, "out2")
        r = subprocess.run([sys.executable, os.path.join(d, "run.py"), "--out", out, "--replay", self.replay,
                            "--jax", "4", "--jobs", "4", "--timeout", "100", "--max-wall", "26"],
                           capture_output=True, text=True, timeout=120)
        with open(os.path.join(out, "summary.json")) as f:
            s = json.load(f)
        v = {p["name"]: p["verdict"] for p in s["programs"]}
        self.assertEqual(v, {"jax_0": "identical", "jax_1": "skipped", "jax_2": "identical", "jax_3": "skipped"})
        self.assertEqual(r.returncode, 0, r.stdout)


def shutil_copy(a, b):
    with open(a) as f, open(b, "w") as g:
        g.write(f.read())


if __name__ == "__main__":
    unittest.main()

#!/usr/bin/env python3
"""Record PyTorch memory snapshots of allocsim's own workloads under chosen
allocator settings and caps, with the real allocator's figures beside each.

    python3 record.py OUTDIR
    python3 record.py --pools OUTDIR    (the private-pool recordings)
    python3 record.py --profiler OUTDIR (under torch.profiler too)
    python3 record.py --tuned OUTDIR    (the settings replay tune recommends)
    python3 record.py --stacks OUTDIR   (every workload once more, as users record)
    python3 record.py --ddp OUTDIR      (a two-rank DDP job, two processes on one GPU)
    python3 record.py --more-pools OUTDIR (compile_train, serve_prefill, mempools)

Recording is as users record (the README's recipe): PyTorch's defaults,
torch.cuda.memory._record_memory_history(max_entries=1_000_000), so with
context and stacks "all"; with ALLOCSIM_NO_STACKS=1 in the environment as the
recordings under testdata/pytorch/*.pickle.gz were made before (context=None,
no frames). For each run it writes OUTDIR/NAME.pickle.gz
(torch.cuda.memory._dump_snapshot, gzip-compressed) and OUTDIR/NAME.stats.json (max_memory_reserved,
max_memory_allocated, torch.cuda.memory_stats(), the settings string as
alloc_conf and the per-process cap as mem_cap_bytes), in the shape of the
shared trace collection. Every run is a fresh process, so that
PYTORCH_CUDA_ALLOC_CONF is read at start-up and the counters start at zero.
Capped runs take their cap from an uncapped run of the same workload (a
fraction of its peak reserved bytes, at an odd MiB so that no 2 MiB-multiple
segment lands exactly on the cap). OUTDIR/parse.json records how this
PyTorch parses a list of settings strings (the allocator_settings it reports,
or its error).

Workloads (seeded, deterministic in their requests):
  churn  tensors of log-uniform sizes (512 B .. 256 MiB, exact byte counts)
         allocated and freed at random under a live-bytes budget; one in
         eight is made on a side stream and used on the default stream
         (record_stream), so its free completes late; an empty_cache() every
         150 steps; requests that hit an OOM are caught and retried at a
         quarter of the size after freeing half of the live tensors.
  mlp    a 4-layer MLP trained with Adam on batches of 64..4096 rows;
         empty_cache() after steps 3 and 6.
With --pools, the private-pool workloads (CUDA graphs, torch.compile's
cudagraph trees, MemPool, the pending-free retry under a cap): graph_step,
serve_graphs, compile_ro, mempool, pending_retry, each described in its
docstring.
"""
import gzip
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time

MiB = 1 << 20


def churn(torch, rng, steps=520):
    main = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    live = []  # (tensor, bytes)
    live_bytes = 0
    budget = 1536 * MiB
    ooms = []

    def free_some(k):
        nonlocal live_bytes
        for _ in range(k):
            if not live:
                return
            t, n = live.pop(rng.randrange(len(live)))
            live_bytes -= n
            del t

    for step in range(steps):
        if step and step % 150 == 0:
            torch.cuda.empty_cache()
        if live and (live_bytes > budget or rng.random() < 0.42):
            free_some(1)
            continue
        n = int(math.exp(rng.uniform(math.log(512), math.log(256 * MiB))))
        on_side = rng.random() < 0.125
        for attempt in range(2):
            try:
                if on_side:
                    with torch.cuda.stream(side):
                        t = torch.empty(n, dtype=torch.uint8, device="cuda")
                        t.fill_(1)
                    main.wait_stream(side)
                    torch.cuda._sleep(200000)  # keep the default stream busy
                    t.record_stream(main)
                else:
                    t = torch.empty(n, dtype=torch.uint8, device="cuda")
                live.append((t, n))
                live_bytes += n
                break
            except torch.cuda.OutOfMemoryError as e:
                ooms.append(str(e).split(".")[0] + ".")
                free_some(len(live) // 2)
                n //= 4
    del live
    return ooms


def mlp(torch, rng, steps=8):
    nn = torch.nn
    model = nn.Sequential(
        nn.Linear(1024, 3072), nn.GELU(), nn.Linear(3072, 1024), nn.LayerNorm(1024),
        nn.Linear(1024, 3072), nn.GELU(), nn.Linear(3072, 1024),
    ).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(steps):
        rows = rng.randint(64, 4096)
        x = torch.randn(rows, 1024, device="cuda")
        y = torch.randn(rows, 1024, device="cuda")
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del x, y, loss
        if step in (3, 6):
            torch.cuda.empty_cache()
    return []


def _step_mlp(torch):
    nn = torch.nn
    return nn.Sequential(nn.Linear(1024, 2048), nn.GELU(), nn.Linear(2048, 1024)).cuda()


def graph_step(torch, rng, replays=6, eager=3):
    """A whole training step captured in a CUDA graph (the PyTorch docs'
    whole-network capture): warm-up on a side stream, capture (its grads and
    optimizer temporaries go to the graph's private pool), replays on new
    data, the graph dropped, eager steps after, empty_cache at the end."""
    model = _step_mlp(torch)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, capturable=True)
    x = torch.randn(512, 1024, device="cuda")
    y = torch.randn(512, 1024, device="cuda")

    def step():
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            step()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(g):
        loss = step()
    for _ in range(replays):
        x.copy_(torch.randn(512, 1024, device="cuda"))
        y.copy_(torch.randn(512, 1024, device="cuda"))
        g.replay()
    torch.cuda.synchronize()
    del g, loss
    for _ in range(eager):
        opt.zero_grad(set_to_none=True)
        rows = rng.randint(256, 2048)
        xe = torch.randn(rows, 1024, device="cuda")
        ye = torch.randn(rows, 1024, device="cuda")
        torch.nn.functional.mse_loss(model(xe), ye).backward()
        opt.step()
        del xe, ye
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return []


def serve_graphs(torch, rng, steps=40):
    """A serving loop: one CUDA graph per decode batch size, captured largest
    first into one shared pool (graph_pool_handle), replayed between eager
    prefills of random lengths."""
    nn = torch.nn
    model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)).cuda()
    pool = torch.cuda.graph_pool_handle()
    graphs = {}
    side = torch.cuda.Stream()
    with torch.no_grad():
        for bs in (64, 32, 16, 8):
            x = torch.randn(bs, 1024, device="cuda")
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                model(x)
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                out = model(x)
            graphs[bs] = (g, x, out)
        for _ in range(steps):
            p = model(torch.randn(rng.randint(100, 3000), 1024, device="cuda"))
            del p
            bs = rng.choice((8, 16, 32, 64))
            g, x, out = graphs[bs]
            x.copy_(torch.randn(bs, 1024, device="cuda"))
            g.replay()
    torch.cuda.synchronize()
    return []


def compile_ro(torch, rng):
    """torch.compile(mode="reduce-overhead") (cudagraph trees) fed several
    batch sizes, each compiled and recorded once, then replayed."""
    model = _step_mlp(torch)
    cm = torch.compile(model, mode="reduce-overhead", dynamic=False)
    with torch.no_grad():
        for bs in (8, 32, 16, 32, 8, 16, 8):
            for _ in range(3):
                out = cm(torch.randn(bs, 1024, device="cuda"))
            out = out.clone()
            del out
    torch.cuda.synchronize()
    return []


def mempool(torch, rng, rounds=3):
    """MemPool and use_mem_pool: each round makes a pool, allocates into it
    and into the default pool, frees half, allocates into it again (reusing
    its blocks), frees everything, deletes the pool and calls empty_cache."""
    MB = MiB
    for _ in range(rounds):
        pool = torch.cuda.MemPool()
        with torch.cuda.use_mem_pool(pool):
            ts = [torch.empty(rng.randint(1, 64 * MB), dtype=torch.uint8, device="cuda") for _ in range(16)]
        ds = [torch.empty(rng.randint(1, 64 * MB), dtype=torch.uint8, device="cuda") for _ in range(8)]
        del ts[::2]
        with torch.cuda.use_mem_pool(pool):
            ts += [torch.empty(rng.randint(1, 32 * MB), dtype=torch.uint8, device="cuda") for _ in range(8)]
            ts += [torch.empty(rng.randint(1, 4096), dtype=torch.uint8, device="cuda") for _ in range(8)]
        del ts, ds
        del pool
        torch.cuda.empty_cache()
    return []


def pending_retry(torch, rng):
    """A malloc under a cap that fails while a fitting block's free is still
    pending on another stream (record_stream; pytorch#189504): the allocator
    synchronizes its events, the free completes, the cached block is
    released and the malloc retried (num_alloc_retries 1)."""
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(1 << 29)  # about 0.3 s: the free waits for it
        a.record_stream(side)
    del a
    b = torch.empty(n, dtype=torch.uint8, device="cuda")
    del b
    torch.cuda.synchronize()
    return []


def train(torch, rng, steps=4):
    """A small decoder-only transformer (4 layers, d=512) trained with AdamW
    under bf16 autocast for a few steps of random batch and sequence length:
    the job of the README's recording recipe."""
    nn = torch.nn
    d, vocab = 512, 8192
    layer = nn.TransformerEncoderLayer(d, 8, 4 * d, batch_first=True, norm_first=True)
    model = nn.Sequential(nn.Embedding(vocab, d), nn.TransformerEncoder(layer, 4), nn.Linear(d, vocab)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for _ in range(steps):
        b, t = rng.choice((4, 6, 8)), rng.choice((256, 384, 512))
        x = torch.randint(0, vocab, (b, t), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(x)
            loss = torch.nn.functional.cross_entropy(logits.float().view(-1, vocab), x.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del x, logits, loss
    return []


def compile_train(torch, rng, steps=14):
    """torch.compile(mode="reduce-overhead") of a training step (forward,
    backward, AdamW) fed several batch sizes, so that cudagraph trees
    record a graph per shape and replay them, and re-record when a shape
    comes back after another."""
    model = _step_mlp(torch)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def fwd(x):
        return model(x).square().mean()

    cf = torch.compile(fwd, mode="reduce-overhead", dynamic=False)
    for _ in range(steps):
        bs = rng.choice((64, 128, 256, 512))
        loss = cf(torch.randn(bs, 1024, device="cuda"))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del loss
    torch.cuda.synchronize()
    return []


def serve_prefill(torch, rng, steps=60):
    """Serving with large eager prefills between decode graphs: one CUDA
    graph per decode batch size captured into one shared pool, smallest
    first, each replayed between prefills of 1..16k tokens whose
    activations dwarf the decode's."""
    nn = torch.nn
    model = nn.Sequential(nn.Linear(2048, 8192), nn.GELU(), nn.Linear(8192, 2048)).cuda().half()
    pool = torch.cuda.graph_pool_handle()
    graphs = {}
    side = torch.cuda.Stream()
    with torch.no_grad():
        for bs in (1, 2, 4, 8, 16, 32):
            x = torch.randn(bs, 2048, device="cuda", dtype=torch.half)
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                model(x)
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                out = model(x)
            graphs[bs] = (g, x, out)
        kept = []
        for _ in range(steps):
            p = model(torch.randn(rng.randint(1, 16384), 2048, device="cuda", dtype=torch.half))
            kept.append(p[:1].clone())
            del p
            if len(kept) > 8:
                kept.pop(0)
            bs = rng.choice(tuple(graphs))
            g, x, out = graphs[bs]
            x.copy_(torch.randn(bs, 2048, device="cuda", dtype=torch.half))
            g.replay()
            if rng.random() < 0.1:
                torch.cuda.empty_cache()
        del graphs[32]
    torch.cuda.synchronize()
    return []


def mempools(torch, rng, rounds=8):
    """Several MemPools alive at once, created, used and deleted in an
    interleaved order, with default-pool tensors and empty_cache() calls
    between (some while pools are alive, some after a pool is deleted)."""
    MB = MiB
    pools = []
    keep = []
    for r in range(rounds):
        if len(pools) < 3 or rng.random() < 0.5:
            pool = torch.cuda.MemPool()
            with torch.cuda.use_mem_pool(pool):
                ts = [torch.empty(rng.randint(1, 96 * MB), dtype=torch.uint8, device="cuda") for _ in range(rng.randint(4, 12))]
            pools.append((pool, ts))
        keep += [torch.empty(rng.randint(1, 48 * MB), dtype=torch.uint8, device="cuda") for _ in range(4)]
        if len(keep) > 10:
            del keep[:5]
        pool, ts = pools[rng.randrange(len(pools))]
        del ts[::2]
        with torch.cuda.use_mem_pool(pool):
            ts += [torch.empty(rng.randint(1, 128 * MB), dtype=torch.uint8, device="cuda") for _ in range(4)]
        if rng.random() < 0.5:
            torch.cuda.empty_cache()
        if len(pools) > 2:
            i = rng.randrange(len(pools))
            pool, ts = pools.pop(i)
            del ts[:]
            del pool, ts
            if rng.random() < 0.7:
                torch.cuda.empty_cache()
    del pools, keep
    torch.cuda.empty_cache()
    return []


WORKLOADS = {"churn": churn, "mlp": mlp, "graph_step": graph_step, "serve_graphs": serve_graphs,
             "compile_ro": compile_ro, "mempool": mempool, "pending_retry": pending_retry, "train": train,
             "compile_train": compile_train, "serve_prefill": serve_prefill, "mempools": mempools}


def child(workload, label, cap, outdir, seed):
    import torch
    torch.cuda.init()
    total = torch.cuda.mem_get_info()[1]
    cap_bytes = 0
    if cap:
        frac = cap / total
        torch.cuda.set_per_process_memory_fraction(frac, 0)
        cap_bytes = int(frac * total)
    if os.environ.get("ALLOCSIM_NO_STACKS"):
        # The form of the recordings made before stop 30 (no frames).
        torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python", max_entries=1 << 20)
    else:
        # As users record (the README's recipe): PyTorch's defaults,
        # context "all" and stacks "all" (Python and C++ frames).
        torch.cuda.memory._record_memory_history(max_entries=1_000_000)
    rng = random.Random(seed)
    prof = None
    if os.environ.get("ALLOCSIM_PROFILE"):
        # torch.profiler with profile_memory=True around the same run: its
        # Chrome trace (the [memory] events) beside the snapshot.
        from torch.profiler import ProfilerActivity, profile
        prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], profile_memory=True)
        prof.__enter__()
    t0 = time.time()
    ooms = WORKLOADS[workload](torch, rng)
    torch.cuda.synchronize()
    wall = time.time() - t0
    if prof is not None:
        prof.__exit__(None, None, None)
        tmp = os.path.join(outdir, label + ".pt.trace.json")
        prof.export_chrome_trace(tmp)
        with open(tmp, "rb") as fin, gzip.open(tmp + ".gz", "wb") as fout:
            fout.write(fin.read())
        os.remove(tmp)
    path = os.path.join(outdir, label)
    torch.cuda.memory._dump_snapshot(path + ".pickle")
    with open(path + ".pickle", "rb") as fin, gzip.open(path + ".pickle.gz", "wb") as fout:
        fout.write(fin.read())
    os.remove(path + ".pickle")
    snap = torch.cuda.memory._snapshot()
    stats = {
        "workload": workload,
        "label": label,
        "seed": seed,
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(0),
        "wall_s": wall,
        "mem_cap_bytes": cap_bytes,
        "oom": ooms[0] if ooms else "",
        "ooms_caught": len(ooms),
        "max_memory_reserved": torch.cuda.max_memory_reserved(),
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
        "memory_reserved_end": torch.cuda.memory_reserved(),
        "memory_allocated_end": torch.cuda.memory_allocated(),
        "trace_entries": len(snap["device_traces"][0]),
        "memory_stats": dict(torch.cuda.memory_stats()),
    }
    with open(path + ".stats.json", "w") as f:
        json.dump(stats, f, indent=1, sort_keys=False)
    print(label, {k: stats[k] for k in ("max_memory_reserved", "max_memory_allocated", "mem_cap_bytes", "ooms_caught", "trace_entries")},
          {k: stats["memory_stats"].get(k) for k in ("num_device_alloc", "num_device_free", "num_alloc_retries", "num_ooms")}, flush=True)
    return stats


PARSE_PROBES = [
    "max_split_size_mb:64",
    "max_split_size_mb:20",
    "max_split_size_mb:19",
    "max_split_size_mb:abc",
    "max_split_size_mb : 128 , roundup_power2_divisions:4",
    "roundup_power2_divisions:[64:8,256:4,>:1]",
    "roundup_power2_divisions:[>:2]",
    "roundup_power2_divisions:[1:4,2:8]",
    "roundup_power2_divisions:[3:4]",
    "roundup_power2_divisions:[64:3]",
    "roundup_power2_divisions:3",
    "roundup_power2_divisions:[128:2,",
    "garbage_collection_threshold:0.6",
    "garbage_collection_threshold:1.0",
    "garbage_collection_threshold:0",
    "expandable_segments:True",
    "expandable_segments:true",
    "expandable_segments:False",
    "max_non_split_rounding_mb:64",
    "max_non_split_rounding_mb:10",
    "unknown_key:1",
    "max_split_size_mb",
    "max_split_size_mb:128;expandable_segments:True",
    "max_split_size_mb:128,,expandable_segments:True",
    "backend:native",
    "backend:cudaMallocAsync",
    "release_lock_on_cudamalloc:True",
    "pinned_use_background_threads:True",
    "max_split_size_mb:128,",
    "",
]


def probe(outdir):
    import torch
    torch.cuda.init()
    out = []
    for s in PARSE_PROBES:
        rec = {"conf": s}
        try:
            torch.cuda.memory._set_allocator_settings(s)
            rec["settings"] = torch.cuda.memory._snapshot()["allocator_settings"]
        except Exception as e:  # noqa: BLE001
            rec["error"] = type(e).__name__ + ": " + str(e).splitlines()[0]
        out.append(rec)
        try:
            torch.cuda.memory._set_allocator_settings("expandable_segments:False,max_non_split_rounding_mb:20")
        except Exception:  # noqa: BLE001
            pass
    with open(os.path.join(outdir, "parse.json"), "w") as f:
        json.dump(out, f, indent=1, default=str)


def spawn(outdir, workload, label, conf="", cap=0, seed=7, profile=False):
    env = dict(os.environ)
    env.pop("ALLOCSIM_PROFILE", None)
    if profile:
        env["ALLOCSIM_PROFILE"] = "1"
    env.pop("PYTORCH_ALLOC_CONF", None)
    if conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = conf
    else:
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    r = subprocess.run([sys.executable, __file__, "--child", workload, label, str(cap), outdir, str(seed)],
                       env=env, capture_output=True, text=True)
    sys.stdout.write(r.stdout)
    if r.returncode != 0:
        sys.stdout.write(r.stderr[-3000:])
        return None
    with open(os.path.join(outdir, label + ".stats.json")) as f:
        return json.load(f)


def pools(outdir):
    """The private-pool recordings: CUDA graphs, torch.compile's cudagraph
    trees, MemPool, and the pending-free retry under a cap."""
    os.makedirs(outdir, exist_ok=True)
    spawn(outdir, "graph_step", "graph_step")
    spawn(outdir, "graph_step", "graph_step_expandable", "expandable_segments:True")
    spawn(outdir, "serve_graphs", "serve_graphs")
    spawn(outdir, "mempool", "mempool")
    spawn(outdir, "pending_retry", "pending_retry", "", odd_mib(1.5 * (1 << 30)))
    spawn(outdir, "compile_ro", "compile_ro")


def profiled(outdir):
    """The torch.profiler recordings: each workload run once under
    torch.profiler.profile(profile_memory=True), its Chrome trace written as
    NAME.pt.trace.json.gz beside the snapshot and stats.json of the same
    run (the profiler's [memory] events and the allocator's history of one
    process)."""
    os.makedirs(outdir, exist_ok=True)
    spawn(outdir, "mlp", "prof_mlp", profile=True)
    spawn(outdir, "mlp", "prof_mlp_expandable", "expandable_segments:True", profile=True)
    base = spawn(outdir, "churn", "prof_churn", profile=True)
    r = base["max_memory_reserved"] if base else 3 << 30
    spawn(outdir, "churn", "prof_churn_oom", "", odd_mib(0.45 * r), profile=True)


# TUNED are the settings `replay tune` recommends for four of the recordings
# above (label, workload, recommended setting, the recording's cap in
# bytes), run again on the card to compare its prediction with the real
# allocator.
TUNED = [
    ("tuned_mlp", "mlp", "expandable_segments:True", 0),
    ("tuned_churn", "churn", "roundup_power2_divisions:16,expandable_segments:True", 0),
    ("tuned_churn_maxsplit", "churn", "max_split_size_mb:64,garbage_collection_threshold:0.6", 1271922688),
    ("tuned_churn_oom", "churn", "expandable_segments:True", 818937856),
]


def tuned(outdir):
    """The recommended settings of `replay tune`, run (TUNED)."""
    os.makedirs(outdir, exist_ok=True)
    for label, workload, conf, cap in TUNED:
        spawn(outdir, workload, label, conf, cap)


def stacks(outdir):
    """Every workload recorded again as users record (PyTorch's defaults:
    context and stacks "all"), the README's recipe on the train job among
    them."""
    os.makedirs(outdir, exist_ok=True)
    spawn(outdir, "train", "readme_train")
    base = spawn(outdir, "churn", "churn")
    r = base["max_memory_reserved"] if base else 3 << 30
    spawn(outdir, "churn", "churn_oom", "", odd_mib(0.45 * r))
    spawn(outdir, "churn", "churn_mixed",
          "max_split_size_mb:128, roundup_power2_divisions:[64:8,256:4,>:1], garbage_collection_threshold:0.7", odd_mib(0.8 * r))
    spawn(outdir, "churn", "churn_expandable", "expandable_segments:True")
    spawn(outdir, "mlp", "mlp")
    spawn(outdir, "graph_step", "graph_step")
    spawn(outdir, "serve_graphs", "serve_graphs")
    spawn(outdir, "compile_ro", "compile_ro")
    spawn(outdir, "mempool", "mempool")
    spawn(outdir, "pending_retry", "pending_retry", "", odd_mib(1.5 * (1 << 30)))
    more_pools(outdir)


def more_pools(outdir):
    """The private-pool kinds that a replay got wrong on recordings made
    outside this script (issue 31): compile_train, serve_prefill and
    mempools, two seeds each."""
    os.makedirs(outdir, exist_ok=True)
    for seed in (7, 8):
        spawn(outdir, "compile_train", "compile_train_s%d" % seed, seed=seed)
        spawn(outdir, "serve_prefill", "serve_prefill_s%d" % seed, seed=seed)
        spawn(outdir, "mempools", "mempools_s%d" % seed, seed=seed)


def ddp_rank(rank, world, outdir, initfile):
    """One rank of a two-rank DistributedDataParallel job on one GPU (gloo:
    NCCL refuses two ranks on one device), recorded as users record."""
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method="file://" + initfile, rank=rank, world_size=world)
    torch.cuda.set_device(0)
    torch.cuda.memory._record_memory_history(max_entries=1_000_000)
    nn = torch.nn
    model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)).cuda()
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
    rng = random.Random(100 + rank)
    for _ in range(5):
        x = torch.randn(rng.randint(256, 4096), 1024, device="cuda")
        ddp(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del x
    torch.cuda.synchronize()
    dist.barrier()
    label = "ddp_rank%d" % rank
    path = os.path.join(outdir, label)
    torch.cuda.memory._dump_snapshot(path + ".pickle")
    with open(path + ".pickle", "rb") as fin, gzip.open(path + ".pickle.gz", "wb") as fout:
        fout.write(fin.read())
    os.remove(path + ".pickle")
    stats = {"workload": "ddp", "label": label, "rank": rank, "world_size": world, "alloc_conf": "",
             "torch": torch.__version__, "cuda": torch.version.cuda, "device": torch.cuda.get_device_name(0),
             "mem_cap_bytes": 0, "oom": "", "ooms_caught": 0,
             "max_memory_reserved": torch.cuda.max_memory_reserved(),
             "max_memory_allocated": torch.cuda.max_memory_allocated(),
             "memory_reserved_end": torch.cuda.memory_reserved(),
             "memory_allocated_end": torch.cuda.memory_allocated(),
             "trace_entries": len(torch.cuda.memory._snapshot()["device_traces"][0]),
             "memory_stats": dict(torch.cuda.memory_stats())}
    with open(path + ".stats.json", "w") as f:
        json.dump(stats, f, indent=1)
    dist.destroy_process_group()


def ddp(outdir):
    """The two-rank job: each rank a process of its own on the one GPU."""
    os.makedirs(outdir, exist_ok=True)
    initfile = os.path.join(tempfile.mkdtemp(), "init")
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    procs = [subprocess.Popen([sys.executable, __file__, "--ddp-rank", str(r), "2", outdir, initfile], env=env)
             for r in range(2)]
    for p in procs:
        if p.wait() != 0:
            print("ddp rank failed with exit code", p.returncode, flush=True)


def odd_mib(x):
    return (int(x) // (2 * MiB)) * 2 * MiB + MiB


def main():
    if sys.argv[1] == "--child":
        _, _, workload, label, cap, outdir, seed = sys.argv
        child(workload, label, int(cap), outdir, int(seed))
        return
    if sys.argv[1] == "--ddp-rank":
        ddp_rank(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
        return
    if sys.argv[1] == "--ddp":
        ddp(sys.argv[2])
        return
    if sys.argv[1] == "--more-pools":
        more_pools(sys.argv[2])
        return
    if sys.argv[1] == "--stacks":
        stacks(sys.argv[2])
        return
    if sys.argv[1] == "--probe":
        probe(sys.argv[2])
        return
    if sys.argv[1] == "--tuned":
        tuned(sys.argv[2])
        return
    if sys.argv[1] == "--profiler":
        profiled(sys.argv[2])
        return
    if sys.argv[1] == "--pools":
        pools(sys.argv[2])
        return
    outdir = sys.argv[1]
    os.makedirs(outdir, exist_ok=True)
    base = spawn(outdir, "churn", "churn")
    r = base["max_memory_reserved"] if base else 3 << 30
    spawn(outdir, "churn", "churn_maxsplit", "max_split_size_mb:64", odd_mib(0.7 * r))
    spawn(outdir, "churn", "churn_roundup", "roundup_power2_divisions:4")
    spawn(outdir, "churn", "churn_mixed",
          "max_split_size_mb:128, roundup_power2_divisions:[64:8,256:4,>:1], max_non_split_rounding_mb:40", odd_mib(0.8 * r))
    spawn(outdir, "churn", "churn_gc", "garbage_collection_threshold:0.6", odd_mib(0.8 * r))
    spawn(outdir, "churn", "churn_oom", "", odd_mib(0.45 * r))
    exp = spawn(outdir, "churn", "churn_expandable", "expandable_segments:True")
    re_ = exp["max_memory_reserved"] if exp else r
    spawn(outdir, "churn", "churn_expandable_capped", "expandable_segments:True", odd_mib(0.75 * re_))
    spawn(outdir, "mlp", "mlp")
    spawn(outdir, "mlp", "mlp_expandable", "expandable_segments:True,garbage_collection_threshold:0.5", 0)
    subprocess.run([sys.executable, __file__, "--probe", outdir])


if __name__ == "__main__":
    main()

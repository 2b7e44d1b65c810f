#!/usr/bin/env python3
"""Record CuPy memory-pool logs of allocsim's own workloads, with the pool's
real figures beside each.

    python3 record.py OUTDIR

For each run (a fresh process, so the pool starts empty) it writes
OUTDIR/NAME.jsonl, the lines cupy.cuda.memory_hooks.DebugPrintHook prints
(one JSON object per device alloc, pool malloc and pool free), and
OUTDIR/NAME.stats.json: the peak of the pool's total_bytes() (read in the
hooks after every device alloc and pool malloc, so no peak is missed), the
number of device allocs, used_bytes() and total_bytes() at the end, the
pool's limit, the OOMs the workload caught and the versions.

Workloads (seeded, deterministic in their requests):
  churn    arrays of log-uniform sizes (1 B .. 64 MiB, exact byte counts)
           allocated and freed at random under a live-bytes budget; one in
           four is made on a side stream (CuPy's pool keeps free chunks per
           stream).
  linalg   matmul, FFT, reductions and elementwise kernels on float32
           matrices of varying shapes (cuBLAS and cuFFT work areas come
           from the pool).
  churn_single  churn with every array on the default stream.
  churn_limit  churn under pool.set_limit() at 45% of churn's peak: the pool
           frees its cached blocks and retries before raising
           OutOfMemoryError; the workload catches it and frees half of its
           arrays.
"""
import json
import math
import os
import random
import subprocess
import sys

MiB = 1 << 20


def churn(cp, rng, steps=600, budget=768 * MiB, side_share=0.25):
    side = cp.cuda.Stream(non_blocking=True)
    live = []
    live_bytes = 0
    ooms = []
    for step in range(steps):
        n = int(math.exp(rng.uniform(0, math.log(64 * MiB))))
        while live and live_bytes + n > budget:
            a, b = live.pop(rng.randrange(len(live)))
            live_bytes -= b
            del a
        on_side = rng.random() < side_share
        try:
            if on_side:
                with side:
                    a = cp.empty(n, dtype=cp.uint8)
            else:
                a = cp.empty(n, dtype=cp.uint8)
        except cp.cuda.memory.OutOfMemoryError as e:
            ooms.append("step %d: %d bytes: %s" % (step, n, str(e).splitlines()[0]))
            for _ in range(len(live) // 2):
                a, b = live.pop(rng.randrange(len(live)))
                live_bytes -= b
                del a
            continue
        live.append((a, n))
        live_bytes += n
        if rng.random() < 0.3 and live:
            a, b = live.pop(rng.randrange(len(live)))
            live_bytes -= b
            del a
    del live
    cp.cuda.Device().synchronize()
    return ooms


def linalg(cp, rng, steps=40):
    keep = []
    for step in range(steps):
        m = rng.choice([256, 512, 1000, 1536, 2048, 3000])
        k = rng.choice([128, 512, 1024, 2500])
        a = cp.random.standard_normal((m, k), dtype=cp.float32)
        b = cp.random.standard_normal((k, m), dtype=cp.float32)
        c = a @ b
        f = cp.fft.rfft(c, axis=1)
        s = cp.abs(f).sum(axis=0)
        d = cp.tanh(c) * 0.5 + c.mean()
        if step % 5 == 0:
            keep.append(s)
        if len(keep) > 4:
            keep.pop(0)
        del a, b, c, f, d, s
    del keep
    cp.cuda.Device().synchronize()
    return []


def churn_single(cp, rng):
    return churn(cp, rng, side_share=0)


WORKLOADS = {"churn": churn, "linalg": linalg, "churn_limit": churn, "churn_single": churn_single}


def child(workload, label, limit, outdir, seed):
    import cupy as cp
    from cupy.cuda import memory_hooks

    pool = cp.get_default_memory_pool()
    if limit:
        pool.set_limit(size=limit)

    class Peak(cp.cuda.MemoryHook):
        name = "allocsim-peak"

        def __init__(self):
            self.peak = 0
            self.allocs = 0
            self.alloc_bytes = 0

        def alloc_postprocess(self, **kw):
            self.allocs += 1
            self.alloc_bytes += kw["mem_size"]
            self.peak = max(self.peak, pool.total_bytes())

        def malloc_postprocess(self, **kw):
            self.peak = max(self.peak, pool.total_bytes())

    peak = Peak()
    rng = random.Random(seed)
    path = os.path.join(outdir, label)
    with open(path + ".jsonl", "w") as log:
        with memory_hooks.DebugPrintHook(file=log, flush=False), peak:
            ooms = WORKLOADS[workload](cp, rng)
    stats = {
        "workload": workload,
        "label": label,
        "seed": seed,
        "cupy": cp.__version__,
        "cuda_runtime": cp.cuda.runtime.runtimeGetVersion(),
        "device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
        "limit_bytes": pool.get_limit(),
        "peak_total_bytes": peak.peak,
        "device_allocs": peak.allocs,
        "device_alloc_bytes": peak.alloc_bytes,
        "used_bytes_end": pool.used_bytes(),
        "total_bytes_end": pool.total_bytes(),
        "n_free_blocks_end": pool.n_free_blocks(),
        "ooms_caught": len(ooms),
        "ooms": ooms[:5],
    }
    with open(path + ".stats.json", "w") as f:
        json.dump(stats, f, indent=1)
    print(label, {k: stats[k] for k in ("peak_total_bytes", "device_allocs", "used_bytes_end", "total_bytes_end", "ooms_caught")}, flush=True)
    return stats


def spawn(outdir, workload, label, limit=0, seed=11):
    r = subprocess.run([sys.executable, __file__, "--child", workload, label, str(limit), outdir, str(seed)],
                       capture_output=True, text=True)
    sys.stdout.write(r.stdout)
    if r.returncode != 0:
        sys.stdout.write(r.stderr[-3000:])
        return None
    with open(os.path.join(outdir, label + ".stats.json")) as f:
        return json.load(f)


def main():
    if sys.argv[1] == "--child":
        _, _, workload, label, limit, outdir, seed = sys.argv
        child(workload, label, int(limit), outdir, int(seed))
        return
    outdir = sys.argv[1]
    os.makedirs(outdir, exist_ok=True)
    base = spawn(outdir, "churn", "churn")
    spawn(outdir, "linalg", "linalg")
    spawn(outdir, "churn_single", "churn_single")
    p = base["peak_total_bytes"] if base else 1 << 30
    spawn(outdir, "churn_limit", "churn_limit", int(0.45 * p) // MiB * MiB + 12345)


if __name__ == "__main__":
    main()

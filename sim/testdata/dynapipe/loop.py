"""Times DynaPipe's Python port of PyTorch's caching allocator on a list of
mallocs and frees, for the loop-against-loop comparison of `make bench`
(sim/bench_test.go, BenchmarkReplayMallocFree).

usage: python3 loop.py SIMULATOR OPS [REPS]

SIMULATOR is dynapipe/memory_opt/allocation_simulator.py of a checkout of
github.com/awslabs/optimizing-multitask-training-through-dynamic-pipelines
(it needs the sortedcontainers package); OPS a file of one op per line,
"m SIZE" (a malloc of SIZE bytes on the default stream) or "f K" (the free
of the block of the K-th op, a malloc). The simulator is run with PyTorch's
small-pool boundary (kSmallSize 1 MiB; DynaPipe's default 0 puts every
block in the large pool) and no memory limit. Prints one JSON line: the
best of REPS (default 3) runs of the loop alone in nanoseconds per op, and
the simulator's peak reserved bytes and device mallocs, to be compared with
the pytorch policy's.
"""

import importlib.util
import json
import sys
import time


def main():
    path, ops_path = sys.argv[1], sys.argv[2]
    reps = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    spec = importlib.util.spec_from_file_location("dynapipe_allocation_simulator", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)

    sizes, frees = [], []
    with open(ops_path) as f:
        for line in f:
            kind, arg = line.split()
            if kind == "m":
                sizes.append(int(arg))
                frees.append(-1)
            else:
                sizes.append(0)
                frees.append(int(arg))
    ops = list(zip(sizes, frees))

    cfg = mod.TorchCachingAllocatorConfig(kSmallSize=1 << 20)
    best, sim = None, None
    for _ in range(reps):
        sim = mod.TorchCachingAllocatorSimulator(1e15, cfg)
        blocks = [None] * len(ops)
        malloc, free = sim.malloc, sim.free
        start = time.perf_counter()
        for k, (size, of) in enumerate(ops):
            if of < 0:
                blocks[k] = malloc(size)
            else:
                free(blocks[of])
        elapsed = time.perf_counter() - start
        best = elapsed if best is None else min(best, elapsed)
    print(json.dumps({
        "ops": len(ops),
        "ns_per_op": best / len(ops) * 1e9,
        "peak_reserved": sim.peak_backend_allocated_bytes,
        "device_mallocs": sim.n_backend_mallocs,
    }))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Writes a large synthetic PyTorch memory snapshot, for the import benchmark.

    python3 bigsnap.py [-o PATH] [--mb 1024 | --entries N] [--seed 1]

writes PATH (default: $TMPDIR/allocsim-big-snapshot.pickle), an uncompressed
pickle of about --mb MiB, and prints its size and entry count (1 GiB: about
5.9 million entries, a minute and 4.5 GB of memory here). `make bigsnap` runs
it; the benchmark BenchmarkImportBig (sim/bigsnap_bench_test.go) reads that
path, or $ALLOCSIM_BIG_SNAPSHOT.

The snapshot is built as Python objects and written by pickle.dump (protocol
4, as torch.cuda.memory._dump_snapshot writes one with Python 3.8 to 3.13),
shaped like a real snapshot recorded with stacks (context and stacks "all";
see ../../../../shared/traces/pytorch_stacks/readme_job.pickle.gz):

- a dict of segments, device_traces, allocator_settings and
  external_annotations, in that order;
- entries {action, addr, size, stream, time_us, compile_context,
  user_metadata, frames}, whose compile_context is a new string each time
  (written in full every time) and whose action strings and keys are shared;
- frame dicts {name, filename, line} shared by every stack that holds the
  frame, so that after the first time the pickle refers to each through its
  memo; an alloc's frames list is its own, which the segment_alloc that
  precedes it shares, and a free's list (its own frames) is shared by its
  free_requested and free_completed, which follow one another.

The trace is a training loop that the importer takes as consistent: blocks
packed into 1 GiB segments allocated as first needed, each step's blocks freed
in reverse order, the last step's left allocated; the final segments hold
those blocks (their frames are their allocs' lists again) and the free space
between them.
"""
import argparse
import os
import pickle
import random
import sys
import tempfile

SEG_BASE = 0x7F0000000000
SEG_SIZE = 1 << 30
SEGMENTS = 16


def round512(n):
    return max(512, (n + 511) // 512 * 512)


class Builder:
    def __init__(self, seed):
        self.rng = random.Random(seed)
        rng = self.rng
        # Frame dicts, each one object shared by every stack that holds it.
        cpp = [{"name": "c10::op_%d(at::Tensor const&, long)" % i, "filename": "??", "line": 0} for i in range(2500)]
        py = [{"name": "layer_%d" % i, "filename": "/home/user/project/model_%d.py" % (i % 40), "line": 10 + i}
              for i in range(1500)]
        head = [{"name": "unwind_frame_%d" % i, "filename": "??", "line": 0} for i in range(3)]
        self.frames = cpp + py + head

        def template(n_cpp, n_py):
            return head + rng.sample(cpp, n_cpp) + rng.sample(py, n_py)
        self.alloc_templates = [template(rng.randint(8, 50), rng.randint(3, 30)) for _ in range(400)]
        self.free_templates = [template(rng.randint(5, 15), rng.randint(1, 6)) for _ in range(40)]
        self.entries = []
        self.t = 1796283533893603
        self.live_segments = set()

    def entry(self, action, addr, size, frames):
        self.t += self.rng.randint(1, 40)
        e = {
            "action": action,
            "addr": addr,
            "size": size,
            "stream": 0,
            "time_us": self.t,
            "compile_context": "".join(("N/", "A")),  # a new string each time, as PyTorch's
            "user_metadata": "",
            "frames": frames,
        }
        self.entries.append(e)
        return e

    def step(self, n_blocks):
        """Allocates n_blocks blocks packed from the first segment up and
        returns them as (addr, size, block_size, frames)."""
        rng = self.rng
        blocks = []
        seg, off = 0, 0
        for _ in range(n_blocks):
            # Log-uniform sizes from 512 B to 64 MiB.
            size = int(2 ** rng.uniform(9, 26))
            bs = round512(size)
            if off + bs > SEG_SIZE:
                seg, off = seg + 1, 0
                if seg == SEGMENTS:
                    break
            addr = SEG_BASE + seg * (2 * SEG_SIZE) + off
            frames = list(rng.choice(self.alloc_templates))  # an alloc's own list
            if seg not in self.live_segments:
                self.live_segments.add(seg)
                self.entry("segment_alloc", SEG_BASE + seg * (2 * SEG_SIZE), SEG_SIZE, frames)
            self.entry("alloc", addr, size, frames)
            blocks.append((addr, size, bs, frames))
            off += bs
        return blocks

    def free(self, blocks):
        for addr, size, _, _ in reversed(blocks):
            frames = list(self.rng.choice(self.free_templates))
            self.entry("free_requested", addr, size, frames)
            self.entry("free_completed", addr, size, frames)

    def build(self, n_entries):
        rng = self.rng
        last = []
        while len(self.entries) < n_entries:
            if last:
                self.free(last)
            last = self.step(rng.randint(16, 96))
        return last

    def snapshot(self, live):
        segments = []
        by_seg = {}
        for addr, size, bs, frames in live:
            by_seg.setdefault((addr - SEG_BASE) // (2 * SEG_SIZE), []).append((addr, size, bs, frames))
        for seg in sorted(self.live_segments):
            base = SEG_BASE + seg * (2 * SEG_SIZE)
            blocks, at, allocated, requested = [], base, 0, 0
            for addr, size, bs, frames in by_seg.get(seg, []):
                if addr > at:
                    blocks.append({"address": at, "size": addr - at, "requested_size": 0, "state": "inactive", "frames": []})
                blocks.append({"address": addr, "size": bs, "requested_size": size, "state": "active_allocated", "frames": frames})
                allocated += bs
                requested += size
                at = addr + bs
            if at < base + SEG_SIZE:
                blocks.append({"address": at, "size": base + SEG_SIZE - at, "requested_size": 0, "state": "inactive", "frames": []})
            segments.append({
                "device": 0, "address": base, "total_size": SEG_SIZE, "allocated_size": allocated,
                "active_size": allocated, "requested_size": requested, "stream": 0, "segment_type": "large",
                "segment_pool_id": (0, 0), "is_expandable": False, "frames": [], "blocks": blocks,
            })
        return {
            "segments": segments,
            "device_traces": [self.entries],
            "allocator_settings": {
                "PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1, "garbage_collection_threshold": 0.0,
                "expandable_segments": False, "pinned_num_register_threads": 1,
                "release_lock_on_cudamalloc": False, "pinned_use_cuda_host_register": False,
                "roundup_power2_divisions": {str(1 << i): 0 for i in range(16)},
            },
            "external_annotations": [],
        }


def make(n_entries, seed):
    b = Builder(seed)
    live = b.build(n_entries)
    return b.snapshot(live)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-o", "--output", default=os.path.join(tempfile.gettempdir(), "allocsim-big-snapshot.pickle"))
    ap.add_argument("--mb", type=float, default=1024, help="about this many MiB of pickle (default 1024)")
    ap.add_argument("--entries", type=int, default=0, help="this many trace entries instead of --mb")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    n = args.entries
    if n <= 0:
        # Bytes per entry past the first (the frames first written), from
        # two small snapshots of the same shape.
        a, b = (len(pickle.dumps(make(k, args.seed), protocol=4)) for k in (50_000, 100_000))
        per = (b - a) / 50_000
        n = int((args.mb * (1 << 20) - a) / per) + 50_000
    snap = make(n, args.seed)
    tmp = args.output + ".tmp"
    with open(tmp, "wb") as f:
        pickle.dump(snap, f, protocol=4)
    os.replace(tmp, args.output)
    print("%s: %d bytes, %d entries" % (args.output, os.path.getsize(args.output), len(snap["device_traces"][0])))


if __name__ == "__main__":
    sys.exit(main())

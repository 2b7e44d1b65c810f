#!/usr/bin/env python3
"""Writes the hand-made snapshots that pytorch_test.go expects.

Run from this directory: python3 gen.py. Plain Python values only, shaped
like torch.cuda.memory._dump_snapshot output; see pytorch_test.go for the
events each must give.
"""
import gzip
import pickle

SEG = 0x7F0000000000
BIG = 2**63 + 0x200  # pickled as a 9-byte LONG1
MAX = 2**64 - 1      # likewise


def entry(action, addr, size, stream=0, time_us=0, **extra):
    e = {"action": action, "addr": addr, "size": size, "stream": stream,
         "time_us": time_us, "compile_context": "N/A", "user_metadata": ""}
    e.update(extra)
    return e


frames = [{"name": "forward", "filename": "model.py", "line": 42}]
t0 = 1795945664154792
entries = [
    entry("segment_alloc", SEG, 2 << 20, 0, t0),
    entry("alloc", SEG, 1000, 0, t0 + 1, frames=frames),
    entry("alloc", BIG, 512, 7, t0 + 2),
    entry("free_requested", SEG, 1000, 0, t0 + 3),
    entry("free_completed", SEG, 1000, 0, t0 + 4),
    # PyTorch writes an oom's free device memory as device_free, not addr.
    {"action": "oom", "device_free": 123456789, "size": 1 << 40, "stream": 0,
     "time_us": t0 + 5, "compile_context": "N/A", "user_metadata": ""},
    entry("snapshot", 0, 0, 0, t0 + 6),
    entry("segment_map", SEG + (2 << 20), 2 << 20, 0, t0 + 7),
    entry("segment_unmap", SEG + (2 << 20), 2 << 20, 0, t0 + 8),
    entry("segment_free", SEG, 2 << 20, 0, t0 + 9),
    # stream is int64(cudaStream_t): -1 is 0xffffffffffffffff.
    entry("alloc", MAX, 1, -1, t0 + 10),
]
snapshot = {
    "segments": [{"device": 0, "address": SEG, "total_size": 2 << 20,
                  "allocated_size": 0, "stream": 0, "segment_type": "large",
                  "segment_pool_id": (0, 0), "is_expandable": False,
                  "frames": [], "blocks": []}],
    "device_traces": [entries, [entry("alloc", 0x1000, 4096, 0, t0)]],
    "allocator_settings": {
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,max_split_size_mb:128",
        "max_split_size": 134217728,
        "garbage_collection_threshold": 0.6,
        "expandable_segments": True,
        "release_lock_on_cudamalloc": False,
        "roundup_power2_divisions": {"1": 0, "16": 2, "2": 0, "4": 1, "32768": 8},
    },
    "external_annotations": [],
}

with open("tiny_proto2.pickle", "wb") as f:
    pickle.dump(snapshot, f, protocol=2)
with open("tiny_proto5.pickle", "wb") as f:
    pickle.dump(snapshot, f, protocol=5)
with gzip.GzipFile("tiny_proto4.pickle.gz", "wb", mtime=0) as f:
    pickle.dump(snapshot, f, protocol=4)

bad = {"segments": [], "device_traces": [[entry("alloc", 0x1000, 4096), entry("resize", 0x1000, 8192)]]}
with open("unknown_action.pickle", "wb") as f:
    pickle.dump(bad, f, protocol=4)
with open("no_device_traces.pickle", "wb") as f:
    pickle.dump({"segments": []}, f, protocol=4)

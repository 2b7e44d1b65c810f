#!/usr/bin/env python3
"""Recover the stream of every malloc of a churn log, which DebugPrintHook
does not print, from the workload itself.

    python3 streams.py NAME.jsonl > NAME.streams

churn (record.py) draws every size, every choice of the array to free and
every choice of the side stream from one random.Random(seed). This script
runs record.py's churn with that seed against a stand-in for CuPy (no GPU:
cp.empty makes a Python object, its release logs a free), raising
OutOfMemoryError at the mallocs that failed in the log, and so draws the
same numbers in the same order. It checks that the result is the log: the
size of every malloc, and the order of every malloc and free (which malloc
each free releases). Only then does it print, one line per malloc line of
the log, 1 for a malloc made on the side stream and 0 for one on the
default stream.
"""
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import record  # noqa: E402


class FakeOOM(Exception):
    pass


class FakeCuPy:
    """The part of cupy that churn uses, logging what it does."""

    uint8 = "uint8"

    def __init__(self, failed):
        self.failed = failed  # indices of the mallocs that fail
        self.log = []  # ("malloc", index, size, stream) and ("free", index)
        self.stream = [0]
        self.mallocs = 0
        cp = self

        class Stream:
            def __init__(self, non_blocking=False):
                pass

            def __enter__(self):
                cp.stream.append(1)

            def __exit__(self, *exc):
                cp.stream.pop()

        class Device:
            def synchronize(self):
                pass

        class Array:
            def __init__(self, index):
                self.index = index

            def __del__(self):
                cp.log.append(("free", self.index))

        class memory:
            OutOfMemoryError = FakeOOM

        class cuda:
            pass

        cuda.Stream = Stream
        cuda.Device = Device
        cuda.memory = memory
        self.cuda = cuda
        self.Array = Array

    def empty(self, n, dtype=None):
        i = self.mallocs
        self.mallocs += 1
        self.log.append(("malloc", i, n, self.stream[-1]))
        if i in self.failed:
            raise FakeOOM("malloc %d" % i)
        return self.Array(i)


def main():
    lines = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
    mallocs = [l for l in lines if l["hook"] == "malloc"]
    failed = {i for i, l in enumerate(mallocs) if l["mem_ptr"] == 0}
    cp = FakeCuPy(failed)
    with open(os.path.join(os.path.dirname(sys.argv[1]), os.path.basename(sys.argv[1]).replace(".jsonl", ".stats.json"))) as f:
        seed = json.load(f)["seed"]
    record.churn(cp, random.Random(seed))

    # The log's order of mallocs and frees, by malloc index.
    want, at, k = [], {}, 0
    for l in lines:
        if l["hook"] == "malloc":
            want.append(("malloc", k, l["size"]))
            if l["mem_ptr"]:
                at[l["mem_ptr"]] = k
            k += 1
        elif l["hook"] == "free":
            want.append(("free", at.pop(l["mem_ptr"])))
    got = [e[:3] if e[0] == "malloc" else e for e in cp.log]
    if got != want:
        for i, (g, w) in enumerate(zip(got, want)):
            if g != w:
                sys.exit("%s: event %d: the workload gives %s, the log %s" % (sys.argv[1], i, g, w))
        sys.exit("%s: the workload gives %d events, the log %d" % (sys.argv[1], len(got), len(want)))
    for e in cp.log:
        if e[0] == "malloc":
            print(e[3])


if __name__ == "__main__":
    main()

"""The smallest allocsim exec policy: a bump allocator that never reuses.

Each malloc takes the next bytes of the current device segment (64 MiB, or
the rounded size when larger); frees are ignored until every block of a
segment is free, and then the segment is given back to the device.

    replay sim --policy exec:'python3 python/examples/bump.py' TRACE
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from allocsim_policy import Policy, run  # noqa: E402

SEGMENT = 64 << 20


class Bump(Policy):
    name = "bump.py"

    def __init__(self):
        self.seg = None  # current segment: [base, end)
        self.top = self.end = 0
        self.live = {}  # block address -> its segment's base
        self.count = {}  # segment base -> live blocks in it

    def malloc(self, size, stream):
        n = max(512, (size + 511) // 512 * 512)
        if self.seg is None or self.top + n > self.end:
            if self.seg is not None and self.count[self.seg] == 0:
                self._give_back(self.seg)
            self.seg = None
            seg = max(SEGMENT, (n + (2 << 20) - 1) // (2 << 20) * (2 << 20))
            base = self.device_alloc(seg)
            if base is None:
                return None
            self.seg, self.top, self.end = base, base, base + seg
            self.count[base] = 0
        addr = self.top
        self.top += n
        self.live[addr] = self.seg
        self.count[self.seg] += 1
        return (addr, n)

    def free(self, addr, stream):
        base = self.live.pop(addr)
        self.count[base] -= 1
        if self.count[base] == 0 and base != self.seg:
            self._give_back(base)

    def _give_back(self, base):
        del self.count[base]
        self.device_free(base)


if __name__ == "__main__":
    run(Bump())

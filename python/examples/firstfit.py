"""An address-ordered first-fit allocator as an allocsim exec policy.

It does what allocsim's built-in first-fit policy does with its default
settings, so that the two replay a trace to the same figures: sizes rounded
up to 512 bytes; segments of max(2 MiB, rounded size) rounded up to 2 MiB;
the free block with the lowest address that is large enough, its front part
taken; a freed block coalesced with its free neighbours in its segment;
when the device refuses a segment, every wholly free segment given back and
the segment asked for once more; empty_cache gives back every wholly free
segment. A malloc of 0 bytes gets the block (0, 0).

    replay sim --policy exec:'python3 python/examples/firstfit.py' TRACE
"""

import bisect
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from allocsim_policy import Policy, run  # noqa: E402

ALIGN = 512
MIB2 = 2 << 20


def round_up(n, m):
    return (n + m - 1) // m * m


class FirstFit(Policy):
    name = "firstfit.py"

    def __init__(self):
        self.addrs = []  # free blocks' addresses, ascending
        self.size = {}  # free block address -> bytes
        self.seg_of = {}  # free or live block address -> its segment's address
        self.live = {}  # live block address -> bytes
        self.segs = {}  # segment address -> bytes
        self.order = []  # segment addresses, in the built-in's order

    def malloc(self, size, stream):
        if size == 0:
            return (0, 0)
        n = round_up(size, ALIGN)
        addr = self._take(n)
        if addr is None:
            seg = round_up(max(MIB2, n), MIB2)
            base = self.device_alloc(seg)
            if base is None and self._release_free() > 0:
                base = self.device_alloc(seg)
            if base is None:
                return None
            self.segs[base] = seg
            self.order.append(base)
            self._insert(base, seg, base)
            addr = self._take(n)
        self.live[addr] = n
        return (addr, n)

    def _take(self, n):
        for i, a in enumerate(self.addrs):
            s = self.size[a]
            if s >= n:
                seg = self.seg_of[a]
                del self.addrs[i], self.size[a]
                if s > n:
                    self._insert(a + n, s - n, seg)
                return a
        return None

    def _insert(self, addr, size, seg):
        bisect.insort(self.addrs, addr)
        self.size[addr] = size
        self.seg_of[addr] = seg

    def free(self, addr, stream):
        if addr == 0:
            return
        n = self.live.pop(addr)
        seg = self.seg_of[addr]
        i = bisect.bisect_left(self.addrs, addr)
        # The free neighbour after, in the same segment.
        if i < len(self.addrs):
            nx = self.addrs[i]
            if nx == addr + n and self.seg_of[nx] == seg:
                n += self.size.pop(nx)
                del self.addrs[i], self.seg_of[nx]
        # The free neighbour before, in the same segment.
        if i > 0:
            pv = self.addrs[i - 1]
            if pv + self.size[pv] == addr and self.seg_of[pv] == seg:
                self.size[pv] += n
                del self.seg_of[addr]
                return
        self._insert(addr, n, seg)

    def _release_free(self):
        # In the built-in's order: a segment given back takes the place of
        # the last one in the list (the cost model's latency quantiles
        # depend on the order of the calls).
        released, i = 0, 0
        while i < len(self.order):
            base = self.order[i]
            if self.size.get(base) != self.segs[base]:
                i += 1
                continue
            self.addrs.remove(base)
            del self.size[base], self.seg_of[base], self.segs[base]
            self.order[i] = self.order[-1]
            self.order.pop()
            self.device_free(base)
            released += 1
        return released

    def empty_cache(self):
        self._release_free()


if __name__ == "__main__":
    run(FirstFit())

"""The benchmark's Python child: one huge segment, bump placement, frees
ignored: the protocol's cost with a policy that answers at once."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "python"))
from allocsim_policy import Policy, run  # noqa: E402


class Instant(Policy):
    def __init__(self):
        self.top = None

    def malloc(self, size, stream):
        if self.top is None:
            self.top = self.device_alloc(1 << 50)
        addr = self.top
        self.top += size
        return addr

    def free(self, addr, stream):
        pass


if __name__ == "__main__":
    run(Instant())

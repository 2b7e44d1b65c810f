"""A policy whose malloc raises after its first: the engine gets an error
line naming the event, the traceback goes to stderr."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "python"))
from allocsim_policy import Policy, run  # noqa: E402


class Raises(Policy):
    def __init__(self):
        self.n = 0
        self.live = {}

    def malloc(self, size, stream):
        self.n += 1
        if self.n > 1:
            raise ValueError("no second malloc here")
        base = self.device_alloc(2 << 20)
        return base

    def free(self, addr, stream):
        del self.live[addr]  # KeyError: the engine hears of it at its next wait


if __name__ == "__main__":
    run(Raises())

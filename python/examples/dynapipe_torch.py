"""DynaPipe's Python port of PyTorch's caching allocator as an allocsim exec policy.

DynaPipe (github.com/awslabs/optimizing-multitask-training-through-dynamic-pipelines)
simulates PyTorch's allocator in dynapipe/memory_opt/allocation_simulator.py.
This adapter runs that file as it is, from a checkout named by $DYNAPIPE (it is
not part of allocsim), behind the exec protocol:

    DYNAPIPE=/path/to/checkout replay sim \\
        --policy "exec:python3 python/examples/dynapipe_torch.py,pytorch" TRACE

It only
  - routes the simulator's backend (backend_malloc/backend_free, a bump pointer
    in DynaPipe) to the engine's device (device_alloc/device_free), whose
    capacity decides OOMs (its own memory limit set to infinity);
  - sets kSmallSize to PyTorch's 1 MiB (DynaPipe's default of 0, the real value
    commented out, puts every block in the large pool);
  - keeps a map from address to DynaPipe's block, since its free() takes the
    block object.

On kv_decode it replays to the pytorch policy's figures: peak reserved
822083584 bytes, 29 device mallocs (its port knows one stream: replay traces of
the default stream).
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
root = os.environ.get("DYNAPIPE")
if not root:
    sys.exit("dynapipe_torch.py: set DYNAPIPE to a checkout of "
             "github.com/awslabs/optimizing-multitask-training-through-dynamic-pipelines")
sys.path.insert(0, os.path.join(root, "dynapipe", "memory_opt"))

from allocation_simulator import TorchCachingAllocatorConfig, TorchCachingAllocatorSimulator  # noqa: E402
from allocsim_policy import Policy, run  # noqa: E402


class DynaPipeTorch(Policy):
    name = "dynapipe-torch"

    def __init__(self):
        cfg = TorchCachingAllocatorConfig(kSmallSize=1 << 20)
        self.sim = TorchCachingAllocatorSimulator(float("inf"), cfg)
        self.sim.backend_malloc = self._backend_malloc
        self.sim.backend_free = self._backend_free
        self.blocks = {}

    def _backend_malloc(self, size):
        addr = self.device_alloc(size)
        return -1 if addr is None else addr

    def _backend_free(self, ptr):
        self.device_free(ptr)

    def malloc(self, size, stream):
        try:
            b = self.sim.malloc(size, stream)
        except RuntimeError:
            return None
        self.blocks[b.ptr] = b
        return (b.ptr, b.size)

    def free(self, addr, stream):
        self.sim.free(self.blocks.pop(addr))

    def empty_cache(self):
        self.sim.clear_cache()


if __name__ == "__main__":
    run(DynaPipeTorch())

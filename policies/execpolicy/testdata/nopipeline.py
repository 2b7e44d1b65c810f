"""python/examples/firstfit.py without the hook pipeline: a round trip per
malloc, for the tests that compare the two."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "python", "examples"))
import firstfit  # noqa: E402


class NoPipeline(firstfit.FirstFit):
    pipeline = False


if __name__ == "__main__":
    firstfit.run(NoPipeline())

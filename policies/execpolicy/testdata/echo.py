"""The benchmark's Python floor: echoes each line at once, flushed, with
no protocol: a round trip over the pipes and nothing else."""
import sys

readline, out = sys.stdin.buffer.readline, sys.stdout.buffer
while True:
    line = readline()
    if not line:
        break
    out.write(line)
    out.flush()

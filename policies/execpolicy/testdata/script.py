"""A child that plays the child's side of a session read from the file
argv[1] ("< LINE" it writes, "> LINE" it must read, in order) and fails with
an error line where the engine's line is not the session's."""
import sys

lines = [l.rstrip("\n") for l in open(sys.argv[1])]
for l in lines:
    if l.startswith("< "):
        sys.stdout.write(l[2:] + "\n")
    else:
        sys.stdout.flush()
        got = sys.stdin.readline().rstrip("\n")
        if got != l[2:]:
            print("error session: want %r, got %r" % (l[2:], got), flush=True)
            sys.exit(1)
sys.stdout.flush()
rest = sys.stdin.read()
if rest:
    print("error session: after its end, got %r" % rest, flush=True)
    sys.exit(1)

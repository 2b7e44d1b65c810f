"""Children that break the protocol, one per argv[1], written against the
raw protocol (not allocsim_policy) so that they can break it."""
import sys
import time

out = sys.stdout
mode = sys.argv[1]


def hello(hooks=""):
    out.write("allocsim-policy 1 bad %s\n" % hooks)
    out.flush()


def expect(prefix):
    line = sys.stdin.readline()
    if not line.startswith(prefix):
        sys.exit("bad.py: want %s, got %r" % (prefix, line))
    return line.split()


if mode == "garbage-hello":
    print("hello there", flush=True)
    time.sleep(60)
elif mode == "version":
    out.write("allocsim-policy 2 bad\n")
    out.flush()
    time.sleep(60)
elif mode == "garbage-answer":
    hello()
    expect("malloc")
    print("banana 12", flush=True)
    time.sleep(60)
elif mode == "outside":
    hello()
    expect("malloc")
    print("ok 4096 4096", flush=True)
    time.sleep(60)
elif mode == "past-end":
    hello()
    m = expect("malloc")
    print("device_alloc 2097152", flush=True)
    seg = int(expect("ok")[1])
    print("ok %d" % (seg + 2097152 - 512), flush=True)
    time.sleep(60)
elif mode == "overlap":
    hello()
    expect("malloc")
    print("device_alloc 2097152", flush=True)
    seg = int(expect("ok")[1])
    print("ok %d" % seg, flush=True)
    expect("malloc")
    print("ok %d" % (seg + 256), flush=True)
    time.sleep(60)
elif mode == "free-live-segment":
    hello()
    expect("malloc")
    print("device_alloc 2097152", flush=True)
    seg = int(expect("ok")[1])
    print("device_free %d" % seg, flush=True)
    print("ok %d" % seg, flush=True)
    time.sleep(60)
elif mode == "hang":
    hello()
    for line in sys.stdin:  # takes every event, answers none
        pass
elif mode == "retry-device":
    hello()
    expect("malloc")
    while True:  # asks again for what the device refuses (2^64 bytes at once), forever
        print("device_alloc %d" % (1 << 63), flush=True)
        sys.stdin.readline()
elif mode == "hang-exit":
    hello()
    for line in sys.stdin:  # takes every event, to the end of its input
        pass
    time.sleep(60)  # and does not exit, its output open
elif mode == "hang-hello":
    time.sleep(60)
elif mode == "exit-after-hello":
    hello()
    sys.stdin.readline()
    sys.stderr.write("bad.py: giving up\n")
    sys.exit(4)
else:
    sys.exit("bad.py: unknown mode " + mode)

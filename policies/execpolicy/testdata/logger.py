"""A bump policy that logs every event it gets to the file argv[1], one
line each; argv[2] == "nohooks" asks for no hook, "ack" for ack."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "python"))
from allocsim_policy import Policy, run  # noqa: E402


class Logger(Policy):
    name = "logger"

    def __init__(self, path):
        self.log = open(path, "w")
        self.top = self.end = 0

    def malloc(self, size, stream):
        self.log.write("malloc %d %d\n" % (size, stream))
        if self.top + size > self.end:
            base = self.device_alloc(64 << 20)
            if base is None:
                return None
            self.top, self.end = base, base + (64 << 20)
        addr = self.top
        self.top += max(size, 1)
        return addr

    def free(self, addr, stream):
        self.log.write("free %#x %d\n" % (addr, stream))


class Hooked(Logger):
    def stream_sync(self, stream):
        self.log.write("stream_sync %d\n" % stream)

    def device_sync(self):
        self.log.write("device_sync\n")

    def event_record(self, event, stream):
        self.log.write("event_record %d %d\n" % (event, stream))

    def stream_wait_event(self, stream, event):
        self.log.write("stream_wait_event %d %d\n" % (stream, event))

    def event_sync(self, event):
        self.log.write("event_sync %d\n" % event)

    def marker(self, label):
        self.log.write("marker %r\n" % label)

    def empty_cache(self):
        self.log.write("empty_cache\n")


if __name__ == "__main__":
    mode = sys.argv[2] if len(sys.argv) > 2 else ""
    p = Logger(sys.argv[1]) if mode == "nohooks" else Hooked(sys.argv[1])
    p.ack = mode == "ack"
    run(p)

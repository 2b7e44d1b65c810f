"""Write an allocsim allocator policy in Python.

allocsim replays a GPU job's allocation trace against a policy named with
``--policy exec:COMMAND``: COMMAND runs as a child process and speaks the
line protocol of docs/exec-protocol.md on its standard input and output.
This module is that protocol's Python side, with no dependency beyond the
standard library. Subclass Policy, then call run::

    from allocsim_policy import Policy, run

    class Bump(Policy):
        def malloc(self, size, stream):
            ...                       # place size bytes; self.device_alloc(n) for memory
            return addr               # or (addr, block_size), or None for out of memory
        def free(self, addr, stream):
            ...

    if __name__ == "__main__":
        run(Bump())

and replay with ``replay sim --policy exec:'python3 bump.py' TRACE``.

The shape is that of DynaPipe's AllocatorSimulator (malloc and free), with
the device underneath given by the engine: ``device_alloc(size)`` returns the
address of a new device segment of size bytes, or None when the device
refuses it (its capacity: ``replay sim --capacity``), and
``device_free(addr)`` gives a segment back. The engine counts these calls,
the reserved bytes and their cost as for any built-in policy, and checks
that every block lies inside a segment the policy holds and overlaps no
live block.

Optional hooks, sent only to a policy that defines them: ``stream_sync(stream)``,
``device_sync()``, ``event_record(event, stream)``,
``stream_wait_event(stream, event)``, ``event_sync(event)`` (defining any
of the five asks for all of them), ``marker(label)`` and ``empty_cache()``.

Frees, synchronizations and markers are not answered, so that the engine
sends them without waiting: while handling them a policy may give memory
back (device_free) but not ask for it (device_alloc), unless it sets
``ack = True``, which makes the engine wait for every event (slower, and
each device call is then counted at its own event). Mallocs are
pipelined (the hook ``pipeline``): the engine sends the mallocs and frees
it knows are coming without waiting for each answer, and this module
answers them in order, so that a replay costs no round trip per malloc;
the policy sees the same calls in the same order either way. Set
``pipeline = False`` for a round trip per malloc. Only standard output
is the protocol's: print diagnostics to standard error, which the engine
passes on to the user's (its last line is quoted in the engine's errors).
"""

import collections
import sys
import traceback

PROTOCOL_VERSION = 1

__all__ = ["Policy", "OutOfMemory", "ProtocolError", "run", "PROTOCOL_VERSION"]

_SYNC_HOOKS = ("stream_sync", "device_sync", "event_record", "stream_wait_event", "event_sync")


class OutOfMemory(Exception):
    """Raised by malloc (or returned None) when the policy cannot place it."""


class ProtocolError(Exception):
    """A misuse of the protocol, or a line from the engine that breaks it."""


class Policy:
    """A policy: subclass it and define malloc and free.

    name is the name the policy gives in its handshake (one word); the
    class name when None. ack = True asks the engine to wait for every
    event; pipeline = False asks it to wait for each malloc's answer before
    it sends the next event (see the module doc).
    """

    name = None
    ack = False
    pipeline = True

    # The optional hooks: a subclass that defines one is sent its events.
    stream_sync = None
    device_sync = None
    event_record = None
    stream_wait_event = None
    event_sync = None
    marker = None
    empty_cache = None

    _engine = None

    def malloc(self, size, stream):
        """Place a malloc of size bytes on stream.

        Return the block's address (the block is then size bytes), a tuple
        (address, block_size) with block_size >= size (the bytes set aside
        after rounding), or None (or raise OutOfMemory) when it cannot be
        placed. Every block must lie inside a device segment the policy
        holds and overlap no live block.
        """
        raise NotImplementedError

    def free(self, addr, stream):
        """Take back the block at addr, returned by malloc; freed on stream."""
        raise NotImplementedError

    def device_alloc(self, size):
        """Ask the engine for a device segment of size bytes.

        Returns its address, or None when the device refuses (out of
        memory). Only while handling a malloc or empty_cache, or any event
        when ack is set.
        """
        if self._engine is None:
            raise ProtocolError("device_alloc outside run()")
        return self._engine.device_alloc(size)

    def device_free(self, addr):
        """Give the device segment at addr back to the engine's device."""
        if self._engine is None:
            raise ProtocolError("device_free outside run()")
        self._engine.device_free(addr)

    def hooks(self):
        """The hooks named in the handshake, from the methods defined."""
        out = []
        if any(getattr(self, h) is not None for h in _SYNC_HOOKS):
            out.append("sync")
        if self.marker is not None:
            out.append("marker")
        if self.empty_cache is not None:
            out.append("empty_cache")
        if self.ack:
            out.append("ack")
        elif self.pipeline:
            out.append("pipeline")
        return out


def _unescape(label):
    if "\\" not in label:
        return label
    out, i = [], 0
    while i < len(label):
        c = label[i]
        if c == "\\" and i + 1 < len(label):
            i += 1
            c = {"n": "\n", "r": "\r"}.get(label[i], label[i])
        out.append(c)
        i += 1
    return "".join(out)


# The engine names the block of a free whose malloc it has not read the
# answer to by that malloc's number (free_malloc N), one of the last
# _PIPELINE_WINDOW mallocs (docs/exec-protocol.md, "Pipelined mallocs").
_PIPELINE_WINDOW = 256


class _Engine:
    """The engine's end of the pipes, as the policy sees it."""

    def __init__(self, inp, out, pipeline):
        self.read1 = getattr(inp, "read1", None) or inp.read
        self.out = out
        self.pipeline = pipeline
        self.lines = collections.deque()  # lines read, not handled yet
        self.tail = b""  # the start of a line not read whole yet
        self.held = []  # lines written at the next answer
        self.answering = False  # handling an event the engine waits for
        self.event = b""  # the line of the event being handled, for errors
        self.mallocs = 0  # malloc lines read, which number them from 1
        self.blocks = {}  # the last mallocs' blocks by number (None: oom)

    def readline(self):
        """The next line from the engine, b"" at the end of its input.

        Answers are flushed before waiting: the engine may be waiting for
        them (with pipeline they are not flushed one by one).
        """
        lines = self.lines
        while not lines:
            self.flush()
            chunk = self.read1(65536)
            if not chunk:
                tail, self.tail = self.tail, b""
                return tail
            parts = (self.tail + chunk).split(b"\n")
            self.tail = parts.pop()
            lines.extend(p + b"\n" for p in parts)
        return lines.popleft()

    def event_text(self):
        """The event being handled, without its line end."""
        return self.event.rstrip(b"\r\n").decode(errors="replace")

    def device_alloc(self, size):
        if not self.answering:
            raise ProtocolError(
                "device_alloc while handling %r, which the engine does not wait for: "
                "only malloc and empty_cache may ask for device memory, unless the policy sets ack = True"
                % self.event_text())
        size = int(size)
        if size <= 0:
            raise ProtocolError("device_alloc of %d bytes" % size)
        self.held.append(b"device_alloc %d\n" % size)
        self.flush()
        # With pipeline, the events sent ahead may come before the answer:
        # they are kept, in order, for after the event being handled.
        early = []
        while True:
            line = self.readline()
            if line.startswith(b"ok ") or line.startswith(b"oom"):
                break
            if not line or not self.pipeline:
                raise ProtocolError("want the answer to device_alloc (ok ADDR or oom), got %r" % line)
            early.append(line)
        self.lines.extendleft(reversed(early))
        if line.startswith(b"ok "):
            return int(line[3:])
        return None

    def device_free(self, addr):
        self.held.append(b"device_free %d\n" % addr)

    def flush(self):
        if self.held:
            self.out.write(b"".join(self.held))
            self.held.clear()
        self.out.flush()

    def answer(self, line):
        # Lines held since the last answer go first. Without pipeline, one
        # write and one flush (a system call) per answer, which the engine
        # waits for; with it, answers are flushed before the next wait.
        if self.held:
            self.held.append(line)
            line = b"".join(self.held)
            self.held.clear()
        self.out.write(line)
        if not self.pipeline:
            self.out.flush()

    def numbered(self, block):
        """Keeps the block (None for oom) of the malloc just answered."""
        n = self.mallocs
        blocks = self.blocks
        blocks[n] = block
        blocks.pop(n - _PIPELINE_WINDOW, None)

    def block_of(self, n):
        """The block of malloc n (free_malloc), None if it was answered oom."""
        if n not in self.blocks:
            raise ProtocolError("free_malloc %d: no malloc %d among the last %d" % (n, n, _PIPELINE_WINDOW))
        return self.blocks.pop(n)


def run(policy, inp=None, out=None):
    """Serve the engine: the handshake, then every event until the end.

    inp and out are binary files, the process's standard input and output
    by default. An exception other than OutOfMemory in the policy is
    reported to the engine as an error line (its traceback on standard
    error) and ends the process with status 1.
    """
    inp = inp if inp is not None else sys.stdin.buffer
    out = out if out is not None else sys.stdout.buffer
    hooks = policy.hooks()
    eng = _Engine(inp, out, "pipeline" in hooks)
    policy._engine = eng
    name = policy.name or type(policy).__name__
    if not name or any(c.isspace() for c in name):
        raise ValueError("policy name %r: want one word" % name)
    eng.answer(("allocsim-policy %d %s %s\n" % (PROTOCOL_VERSION, name, " ".join(hooks))).encode())
    try:
        _serve(policy, eng)
    except Exception as e:  # reported to the engine, which stops the replay
        traceback.print_exc(file=sys.stderr)
        sys.stderr.flush()
        msg = "%s: %s" % (type(e).__name__, e)
        if eng.event:
            msg = "%s: %s" % (eng.event_text(), msg)
        eng.held.append(("error %s\n" % " ".join(msg.split())).encode())
        try:
            eng.flush()
        except OSError:
            pass
        sys.exit(1)
    eng.flush()


def _serve(policy, eng):
    # The loop runs once per event: names are local, the most frequent
    # events (malloc, free) are tested first, and the line is kept as read
    # (eng.event), stripped only for an error message.
    readline = eng.readline
    ack = bool(policy.ack)
    malloc, free = policy.malloc, policy.free
    answer = eng.answer
    numbered = eng.numbered if eng.pipeline else None
    eng.answering = ack
    while True:
        line = readline()
        if not line:
            return
        eng.event = line
        parts = line.split()
        op = parts[0]
        if op == b"malloc":
            size = int(parts[1])
            eng.mallocs += 1
            eng.answering = True
            try:
                r = malloc(size, int(parts[2]))
            except OutOfMemory as e:
                eng.answering = ack
                if numbered:
                    numbered(None)
                answer(b"oom %s\n" % " ".join(str(e).split()).encode())
                continue
            eng.answering = ack
            if r is None:
                if numbered:
                    numbered(None)
                answer(b"oom\n")
                continue
            if isinstance(r, tuple):
                addr = r[0]
                answer(b"ok %d %d\n" % (addr, r[1]))
            else:
                addr = r
                answer(b"ok %d %d\n" % (addr, size))
            if numbered:
                numbered(addr)
            continue
        if op == b"free":
            free(int(parts[1]), int(parts[2]))
        elif op == b"free_malloc":
            addr = eng.block_of(int(parts[1]))
            if addr is not None:
                free(addr, int(parts[2]))
        elif op == b"stream_sync":
            if policy.stream_sync is not None:
                policy.stream_sync(int(parts[1]))
        elif op == b"device_sync":
            if policy.device_sync is not None:
                policy.device_sync()
        elif op == b"event_record":
            if policy.event_record is not None:
                policy.event_record(int(parts[1]), int(parts[2]))
        elif op == b"stream_wait_event":
            if policy.stream_wait_event is not None:
                policy.stream_wait_event(int(parts[1]), int(parts[2]))
        elif op == b"event_sync":
            if policy.event_sync is not None:
                policy.event_sync(int(parts[1]))
        elif op == b"marker":
            policy.marker(_unescape(line[7:].rstrip(b"\r\n").decode()))
        elif op == b"empty_cache":
            eng.answering = True
            policy.empty_cache()
            eng.answering = ack
            answer(b"ok\n")
            continue
        else:
            raise ProtocolError("unknown event %r" % eng.event_text())
        if ack:
            answer(b"ok\n")

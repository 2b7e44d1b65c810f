// Package execpolicy adds the policies exec:COMMAND: an allocator run as a
// child process that speaks a line protocol on its standard input and
// output (docs/exec-protocol.md), so that an allocator written in Python
// or any other language is replayed beside the built-in ones. The engine
// sends the child the events it acts on (malloc, free, and the
// synchronizations, markers and empty_cache it asks for in its handshake);
// the child asks the engine for device memory, which the Device of the
// replay serves, so that its device calls, reserved bytes, capacity OOMs
// and their cost are counted as for any other policy.
//
// Importing the package registers the scheme (policies.RegisterScheme);
// cmd/replay imports it. python/allocsim_policy.py is the child's side in
// Python.
package execpolicy

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"time"

	"github.com/gpualloc/allocsim/internal/ordmap"
	"github.com/gpualloc/allocsim/policies"
)

// Version is the protocol version the engine speaks; a child's handshake
// names the version it speaks, and must name this one.
const Version = 1

// DefaultTimeout is how long the engine waits for a line of the child's
// output that it needs (an answer, the handshake) or for the child to take
// the engine's input, before it kills the child and fails the replay.
const DefaultTimeout = 60 * time.Second

// TimeoutEnv is the environment variable that sets the timeout of the
// policies that --policy exec:COMMAND builds, as a Go duration ("500ms",
// "2m"); DefaultTimeout when unset.
const TimeoutEnv = "ALLOCSIM_EXEC_TIMEOUT"

// Scheme is the name of the scheme: --policy exec:COMMAND.
const Scheme = "exec"

func init() {
	policies.RegisterScheme(policies.Scheme{
		Name: Scheme,
		Doc:  "exec:COMMAND runs COMMAND (split as a shell splits a simple command) as a child process that places the mallocs, speaking the line protocol of docs/exec-protocol.md",
		Info: Info,
		New: func(arg string, dev policies.Device, s policies.Settings) (policies.Policy, error) {
			if len(s) > 0 {
				return nil, fmt.Errorf("policy %s:%s takes no settings (got %s): give them to the child on its command line", Scheme, arg, s.Join(", "))
			}
			var opts Options
			if v := os.Getenv(TimeoutEnv); v != "" {
				d, err := time.ParseDuration(v)
				if err != nil || d <= 0 {
					return nil, fmt.Errorf("%s=%q: want a positive duration such as 30s", TimeoutEnv, v)
				}
				opts.Timeout = d
			}
			return New(arg, dev, opts)
		},
	})
}

// Info returns the Info of the policy exec:command without starting it: its
// abilities are those of the type Policy (Syncer, Marker, Releaser), since
// which of them the child wants is known only from its handshake; the
// events of those it does not want are not sent to it. It returns an error
// for a command that Split refuses.
func Info(command string) (policies.Info, error) {
	if _, err := Split(command); err != nil {
		return policies.Info{}, fmt.Errorf("exec:%s: %w", command, err)
	}
	return policies.Info{
		Name:      Scheme + ":" + command,
		Design:    "a child process speaking the exec protocol (docs/exec-protocol.md): " + command,
		Abilities: policies.AbilitiesOf((*Policy)(nil)),
	}, nil
}

// Options are the options of New.
type Options struct {
	// Timeout bounds each wait for the child: for a line of its output
	// that the engine needs, and for it to take the engine's input. 0
	// means DefaultTimeout.
	Timeout time.Duration
	// Stderr receives the child's standard error as it writes it; nil
	// means os.Stderr. Its last line is also quoted in errors.
	Stderr io.Writer
}

// Hooks are the events beyond malloc and free that a child asks for in its
// handshake, and whether it answers every event (ack).
type Hooks struct {
	Sync       bool // stream_sync, device_sync, event_record, stream_wait_event, event_sync
	Marker     bool // marker LABEL
	EmptyCache bool // empty_cache, answered
	// Ack: every event is answered, so that the child may ask for device
	// memory while handling any of them and its device calls are counted
	// at their own event.
	Ack bool
	// Pipeline: the engine may send mallocs before it has read the
	// answers to earlier ones (when the replay tells the policy its calls
	// ahead: policies.Pipeliner), and names the block of a free whose
	// malloc it has not read the answer to by the malloc's number
	// (free_malloc N STREAM). Without Ack only.
	Pipeline bool
}

// Policy is an allocator run as a child process (see the package doc). The
// process starts at the first event, not when the Policy is built, so that
// a policy built only to be checked starts nothing. Close ends it; a
// Policy dropped without Close has its process killed when it is garbage
// collected.
type Policy struct {
	name    string   // "exec:" + command
	command string   // as given
	argv    []string // Split(command)
	dev     policies.Device
	timeout time.Duration
	stderr  io.Writer

	started, closed bool
	err             error // the first failure: every later call returns it
	child           *proc
	in              *bufio.Writer // to the child's stdin
	out             *bufio.Reader // from the child's stdout
	hooks           Hooks
	childName       string // the name in the handshake

	line int    // lines of the child's output read so far
	req  []byte // the request being answered, for errors
	// mallocs counts the malloc lines sent, which number them from 1;
	// told are the calls told ahead (Ahead) and sent, made from next on.
	mallocs uint64
	told    []toldCall
	toldAt  int
	num     []byte             // scratch for numbers
	blocks  ordmap.Map[uint64] // live blocks the child handed out: address -> bytes
	segs    ordmap.Map[uint64] // segments the child holds: address -> bytes
}

var (
	_ policies.Policy    = (*Policy)(nil)
	_ policies.Syncer    = (*Policy)(nil)
	_ policies.Marker    = (*Policy)(nil)
	_ policies.Releaser  = (*Policy)(nil)
	_ policies.Pipeliner = (*Policy)(nil)
	_ io.Closer          = (*Policy)(nil)
)

// New returns the policy exec:command on dev. It starts nothing (see
// Policy); it returns an error only for a command that Split refuses.
func New(command string, dev policies.Device, opts Options) (*Policy, error) {
	argv, err := Split(command)
	if err != nil {
		return nil, fmt.Errorf("exec:%s: %w", command, err)
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.Stderr == nil {
		opts.Stderr = os.Stderr
	}
	return &Policy{
		name: Scheme + ":" + command, command: command, argv: argv, dev: dev,
		timeout: opts.Timeout, stderr: opts.Stderr,
		blocks: ordmap.New[uint64](), segs: ordmap.New[uint64](),
	}, nil
}

// Name returns "exec:" and the command.
func (p *Policy) Name() string { return p.name }

// ChildName returns the name the child gave in its handshake, "" before it
// started.
func (p *Policy) ChildName() string { return p.childName }

// Hooks returns the hooks the child asked for in its handshake (none
// before it started).
func (p *Policy) Hooks() Hooks { return p.hooks }

// ready starts the child at the first event and returns the policy's
// failure, if any.
func (p *Policy) ready() error {
	if p.err != nil {
		return p.err
	}
	if p.closed {
		return p.fail(nil, ErrProtocol, "used after Close")
	}
	if !p.started {
		return p.start()
	}
	return nil
}

func (p *Policy) start() error {
	p.started = true
	c, err := startProc(p.argv, p.stderr, p.timeout)
	if err != nil {
		return p.fail(nil, ErrExited, fmt.Sprintf("cannot start: %v", err))
	}
	p.child = c
	runtime.AddCleanup(p, func(c *proc) { c.shutdown() }, c)
	p.in = bufio.NewWriterSize(watchedWriter{c}, 64<<10)
	p.out = bufio.NewReaderSize(watchedReader{c}, 64<<10)
	p.req = append(p.req[:0], "the handshake"...)
	line, err := p.readLine()
	if err != nil {
		return err
	}
	return p.handshake(line)
}

// Malloc sends "malloc SIZE STREAM" and returns the child's block, after
// serving the device calls it asks for meanwhile. It returns an error
// wrapping policies.ErrOutOfMemory when the child answers oom, and an
// *Error for anything else that goes wrong.
func (p *Policy) Malloc(size, stream uint64) (policies.Block, error) {
	if err := p.ready(); err != nil {
		return policies.Block{}, err
	}
	t, err := p.toldNext(policies.Call{Size: size, Stream: stream})
	if err != nil {
		return policies.Block{}, err
	}
	var verb, rest, line []byte
	if t != nil {
		// Sent by Ahead: its answer is read here, at its event.
		p.request2("malloc", size, stream)
		verb, rest, line, err = p.await()
	} else {
		p.mallocs++
		p.request2("malloc", size, stream)
		verb, rest, line, err = p.ask()
	}
	if err != nil {
		return policies.Block{}, err
	}
	switch string(verb) {
	case "ok":
		b, err := p.block(line, rest, size)
		if err != nil {
			return policies.Block{}, err
		}
		if t != nil {
			t.addr = b.Addr
		}
		return b, nil
	case "oom":
		if t != nil {
			t.failed = true
		}
		msg := "the child's allocator is out of memory"
		if len(rest) > 0 {
			msg = string(rest)
		}
		return policies.Block{}, fmt.Errorf("%s: %s: %w", p.name, msg, policies.ErrOutOfMemory)
	}
	return policies.Block{}, p.fail(line, ErrProtocol, "want the answer to malloc: ok ADDR [SIZE] or oom [TEXT]")
}

// block checks the answer "ok ADDR [SIZE]" (rest: "ADDR [SIZE]") to a
// malloc of size bytes and records the block as live.
func (p *Policy) block(line, rest []byte, size uint64) (policies.Block, error) {
	a, s, _ := cut(rest)
	addr, ok := parseUint(a)
	if !ok {
		return policies.Block{}, p.fail(line, ErrProtocol, "want ok ADDR [SIZE]: ADDR is no number")
	}
	b := policies.Block{Addr: addr, Size: size}
	if len(s) > 0 {
		if b.Size, ok = parseUint(s); !ok {
			return policies.Block{}, p.fail(line, ErrProtocol, "want ok ADDR [SIZE]: SIZE is no number")
		}
	}
	if b.Size < size {
		return policies.Block{}, p.fail(line, ErrPlacement, fmt.Sprintf("block %s of %d bytes for a malloc of %d bytes", fmtBlock(b), b.Size, size))
	}
	if b.Size == 0 {
		return b, nil // a malloc of 0 bytes: no memory, not tracked
	}
	if b.Addr+b.Size < b.Addr {
		return policies.Block{}, p.fail(line, ErrPlacement, fmt.Sprintf("block %s wraps around the address space", fmtBlock(b)))
	}
	if s, n, ok := p.segs.Floor(b.Addr); !ok || b.Addr >= s+n {
		return policies.Block{}, p.fail(line, ErrPlacement, fmt.Sprintf("block %s is not inside a device segment it got (device_alloc)", fmtBlock(b)))
	} else if b.Addr+b.Size > s+n {
		return policies.Block{}, p.fail(line, ErrPlacement, fmt.Sprintf("block %s runs past the end of its device segment %s", fmtBlock(b), fmtBlock(policies.Block{Addr: s, Size: n})))
	}
	if a, n, ok := p.blocks.Floor(b.Addr); ok && a+n > b.Addr {
		return policies.Block{}, p.fail(line, ErrPlacement, fmt.Sprintf("block %s overlaps block %s, handed out before and not freed", fmtBlock(b), fmtBlock(policies.Block{Addr: a, Size: n})))
	}
	if a, n, ok := p.blocks.Ceil(b.Addr); ok && a < b.Addr+b.Size {
		return policies.Block{}, p.fail(line, ErrPlacement, fmt.Sprintf("block %s overlaps block %s, handed out before and not freed", fmtBlock(b), fmtBlock(policies.Block{Addr: a, Size: n})))
	}
	p.blocks.Put(b.Addr, b.Size)
	return b, nil
}

// Free sends "free ADDR STREAM". It does not wait for the child (unless
// it asked for ack): a failure of the child shows at the next call that
// waits for it.
func (p *Policy) Free(addr, stream uint64) error {
	if err := p.ready(); err != nil {
		return err
	}
	t, err := p.toldNext(policies.Call{Free: true, Stream: stream, Addr: addr})
	if err != nil {
		return err
	}
	p.blocks.Delete(addr) // absent for a block of 0 bytes
	if t != nil {
		return nil // sent by Ahead
	}
	p.request2("free", addr, stream)
	return p.send()
}

// StreamSync sends "stream_sync STREAM" to a child that asked for sync.
func (p *Policy) StreamSync(stream uint64) {
	if p.ready() == nil && p.hooks.Sync && p.untold("a synchronization") == nil {
		p.request1("stream_sync", stream)
		p.send()
	}
}

// DeviceSync sends "device_sync" to a child that asked for sync.
func (p *Policy) DeviceSync() {
	if p.ready() == nil && p.hooks.Sync && p.untold("a synchronization") == nil {
		p.req = append(p.req[:0], "device_sync"...)
		p.send()
	}
}

// EventRecord sends "event_record EVENT STREAM" to a child that asked for
// sync.
func (p *Policy) EventRecord(ev, stream uint64) {
	if p.ready() == nil && p.hooks.Sync && p.untold("a synchronization") == nil {
		p.request2("event_record", ev, stream)
		p.send()
	}
}

// StreamWaitEvent sends "stream_wait_event STREAM EVENT" to a child that
// asked for sync.
func (p *Policy) StreamWaitEvent(stream, ev uint64) {
	if p.ready() == nil && p.hooks.Sync && p.untold("a synchronization") == nil {
		p.request2("stream_wait_event", stream, ev)
		p.send()
	}
}

// EventSync sends "event_sync EVENT" to a child that asked for sync.
func (p *Policy) EventSync(ev uint64) {
	if p.ready() == nil && p.hooks.Sync && p.untold("a synchronization") == nil {
		p.request1("event_sync", ev)
		p.send()
	}
}

// Mark sends "marker LABEL" (escaped: EscapeLabel) to a child that asked
// for marker. It returns the policy's failure so far.
func (p *Policy) Mark(label string) error {
	if err := p.ready(); err != nil || !p.hooks.Marker {
		return err
	}
	if err := p.untold("a marker"); err != nil {
		return err
	}
	p.req = append(append(p.req[:0], "marker "...), EscapeLabel(label)...)
	return p.send()
}

// EmptyCache sends "empty_cache" to a child that asked for it and waits for
// its "ok", serving the device frees it makes meanwhile.
func (p *Policy) EmptyCache() error {
	if err := p.ready(); err != nil || !p.hooks.EmptyCache {
		return err
	}
	if err := p.untold("empty_cache"); err != nil {
		return err
	}
	p.req = append(p.req[:0], "empty_cache"...)
	return p.askOK()
}

// Close ends the child: it closes the child's standard input, serves the
// device frees the child makes before it exits, and waits for it to exit
// (killing it after the timeout). It returns the policy's failure, an
// error line the child wrote, or a non-zero exit status; a second Close
// returns the first's error.
func (p *Policy) Close() error {
	if p.closed {
		return p.err
	}
	p.closed = true
	if !p.started {
		return nil
	}
	if p.err != nil {
		if p.child != nil {
			p.child.shutdown()
		}
		return p.err
	}
	if err := p.untold("the end of the events"); err != nil {
		return err
	}
	p.req = append(p.req[:0], "the end of the events (its standard input closed)"...)
	if err := p.in.Flush(); err != nil {
		return p.lost("cannot write to it")
	}
	p.child.in.Close()
	for {
		line, err := p.next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return p.readFailed(err)
		}
		verb, rest, _ := cut(line)
		switch string(verb) {
		case "device_free":
			if err := p.deviceFree(line, rest); err != nil {
				return err
			}
		case "error":
			return p.fail(line, ErrChild, "the child failed: "+string(rest))
		default:
			return p.fail(line, ErrProtocol, "after the end of the events, want only device_free or error")
		}
	}
	if err := p.child.reap(p.timeout); err != nil {
		if p.child.timedOut.Load() {
			return p.fail(nil, ErrTimeout, fmt.Sprintf("did not exit within %v of the end of its input: killed", p.timeout))
		}
		return p.fail(nil, ErrExited, err.Error())
	}
	p.child.shutdown()
	return nil
}

// request1 and request2 set the request line: a verb and its numbers.
func (p *Policy) request1(verb string, a uint64) {
	p.req = append(p.req[:0], verb...)
	p.req = append(p.req, ' ')
	p.req = strconv.AppendUint(p.req, a, 10)
}

func (p *Policy) request2(verb string, a, b uint64) {
	p.request1(verb, a)
	p.req = append(p.req, ' ')
	p.req = strconv.AppendUint(p.req, b, 10)
}

// send writes the request line without waiting for the child, unless it
// asked for ack.
func (p *Policy) send() error {
	if p.hooks.Ack {
		return p.askOK()
	}
	p.in.Write(p.req)
	if err := p.in.WriteByte('\n'); err != nil {
		return p.lost("cannot write to it")
	}
	return nil
}

// askOK writes the request line and waits for "ok".
func (p *Policy) askOK() error {
	verb, _, line, err := p.ask()
	if err != nil {
		return err
	}
	if string(verb) != "ok" {
		return p.fail(line, ErrProtocol, "want ok")
	}
	return nil
}

// ask writes the request line, flushes, and reads the child's output up to
// its answer, serving its device calls and failing at an error line. It
// returns the answer's verb, the rest of the line and the whole line,
// valid until the next read.
func (p *Policy) ask() (verb, rest, line []byte, err error) {
	p.in.Write(p.req)
	p.in.WriteByte('\n')
	if err := p.in.Flush(); err != nil {
		return nil, nil, nil, p.lost("cannot write to it")
	}
	return p.await()
}

// maxRefused is the most device_alloc lines refused (oom) that a child
// may write while handling one event: a child that asks again and again
// for what the device refuses gets an error, where the timeout, which
// bounds each line, never came.
const maxRefused = 1 << 12

// await is ask for a request already sent (by Ahead).
func (p *Policy) await() (verb, rest, line []byte, err error) {
	refused := 0
	for {
		line, err := p.readLine()
		if err != nil {
			return nil, nil, nil, err
		}
		verb, rest, _ := cut(line)
		switch string(verb) {
		case "device_alloc":
			ok, err := p.deviceAlloc(line, rest)
			if err != nil {
				return nil, nil, nil, err
			}
			if !ok {
				if refused++; refused == maxRefused {
					return nil, nil, nil, p.fail(line, ErrProtocol, fmt.Sprintf("%d device_alloc refused while handling one event: a child that asks again for what the device refuses never answers", maxRefused))
				}
			}
		case "device_free":
			if err := p.deviceFree(line, rest); err != nil {
				return nil, nil, nil, err
			}
		case "error":
			return nil, nil, nil, p.fail(line, ErrChild, "the child failed: "+string(rest))
		default:
			return verb, rest, line, nil
		}
	}
}

// deviceAlloc serves "device_alloc SIZE"; ok is false when the device
// refused it (answered oom).
func (p *Policy) deviceAlloc(line, rest []byte) (ok bool, err error) {
	size, ok := parseUint(rest)
	if !ok || size == 0 {
		return false, p.fail(line, ErrProtocol, "want device_alloc SIZE, SIZE a number above 0")
	}
	addr, err := p.dev.Alloc(size)
	switch {
	case errors.Is(err, policies.ErrOutOfMemory):
		p.in.WriteString("oom ")
		p.in.WriteString(oneLine(err.Error()))
		ok = false
	case err != nil:
		return false, p.fail(line, ErrDevice, "the device failed: "+err.Error())
	default:
		p.segs.Put(addr, size)
		p.in.WriteString("ok ")
		p.in.Write(strconv.AppendUint(p.num[:0], addr, 10))
	}
	p.in.WriteByte('\n')
	if err := p.in.Flush(); err != nil {
		return false, p.lost("cannot write to it")
	}
	return ok, nil
}

// deviceFree serves "device_free ADDR".
func (p *Policy) deviceFree(line, rest []byte) error {
	addr, ok := parseUint(rest)
	if !ok {
		return p.fail(line, ErrProtocol, "want device_free ADDR")
	}
	size, ok := p.segs.Get(addr)
	if !ok {
		return p.fail(line, ErrPlacement, fmt.Sprintf("device_free of %#x, which is not a segment it holds", addr))
	}
	if a, n, ok := p.blocks.Ceil(addr); ok && a < addr+size {
		return p.fail(line, ErrPlacement, fmt.Sprintf("device_free of segment %s with block %s live in it", fmtBlock(policies.Block{Addr: addr, Size: size}), fmtBlock(policies.Block{Addr: a, Size: n})))
	}
	if err := p.dev.Free(addr); err != nil {
		return p.fail(line, ErrDevice, "the device failed: "+err.Error())
	}
	p.segs.Delete(addr)
	return nil
}

// fmtBlock formats b as [ADDR, +SIZE).
func fmtBlock(b policies.Block) string { return fmt.Sprintf("[%#x, +%d)", b.Addr, b.Size) }

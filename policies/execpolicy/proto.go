package execpolicy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gpualloc/allocsim/trace/atomicfile"
)

// The kinds of failure an *Error wraps: match them with errors.Is.
var (
	// ErrProtocol: a line of the child's output is not what the protocol
	// allows there (a malformed line, a wrong answer, a bad handshake).
	ErrProtocol = errors.New("protocol error")
	// ErrPlacement: the child placed a block outside the device segments
	// it holds or over a live block, or freed a segment it does not hold
	// or that holds a live block.
	ErrPlacement = errors.New("bad placement")
	// ErrChild: the child wrote an error line.
	ErrChild = errors.New("the child failed")
	// ErrExited: the child could not start, or exited or closed its
	// output before the end of the events, or exited with a non-zero
	// status at the end.
	ErrExited = errors.New("the child exited")
	// ErrTimeout: the child did not answer, or did not take the engine's
	// input, within the timeout; it was killed.
	ErrTimeout = errors.New("the child did not answer in time")
	// ErrDevice: the device failed a call of the child other than by
	// refusing it for memory (which the child gets as oom).
	ErrDevice = errors.New("device failure")
)

// Error is the failure of an exec policy: its command, the line of the
// child's output at fault, what was wrong, and the last line the child
// wrote to its standard error.
type Error struct {
	// Command is the policy's command line.
	Command string
	// Line is the number of the line of the child's output at fault,
	// from 1 (its handshake); 0 when no line is at fault.
	Line int
	// Text is that line, without its newline.
	Text string
	// Msg says what was wrong.
	Msg string
	// Stderr is the last line the child wrote to its standard error, ""
	// if none.
	Stderr string
	// Err is the kind of failure: ErrProtocol, ErrPlacement, ErrChild,
	// ErrExited, ErrTimeout or ErrDevice.
	Err error
}

func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "exec policy %q: ", e.Command)
	if e.Line > 0 {
		fmt.Fprintf(&b, "output line %d %q: ", e.Line, e.Text)
	}
	b.WriteString(e.Msg)
	if e.Stderr != "" {
		fmt.Fprintf(&b, " (its stderr: %s)", e.Stderr)
	}
	return b.String()
}

// Unwrap returns the kind of failure.
func (e *Error) Unwrap() error { return e.Err }

// fail records the policy's failure, which every later call returns, ends
// the child and returns the failure: an *Error of kind, at line when it is
// not nil.
func (p *Policy) fail(line []byte, kind error, msg string) error {
	if p.err != nil {
		return p.err
	}
	e := &Error{Command: p.command, Msg: msg, Err: kind}
	if line != nil {
		e.Line, e.Text = p.line, string(line)
	}
	if p.child != nil {
		p.child.shutdown()
		e.Stderr = p.child.tail.lastLine()
	}
	p.err = e
	return e
}

// errLong is next's error for a line longer than the reader's buffer.
var errLong = errors.New("line too long")

// next returns the next line of the child's output, without its newline,
// valid until the next read; io.EOF at the end.
func (p *Policy) next() ([]byte, error) {
	line, err := p.out.ReadSlice('\n')
	switch {
	case err == bufio.ErrBufferFull:
		return nil, errLong
	case err != nil && len(line) == 0:
		return nil, err
	case err == nil:
		line = line[:len(line)-1]
	}
	// A last line without its newline is a line all the same.
	p.line++
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	return line, nil
}

// readLine is next, its failures made the policy's.
func (p *Policy) readLine() ([]byte, error) {
	line, err := p.next()
	if err != nil {
		return nil, p.readFailed(err)
	}
	return line, nil
}

func (p *Policy) readFailed(err error) error {
	if err == errLong {
		return p.fail(nil, ErrProtocol, fmt.Sprintf("output line %d is longer than %d bytes", p.line+1, p.out.Size()))
	}
	return p.lost("it closed its output")
}

// lost is the failure of a child that is gone or going (what says how it
// went): a timeout, the error line it wrote last, or how it exited.
func (p *Policy) lost(what string) error {
	if p.err != nil {
		return p.err
	}
	var last []byte // its last error line, if any
	lastAt := 0
	for {
		line, err := p.next()
		if err != nil {
			break
		}
		if verb, _, _ := cut(line); string(verb) == "error" {
			last, lastAt = append(last[:0], line...), p.line
		}
	}
	status := p.child.reap(p.timeout)
	switch {
	case p.child.timedOut.Load():
		return p.fail(nil, ErrTimeout, fmt.Sprintf("no answer to %q within %v: killed", p.req, p.timeout))
	case last != nil:
		p.line = lastAt
		_, rest, _ := cut(last)
		return p.fail(last, ErrChild, "the child failed: "+string(rest))
	}
	msg := fmt.Sprintf("%s while the engine waited for an answer to %q", what, p.req)
	if status != nil {
		msg += ": " + status.Error()
	} else {
		msg += ": exited with status 0"
	}
	return p.fail(nil, ErrExited, msg)
}

// handshake reads the child's first line: allocsim-policy VERSION NAME
// [HOOK...].
func (p *Policy) handshake(line []byte) error {
	f := strings.Fields(string(line))
	if len(f) < 3 || f[0] != "allocsim-policy" {
		return p.fail(line, ErrProtocol, "want the handshake: allocsim-policy VERSION NAME [HOOK...]")
	}
	if f[1] != strconv.Itoa(Version) {
		return p.fail(line, ErrProtocol, fmt.Sprintf("the child speaks protocol version %s; this engine speaks version %d", f[1], Version))
	}
	p.childName = f[2]
	for _, h := range f[3:] {
		switch h {
		case "sync":
			p.hooks.Sync = true
		case "marker":
			p.hooks.Marker = true
		case "empty_cache":
			p.hooks.EmptyCache = true
		case "ack":
			p.hooks.Ack = true
		case "pipeline":
			p.hooks.Pipeline = true
		default:
			return p.fail(line, ErrProtocol, fmt.Sprintf("unknown hook %q (known: sync, marker, empty_cache, ack, pipeline)", h))
		}
	}
	if p.hooks.Ack && p.hooks.Pipeline {
		return p.fail(line, ErrProtocol, "hooks ack and pipeline together: ack waits for every event, pipeline for none")
	}
	return nil
}

// cut cuts b around its first space.
func cut(b []byte) (before, after []byte, found bool) {
	if i := bytes.IndexByte(b, ' '); i >= 0 {
		return b[:i], b[i+1:], true
	}
	return b, nil, false
}

// parseUint parses a decimal or 0x-prefixed hexadecimal number of 64 bits.
func parseUint(b []byte) (uint64, bool) {
	if len(b) > 2 && b[0] == '0' && (b[1] == 'x' || b[1] == 'X') {
		v, err := strconv.ParseUint(string(b[2:]), 16, 64)
		return v, err == nil
	}
	if len(b) == 0 {
		return 0, false
	}
	var v uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		d := uint64(c - '0')
		if v > (math.MaxUint64-d)/10 {
			return 0, false
		}
		v = v*10 + d
	}
	return v, true
}

// EscapeLabel escapes a marker's label for the line "marker LABEL": '\' as
// "\\", a newline as "\n" and a carriage return as "\r"; nothing else.
func EscapeLabel(s string) string {
	if !strings.ContainsAny(s, "\\\n\r") {
		return s
	}
	return strings.NewReplacer(`\`, `\\`, "\n", `\n`, "\r", `\r`).Replace(s)
}

// oneLine returns s with its line breaks made spaces.
func oneLine(s string) string { return strings.NewReplacer("\n", " ", "\r", " ").Replace(s) }

// proc is the child process, apart from the Policy so that the watchdog
// and the cleanup that kills it do not keep the Policy reachable.
type proc struct {
	cmd     *exec.Cmd
	in, out *os.File // the engine's ends of the child's stdin and stdout
	tail    tailWriter

	// seq numbers the engine's blocking reads and writes; waiting is the
	// one in progress, 0 when none. The watchdog kills the child when
	// one lasts longer than the timeout, and sets timedOut.
	seq      uint64
	waiting  atomic.Uint64
	timedOut atomic.Bool

	stop     chan struct{} // closed to end the watchdog
	exited   chan struct{} // closed when the child has exited
	waitErr  error         // cmd.Wait's, once exited is closed
	shutOnce sync.Once
	// unhook removes the kill at an interrupt of the command
	// (atomicfile.OnInterrupt): the child's process group is its own, so
	// the terminal's Ctrl-C does not reach it.
	unhook func()
}

// startProc starts argv with blocking pipes as its standard input and
// output (read and written without the poller: a round trip is two
// context switches, not four), its standard error copied to stderr, in a
// process group of its own that kill ends whole.
func startProc(argv []string, stderr io.Writer, timeout time.Duration) (*proc, error) {
	inR, inW, err := blockingPipe()
	if err != nil {
		return nil, err
	}
	outR, outW, err := blockingPipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return nil, err
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	c := &proc{cmd: cmd, in: inW, out: outR, stop: make(chan struct{}), exited: make(chan struct{})}
	c.tail.w = stderr
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, &c.tail
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.WaitDelay = time.Second
	err = cmd.Start()
	inR.Close()
	outW.Close()
	if err != nil {
		inW.Close()
		outR.Close()
		return nil, err
	}
	c.unhook = atomicfile.OnInterrupt(c.kill)
	go func() {
		c.waitErr = cmd.Wait()
		close(c.exited)
	}()
	go c.watch(timeout)
	return c, nil
}

// blockingPipe returns a pipe whose ends are blocking files.
func blockingPipe() (r, w *os.File, err error) {
	var fds [2]int
	if err := syscall.Pipe2(fds[:], syscall.O_CLOEXEC); err != nil {
		return nil, nil, fmt.Errorf("pipe: %w", err)
	}
	return os.NewFile(uintptr(fds[0]), "|0"), os.NewFile(uintptr(fds[1]), "|1"), nil
}

// watch kills the child when a read or write of the engine blocks for
// longer than timeout.
func (c *proc) watch(timeout time.Duration) {
	tick := max(timeout/10, 5*time.Millisecond)
	t := time.NewTicker(tick)
	defer t.Stop()
	var last uint64
	var idle time.Duration
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
		}
		w := c.waiting.Load()
		if w == 0 || w != last {
			last, idle = w, 0
			continue
		}
		if idle += tick; idle >= timeout {
			c.timedOut.Store(true)
			c.kill()
			return
		}
	}
}

// kill kills the child's process group, unless the child was reaped.
func (c *proc) kill() {
	select {
	case <-c.exited:
	default:
		syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
	}
}

// reap waits for the child to exit, killing it after timeout, and returns
// how it exited: nil for status 0.
func (c *proc) reap(timeout time.Duration) error {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-c.exited:
		return c.waitErr
	case <-t.C:
		c.timedOut.Store(true)
		c.kill()
		<-c.exited
		return fmt.Errorf("did not exit within %v: killed", timeout)
	}
}

// shutdown kills the child if it runs, waits for it, and releases the
// pipes and the watchdog. It may be called more than once.
func (c *proc) shutdown() {
	c.shutOnce.Do(func() {
		c.kill()
		<-c.exited
		c.unhook()
		close(c.stop)
		c.in.Close()
		c.out.Close()
	})
}

// watchedReader and watchedWriter are the child's stdout and stdin, each
// call watched for the timeout.
type watchedReader struct{ c *proc }

func (r watchedReader) Read(b []byte) (int, error) {
	r.c.seq++
	r.c.waiting.Store(r.c.seq)
	n, err := r.c.out.Read(b)
	r.c.waiting.Store(0)
	return n, err
}

type watchedWriter struct{ c *proc }

func (w watchedWriter) Write(b []byte) (int, error) {
	w.c.seq++
	w.c.waiting.Store(w.c.seq)
	n, err := w.c.in.Write(b)
	w.c.waiting.Store(0)
	return n, err
}

// tailWriter passes the child's stderr on to w and keeps its last bytes.
type tailWriter struct {
	w   io.Writer
	mu  sync.Mutex
	buf []byte
}

const tailMax = 4096

func (t *tailWriter) Write(b []byte) (int, error) {
	t.w.Write(b) // the child's stderr is best effort
	t.mu.Lock()
	t.buf = append(t.buf, b...)
	if len(t.buf) > tailMax {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-tailMax:]...)
	}
	t.mu.Unlock()
	return len(b), nil
}

// lastLine returns the last non-empty line written, at most 300 bytes.
func (t *tailWriter) lastLine() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := strings.TrimRight(string(t.buf), " \t\r\n")
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	return s
}

// Package tracefile opens trace files of any supported format, detected from
// their content, finds the traces a glob or a directory names, and writes
// native traces.
package tracefile

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/gpualloc/allocsim/trace"
	"github.com/gpualloc/allocsim/trace/atomicfile"
	"github.com/gpualloc/allocsim/trace/cupy"
	"github.com/gpualloc/allocsim/trace/kineto"
	"github.com/gpualloc/allocsim/trace/minimalloc"
	"github.com/gpualloc/allocsim/trace/pytorch"
	"github.com/gpualloc/allocsim/trace/rmm"
	"github.com/gpualloc/allocsim/trace/xspace"
)

// Formats lists the names accepted by Options.From besides "auto".
var Formats = []string{"native", "pytorch", "kineto", "rmm", "minimalloc", "cupy", "text", "xspace"}

// Options say how to open a trace file.
type Options struct {
	// From names the file's format: "auto" (or "") to detect it from the
	// content, or one of Formats.
	From string
	// Device selects the device of a multi-device source (a PyTorch
	// snapshot's device_traces index, a torch.profiler trace's CUDA Device Id, a CuPy log's device_id).
	Device int
}

// File is an open trace: a trace.Source over a file, to be closed.
type File struct {
	trace.Source
	// Format is the format the file was read as.
	Format string
	f      *os.File
	path   string
	opts   Options
}

// Stacks returns the stack table of the trace's mallocs (trace.StackSource),
// nil when its format or file carries none.
func (f *File) Stacks() *trace.Stacks { return trace.StacksOf(f.Source) }

// Next returns the trace's next event, io.EOF at its end. Any other error
// is a *ReadError.
func (f *File) Next() (trace.Event, error) {
	ev, err := f.Source.Next()
	if err != nil && err != io.EOF {
		return ev, &ReadError{Path: f.path, Err: err}
	}
	return ev, err
}

// ReadError is an error reading the events of the trace file at Path: its
// format's error (a *trace.FormatError, a *trace.SyntaxError, an
// importer's), which names the file already, so that a caller matches it
// with errors.As rather than adding the path again.
type ReadError struct {
	Path string
	Err  error
}

func (e *ReadError) Error() string { return e.Err.Error() }

func (e *ReadError) Unwrap() error { return e.Err }

// NameError returns an error of a replay of the trace file at path that
// names the file: a *ReadError as it is, since it names the file already,
// and any other error (a policy's, the engine's) as "path: err", wrapped.
// It returns nil for nil.
func NameError(path string, err error) error {
	var re *ReadError
	if err == nil || errors.As(err, &re) {
		return err
	}
	return fmt.Errorf("%s: %w", path, err)
}

// ReadAll reads the whole trace at path into memory, for the many replays
// of a search: its header and its events in order. It returns Open's error
// as it is and an error reading the events as a *ReadError (which names
// the file).
func ReadAll(path string, opts Options) (trace.Header, []trace.Event, error) {
	f, err := Open(path, opts)
	if err != nil {
		return trace.Header{}, nil, err
	}
	defer f.Close()
	evs, err := trace.ReadAll(f)
	if err != nil {
		return trace.Header{}, nil, err
	}
	return f.Header(), evs, nil
}

// Close closes the underlying file.
func (f *File) Close() error { return f.f.Close() }

// Reopen starts the trace over from its first event: it opens the file
// again, closes the old one, and returns f, whose Next reads from the start.
func (f *File) Reopen() (trace.Source, error) {
	again, err := Open(f.path, f.opts)
	if err != nil {
		return nil, err
	}
	f.f.Close()
	f.Source, f.f = again.Source, again.f
	return f, nil
}

// Open opens the trace at path. The format is detected from the first
// bytes unless opts.From names one: the native format by its magic, a
// PyTorch snapshot (pickle, possibly gzip-compressed), a torch.profiler
// trace (Chrome trace JSON, possibly gzip-compressed), an RMM log (CSV), a
// CuPy DebugPrintHook log (JSON lines), or the text form.
// An XSpace, the XLA profiler's (.xplane.pb, possibly gzip-compressed), is
// told by its first plane's name. Errors name the file.
func Open(path string, opts Options) (*File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	src, format, err := open(f, path, opts)
	if err != nil {
		f.Close()
		return nil, err
	}
	return &File{Source: src, Format: format, f: f, path: path, opts: opts}, nil
}

func open(f *os.File, path string, opts Options) (trace.Source, string, error) {
	if opts.Device < 0 {
		return nil, "", fmt.Errorf("%s: device %d: a device index is 0 or more", path, opts.Device)
	}
	if st, err := f.Stat(); err == nil && st.IsDir() {
		return nil, "", fmt.Errorf("%s: is a directory, not a trace", path)
	}
	br := bufio.NewReaderSize(f, 64<<10)
	head, _ := br.Peek(512)
	format := opts.From
	if format == "" || format == "auto" {
		format = Detect(head)
		if format == "" {
			return nil, "", fmt.Errorf("%s: not a trace: neither a native trace, a PyTorch snapshot, a torch.profiler trace, an RMM log, a MiniMalloc problem, a CuPy log, the text form nor an XSpace at byte 0 (first bytes %q)", path, abbreviate(head))
		}
	}
	switch format {
	case "rmm", "minimalloc", "cupy", "text":
		// The text formats, gzip-compressed or not: read through the
		// decompressor (errors then count lines and bytes of the
		// decompressed log).
		if isGzip(head) && detectText(trace.GunzipHead(head)) == format {
			in := &countingReader{r: br}
			zr, err := gzip.NewReader(in)
			if err != nil {
				return nil, "", fmt.Errorf("%s: gzip: %w", path, err)
			}
			br = bufio.NewReaderSize(&gzipText{zr: zr, in: in}, 64<<10)
			head, _ = br.Peek(512)
		}
		// Binary data is no such file, and quoting it in an error helps
		// nobody.
		if nul := bytes.IndexByte(head, 0); nul >= 0 || isGzip(head) {
			what := fmt.Sprintf("binary data (a NUL byte at byte %d)", nul)
			if isGzip(head) {
				what = "gzip-compressed data (from byte 0)"
			}
			guess := ""
			if d := Detect(head); d != "" && d != format {
				guess = fmt.Sprintf("; it looks like a %s trace (--from auto reads it)", d)
			}
			name := map[string]string{"rmm": "an RMM log", "minimalloc": "a MiniMalloc CSV", "cupy": "a CuPy log", "text": "the text form"}[format]
			return nil, "", fmt.Errorf("%s: %s, not %s (--from %s)%s", path, what, name, format, guess)
		}
	}
	switch format {
	case "native":
		r, err := trace.NewReader(br, path)
		return r, format, err
	case "pytorch":
		// Import reads a snapshot twice; from the file itself it seeks
		// back, where from br it would keep a copy of the whole file.
		var in io.Reader = br
		if _, err := f.Seek(0, io.SeekStart); err == nil {
			in = f
		}
		src, err := pytorch.Import(in, path, pytorch.Options{Device: opts.Device})
		return src, format, err
	case "xspace":
		// Import reads an XSpace twice, seeking in the file.
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return nil, "", fmt.Errorf("%s: %w", path, err)
		}
		src, err := xspace.Import(f, path, xspace.Options{Device: opts.Device})
		return src, format, err
	case "kineto":
		src, err := kineto.Import(br, path, kineto.Options{Device: opts.Device})
		if err != nil {
			return nil, "", err
		}
		return src, format, nil
	case "rmm":
		lr := trace.NewLineReader(br, path)
		src, err := rmm.Import(lr, path)
		if err != nil {
			return nil, "", err
		}
		return &completeSource{Source: src, lr: lr}, format, nil
	case "minimalloc":
		// Read whole by Import, so checked at once.
		lr := trace.NewLineReader(br, path)
		src, err := minimalloc.Import(lr, path)
		if err == nil {
			err = lr.Complete()
		}
		if err != nil {
			return nil, "", err
		}
		return src, format, nil
	case "cupy":
		lr := trace.NewLineReader(br, path)
		src, err := cupy.Import(lr, path, cupy.Options{Device: opts.Device})
		if err != nil {
			return nil, "", err
		}
		return &completeSource{Source: src, lr: lr}, format, nil
	case "text":
		// Read one line at a time, as the events are asked for: the
		// header and what precedes the first event are checked at once,
		// the rest (and the last line's newline) as it is read.
		lr := trace.NewLineReader(br, path)
		src, err := trace.NewTextReader(lr, path)
		if err != nil {
			return nil, "", err
		}
		return &completeSource{Source: src, lr: lr}, format, nil
	}
	return nil, "", fmt.Errorf("unknown trace format %q (known: auto, %s)", format, strings.Join(Formats, ", "))
}

// completeSource is a source read from a text file: at its end, the file
// must have ended with a whole line (trace.LineReader.Complete), else the
// end is an error instead of io.EOF.
type completeSource struct {
	trace.Source
	lr *trace.LineReader
}

// Stacks returns the stack table of the source read (trace.StackSource),
// nil when it has none.
func (s *completeSource) Stacks() *trace.Stacks { return trace.StacksOf(s.Source) }

func (s *completeSource) Next() (trace.Event, error) {
	ev, err := s.Source.Next()
	if err == io.EOF {
		if cerr := s.lr.Complete(); cerr != nil {
			return ev, cerr
		}
	}
	return ev, err
}

// Detect names the format of a file from its first bytes: "native",
// "xspace", "kineto" (tried before "pytorch", which claims every gzip
// file), "pytorch", "rmm", "minimalloc", "cupy", "text", or "" when none matches.
func Detect(head []byte) string {
	switch {
	case bytes.HasPrefix(head, []byte(trace.Magic)):
		return "native"
	case xspace.Detect(head): // before the formats that take any gzip file
		return "xspace"
	case kineto.Detect(head):
		return "kineto"
	}
	if isGzip(head) {
		// A gzip-compressed log of a text format, before the snapshots,
		// which take any gzip file.
		if f := detectText(trace.GunzipHead(head)); f != "" {
			return f
		}
	}
	if pytorch.Detect(head) {
		return "pytorch"
	}
	return detectText(head)
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// gzipText decompresses a gzip-compressed text log; a damaged or cut stream
// is an error that says where, in the file and in the log.
type gzipText struct {
	zr  *gzip.Reader
	in  *countingReader
	out int64
}

func (g *gzipText) Read(p []byte) (int, error) {
	n, err := g.zr.Read(p)
	g.out += int64(n)
	if err != nil && err != io.EOF {
		err = fmt.Errorf("gzip-compressed data damaged or cut short by byte %d of the file (after %d bytes of the log): %w", g.in.n, g.out, err)
	}
	return n, err
}

// isGzip reports whether head starts a gzip stream.
func isGzip(head []byte) bool { return bytes.HasPrefix(head, []byte{0x1f, 0x8b}) }

// detectText names the text format head starts (rmm, minimalloc, cupy,
// text), "" if none.
func detectText(head []byte) string {
	switch {
	case len(head) == 0:
		return ""
	case rmm.Detect(head):
		return "rmm"
	case minimalloc.Detect(head):
		return "minimalloc"
	case cupy.Detect(head):
		return "cupy"
	case looksLikeText(head):
		return "text"
	}
	return ""
}

// looksLikeText reports whether head starts like the text form: printable
// text whose first word (past comments and blank lines) is "header" or an
// op name.
func looksLikeText(head []byte) bool {
	for _, c := range head {
		if c == 0 || (c < 0x20 && c != '\n' && c != '\r' && c != '\t') {
			return false
		}
	}
	for _, line := range strings.Split(string(head), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		word, _, _ := strings.Cut(line, " ")
		if word == "header" {
			return true
		}
		_, ok := trace.ParseOp(word)
		return ok
	}
	return false
}

func abbreviate(b []byte) []byte {
	if len(b) > 16 {
		return b[:16]
	}
	return b
}

// WriteSource writes the events of src to a native trace at path,
// atomically (see atomicfile.WriteFile), and returns the number of events written.
func WriteSource(path string, src trace.Source) (events uint64, err error) {
	err = atomicfile.WriteFile(path, func(w io.Writer) error {
		events, err = WriteNative(w, src)
		return err
	})
	return events, err
}

// WriteNative writes the events of src to w as a native trace and returns
// the number of events written.
func WriteNative(w io.Writer, src trace.Source) (events uint64, err error) {
	tw, err := trace.NewWriter(w, src.Header())
	if err != nil {
		return 0, err
	}
	tw.SetStacks(trace.StacksOf(src))
	for {
		ev, err := src.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return tw.Events(), err
		}
		if err := tw.Write(ev); err != nil {
			return tw.Events(), err
		}
	}
	return tw.Events(), tw.Close()
}

// Import converts the trace at in (any format Open reads) to a native trace
// at out, written atomically. It returns the number of events written and
// the input's format.
func Import(in, out string, opts Options) (events uint64, format string, err error) {
	src, err := Open(in, opts)
	if err != nil {
		return 0, "", err
	}
	defer src.Close()
	events, err = WriteSource(out, src)
	return events, src.Format, err
}

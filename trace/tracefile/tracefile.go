// Package tracefile opens trace files of any supported format, detected from
// their content, and writes output files atomically.
package tracefile

import (
	"errors"

	"os/signal"
	"sync"
	"syscall"

	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/gpualloc/allocsim/trace"
	"github.com/gpualloc/allocsim/trace/minimalloc"
	"github.com/gpualloc/allocsim/trace/pytorch"
	"github.com/gpualloc/allocsim/trace/rmm"
)

// Formats lists the names accepted by Options.From besides "auto".
var Formats = []string{"native", "pytorch", "rmm", "minimalloc", "text"}

// Options say how to open a trace file.
type Options struct {
	// From names the file's format: "auto" (or "") to detect it from the
	// content, or one of Formats.
	From string
	// Device selects the device of a multi-device source (a PyTorch
	// snapshot's device_traces index).
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
// PyTorch snapshot (pickle, possibly gzip-compressed), an RMM log (CSV), or
// the text form.
// Errors name the file.
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
	if st, err := f.Stat(); err == nil && st.IsDir() {
		return nil, "", fmt.Errorf("%s: is a directory, not a trace", path)
	}
	br := bufio.NewReaderSize(f, 64<<10)
	head, _ := br.Peek(512)
	format := opts.From
	if format == "" || format == "auto" {
		format = Detect(head)
		if format == "" {
			return nil, "", fmt.Errorf("%s: not a trace: neither a native trace, a PyTorch snapshot, an RMM log, a MiniMalloc problem nor the text form (first bytes %q)", path, abbreviate(head))
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
	case "rmm":
		src, err := rmm.Import(br, path)
		if err != nil {
			return nil, "", err
		}
		return src, format, nil
	case "minimalloc":
		src, err := minimalloc.Import(br, path)
		if err != nil {
			return nil, "", err
		}
		return src, format, nil
	case "text":
		h, evs, err := trace.ParseText(path, br)
		if err != nil {
			return nil, "", err
		}
		return trace.NewSliceSource(h, evs), format, nil
	}
	return nil, "", fmt.Errorf("unknown trace format %q (known: auto, %s)", format, strings.Join(Formats, ", "))
}

// Detect names the format of a file from its first bytes: "native",
// "pytorch", "rmm", "minimalloc", "text", or "" when none matches.
func Detect(head []byte) string {
	switch {
	case bytes.HasPrefix(head, []byte(trace.Magic)):
		return "native"
	case pytorch.Detect(head):
		return "pytorch"
	case rmm.Detect(head):
		return "rmm"
	case minimalloc.Detect(head):
		return "minimalloc"
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

// pending holds the temporary files of the AtomicFiles being written, so
// that RemoveOnInterrupt can delete them.
var pending = struct {
	sync.Mutex
	names map[string]bool
}{names: map[string]bool{}}

// RemoveOnInterrupt makes SIGINT and SIGTERM delete the temporary files of
// the outputs being written, then exit with status 130 (SIGINT) or 143
// (SIGTERM), so an interrupted command leaves no partial output behind. A
// main calls it once at its start.
func RemoveOnInterrupt() {
	c := make(chan os.Signal, 1)
	signal.Notify(c, os.Interrupt, syscall.SIGTERM)
	go func() {
		sig := <-c
		pending.Lock()
		for name := range pending.names {
			os.Remove(name)
		}
		code := 130
		if sig == syscall.SIGTERM {
			code = 143
		}
		fmt.Fprintf(os.Stderr, "%s: interrupted (%v): no output written\n", filepath.Base(os.Args[0]), sig)
		os.Exit(code) // with the lock held: no new file is committed
	}()
}

// AtomicFile is an output file that appears at its path only when Commit
// succeeds: it is written to a temporary file in the same directory and
// renamed. A path that exists and is not a regular file (a pipe,
// /dev/stdout) is written directly.
type AtomicFile struct {
	f      *os.File
	path   string
	direct bool
	done   bool
}

// Create starts writing path atomically, creating its directory if needed.
func Create(path string) (*AtomicFile, error) {
	if st, err := os.Stat(path); err == nil && !st.Mode().IsRegular() {
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			return nil, err
		}
		return &AtomicFile{f: f, path: path, direct: true}, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	pending.Lock()
	defer pending.Unlock()
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err // the temporary name means nothing to the user
		}
		return nil, fmt.Errorf("cannot write %s: %w", path, err)
	}
	pending.names[f.Name()] = true
	return &AtomicFile{f: f, path: path}, nil
}

// Write writes to the temporary file.
func (a *AtomicFile) Write(p []byte) (int, error) { return a.f.Write(p) }

// Commit closes the temporary file and renames it to the path.
func (a *AtomicFile) Commit() error {
	if a.done {
		return nil
	}
	a.done = true
	if a.direct {
		return a.f.Close()
	}
	pending.Lock()
	defer pending.Unlock()
	delete(pending.names, a.f.Name())
	if err := a.f.Close(); err != nil {
		os.Remove(a.f.Name())
		return err
	}
	if err := os.Chmod(a.f.Name(), 0o644); err != nil {
		os.Remove(a.f.Name())
		return err
	}
	if err := os.Rename(a.f.Name(), a.path); err != nil {
		os.Remove(a.f.Name())
		return err
	}
	return nil
}

// Abort removes the temporary file; after Commit it does nothing. It is
// safe to defer.
func (a *AtomicFile) Abort() {
	if a.done {
		return
	}
	a.done = true
	a.f.Close()
	if !a.direct {
		pending.Lock()
		delete(pending.names, a.f.Name())
		pending.Unlock()
		os.Remove(a.f.Name())
	}
}

// WriteFile writes path atomically with the bytes write produces.
func WriteFile(path string, write func(w io.Writer) error) error {
	a, err := Create(path)
	if err != nil {
		return err
	}
	defer a.Abort()
	bw := bufio.NewWriter(a)
	if err := write(bw); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	return a.Commit()
}

// WriteSource writes the events of src to a native trace at path,
// atomically (see WriteFile), and returns the number of events written.
func WriteSource(path string, src trace.Source) (events uint64, err error) {
	err = WriteFile(path, func(w io.Writer) error {
		tw, err := trace.NewWriter(w, src.Header())
		if err != nil {
			return err
		}
		for {
			ev, err := src.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				return err
			}
			if err := tw.Write(ev); err != nil {
				return err
			}
		}
		events = tw.Events()
		return tw.Close()
	})
	return events, err
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

// Package atomicfile writes output files atomically: a file appears at its
// path complete or not at all, also when the command is interrupted. It
// imports nothing of this module, so that any package may write its output
// through it.
package atomicfile

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
)

// pending holds the temporary files of the Files being written, so
// that RemoveOnInterrupt can delete them.
var pending = struct {
	sync.Mutex
	names map[string]bool
	// committed lists the paths this process put in place, for the
	// message of an interrupt.
	committed []string
	// cleanups run at an interrupt, by key (OnInterrupt).
	cleanups map[int]func()
	nextKey  int
}{names: map[string]bool{}, cleanups: map[int]func(){}}

// OnInterrupt makes RemoveOnInterrupt run f before the command exits, as
// it removes the outputs being written: for what the command started
// outside itself and must not leave running (an exec policy's child
// process, in a process group of its own that the terminal's signal does
// not reach). The cancel it returns, called when that is ended, removes f.
func OnInterrupt(f func()) (cancel func()) {
	pending.Lock()
	defer pending.Unlock()
	k := pending.nextKey
	pending.nextKey++
	pending.cleanups[k] = f
	return func() {
		pending.Lock()
		delete(pending.cleanups, k)
		pending.Unlock()
	}
}

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
		for _, f := range pending.cleanups {
			f()
		}
		what := keptNote(pending.committed)
		if f, _ := interruptNote.Load().(func() string); f != nil {
			what = f()
		}
		fmt.Fprintf(os.Stderr, "%s: interrupted (%v): %s\n", filepath.Base(os.Args[0]), sig, what)
		os.Exit(SignalStatus(sig)) // with the lock held: no new file is committed
	}()
}

// keptNote says what an interrupted command leaves: "no output written",
// or the files it had put in place before the signal (a Batch's, all of
// them), the first few named.
func keptNote(committed []string) string {
	switch n := len(committed); {
	case n == 0:
		return "no output written"
	case n <= 4:
		return fmt.Sprintf("the outputs were written before it: %s", strings.Join(committed, ", "))
	default:
		return fmt.Sprintf("the %d outputs were written before it: %s, ...", n, strings.Join(committed[:4], ", "))
	}
}

// interruptNote holds the func that says what an interrupted command
// kept (SetInterruptNote).
var interruptNote atomic.Value

// SetInterruptNote makes RemoveOnInterrupt say what note returns instead
// of "no output written": for a command that keeps finished work, as a
// sweep keeps its finished cells. note runs on the signal's goroutine.
func SetInterruptNote(note func() string) { interruptNote.Store(note) }

// SignalStatus is the exit status of a command that sig stopped: 128 + the
// signal's number, as a shell reports it (130 for SIGINT, 143 for
// SIGTERM).
func SignalStatus(sig os.Signal) int {
	if s, ok := sig.(syscall.Signal); ok {
		return 128 + int(s)
	}
	return 130 // os.Interrupt on a system without signal numbers
}

// File is an output file that appears at its path only when Commit
// succeeds: it is written to a temporary file in the same directory and
// renamed. A path that exists and is not a regular file (a pipe,
// /dev/stdout) is written directly.
type File struct {
	f      *os.File
	path   string
	direct bool
	done   bool
	closed bool // Close was called: the temporary file is complete
}

// Create starts writing path atomically, creating its directory if needed.
// The error of a file that cannot be created names the path.
func Create(path string) (*File, error) {
	if st, err := os.Stat(path); err == nil && !st.Mode().IsRegular() {
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			return nil, err
		}
		return &File{f: f, path: path, direct: true}, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	removeStale(path)
	pending.Lock()
	defer pending.Unlock()
	f, err := os.CreateTemp(filepath.Dir(path), fmt.Sprintf(".%s.tmp-%d-*", filepath.Base(path), os.Getpid()))
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err // the temporary name means nothing to the user
		}
		return nil, fmt.Errorf("cannot write %s: %w", path, err)
	}
	pending.names[f.Name()] = true
	return &File{f: f, path: path}, nil
}

// removeStale removes the temporary files of path left by processes that
// no longer run (killed while writing it): their names carry the writer's
// process id. Those of a live process, writing path at the same time, stay.
func removeStale(path string) {
	base := "." + filepath.Base(path) + ".tmp-"
	names, _ := filepath.Glob(filepath.Join(filepath.Dir(path), base+"*"))
	for _, name := range names {
		rest := strings.TrimPrefix(filepath.Base(name), base)
		pid, err := strconv.Atoi(rest[:max(strings.IndexByte(rest, '-'), 0)])
		if err != nil || pid <= 0 || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			os.Remove(name)
		}
	}
}

// Write writes to the temporary file. An error names the path, not the
// temporary file (a full disk: "cannot write out.json: no space left on
// device").
func (a *File) Write(p []byte) (int, error) {
	n, err := a.f.Write(p)
	return n, a.named(err)
}

// named makes an error of the temporary file name the path instead.
func (a *File) named(err error) error {
	if err == nil || a.direct {
		return err
	}
	var pe *os.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	var le *os.LinkError
	if errors.As(err, &le) {
		err = le.Err
	}
	return fmt.Errorf("cannot write %s: %w", a.path, err)
}

// Close closes the temporary file without putting it in place, so that
// the descriptor is freed while the file waits for Commit (a Batch of many
// files); it returns the error of the close, naming the path. Commit puts
// it in place, Abort removes it; a second Close does nothing.
func (a *File) Close() error {
	if a.closed || a.done {
		return nil
	}
	a.closed = true
	return a.named(a.f.Close())
}

// Commit closes the temporary file and renames it to the path. On error
// the temporary file is removed and the path left as it was.
func (a *File) Commit() error {
	pending.Lock()
	defer pending.Unlock()
	return a.commitLocked()
}

// commitLocked is Commit with pending locked.
func (a *File) commitLocked() error {
	if a.done {
		return nil
	}
	a.done = true
	if a.direct {
		if a.closed {
			return nil
		}
		return a.f.Close()
	}
	delete(pending.names, a.f.Name())
	if !a.closed {
		a.closed = true
		if err := a.f.Close(); err != nil {
			os.Remove(a.f.Name())
			return a.named(err)
		}
	}
	if err := os.Chmod(a.f.Name(), 0o644); err != nil {
		os.Remove(a.f.Name())
		return a.named(err)
	}
	if err := os.Rename(a.f.Name(), a.path); err != nil {
		os.Remove(a.f.Name())
		return a.named(err)
	}
	pending.committed = append(pending.committed, a.path)
	return nil
}

// Abort removes the temporary file; after Commit it does nothing. It is
// safe to defer.
func (a *File) Abort() {
	pending.Lock()
	defer pending.Unlock()
	a.abortLocked()
}

// abortLocked is Abort with pending locked.
func (a *File) abortLocked() {
	if a.done {
		return
	}
	a.done = true
	if !a.closed {
		a.f.Close()
	}
	if !a.direct {
		delete(pending.names, a.f.Name())
		os.Remove(a.f.Name())
	}
}

// WriteFile writes path atomically with the bytes write produces; it
// returns write's error, or that of creating, writing or renaming the
// file, and on error leaves path as it was.
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

// ErrInput is the error of CheckOutput for an output that is an input.
var ErrInput = errors.New("is also an input: refusing to write over it")

// CheckOutput returns an error wrapping ErrInput when out names one of the
// files inputs names: the same file by identity (os.SameFile), so another
// path to it or a link counts. "" (no output) and "-" (stdout) are no
// file; an output that does not exist yet is no input.
func CheckOutput(out string, inputs []string) error {
	if out == "" || out == "-" {
		return nil
	}
	oi, err := os.Stat(out)
	if err != nil {
		return nil
	}
	for _, in := range inputs {
		if ii, err := os.Stat(in); err == nil && os.SameFile(oi, ii) {
			return fmt.Errorf("%s %w", out, ErrInput)
		}
	}
	return nil
}

// Batch is a set of output files that appear together or not at all: each
// is written to its temporary file (Create, WriteFile), and Commit renames
// them all into place while RemoveOnInterrupt waits, so that an interrupt
// leaves either every file of the batch or none of them, the earlier files
// at those paths as they were. The zero Batch is empty and ready.
type Batch struct {
	files []*File
}

// Create starts writing path as a file of the batch (see Create).
func (b *Batch) Create(path string) (*File, error) {
	f, err := Create(path)
	if err != nil {
		return nil, err
	}
	b.files = append(b.files, f)
	return f, nil
}

// WriteFile writes path through write into a file of the batch, flushed
// and closed (File.Close), to be put in place by Commit. It returns
// write's error or that of creating, writing or closing the file; the
// file is then dropped from the batch and removed.
func (b *Batch) WriteFile(path string, write func(w io.Writer) error) error {
	f, err := Create(path)
	if err != nil {
		return err
	}
	bw := bufio.NewWriter(f)
	err = write(bw)
	if err == nil {
		err = bw.Flush()
	}
	if err == nil {
		err = f.Close()
	}
	if err != nil {
		f.Abort()
		return err
	}
	b.files = append(b.files, f)
	return nil
}

// Paths returns the paths of the batch's files, in the order they were
// added.
func (b *Batch) Paths() []string {
	out := make([]string, len(b.files))
	for k, f := range b.files {
		out[k] = f.path
	}
	return out
}

// Commit puts every file of the batch in place, in order, with the
// interrupt handler held off until the last is renamed. It returns the
// first error (a close or a rename that failed, naming the path); the
// files of the batch are then all taken back: those put in place before it
// get their earlier contents again (kept by a hard link while the batch
// commits; where the file system has none, the new file stays), and the
// others are removed.
func (b *Batch) Commit() error {
	pending.Lock()
	defer pending.Unlock()
	// The earlier files at the batch's paths, linked aside, to be put
	// back if a later file fails; "" where there was none.
	backups := make([]string, len(b.files))
	defer func() {
		for _, name := range backups {
			if name != "" {
				os.Remove(name)
			}
		}
	}()
	for k, f := range b.files {
		if f.direct {
			continue
		}
		if st, err := os.Lstat(f.path); err != nil || !st.Mode().IsRegular() {
			continue
		}
		name := filepath.Join(filepath.Dir(f.path), fmt.Sprintf(".%s.bak-%d-%d", filepath.Base(f.path), os.Getpid(), k))
		os.Remove(name)
		if os.Link(f.path, name) == nil {
			backups[k] = name
		}
	}
	files := b.files
	b.files = nil
	var first error
	done := 0 // files put in place
	for _, f := range files {
		if first != nil {
			f.abortLocked()
			continue
		}
		if first = f.commitLocked(); first == nil {
			done++
		}
	}
	if first == nil {
		return nil
	}
	for k, f := range files[:done] {
		if f.direct {
			continue
		}
		pending.committed = slices.DeleteFunc(pending.committed, func(p string) bool { return p == f.path })
		if backups[k] != "" {
			if os.Rename(backups[k], f.path) == nil {
				backups[k] = ""
			}
		} else {
			os.Remove(f.path)
		}
	}
	return first
}

// Abort removes the temporary files of the batch not yet committed. It is
// safe to defer.
func (b *Batch) Abort() {
	for _, f := range b.files {
		f.Abort()
	}
	b.files = nil
}

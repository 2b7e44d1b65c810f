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
		what := "no output written"
		if f, _ := interruptNote.Load().(func() string); f != nil {
			what = f()
		}
		fmt.Fprintf(os.Stderr, "%s: interrupted (%v): %s\n", filepath.Base(os.Args[0]), sig, what)
		os.Exit(SignalStatus(sig)) // with the lock held: no new file is committed
	}()
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

// Commit closes the temporary file and renames it to the path.
func (a *File) Commit() error {
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
		return a.named(err)
	}
	if err := os.Chmod(a.f.Name(), 0o644); err != nil {
		os.Remove(a.f.Name())
		return a.named(err)
	}
	if err := os.Rename(a.f.Name(), a.path); err != nil {
		os.Remove(a.f.Name())
		return a.named(err)
	}
	return nil
}

// Abort removes the temporary file; after Commit it does nothing. It is
// safe to defer.
func (a *File) Abort() {
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

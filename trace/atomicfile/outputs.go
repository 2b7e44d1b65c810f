package atomicfile

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// DuplicateError is returned by CheckOutputs when two outputs name one
// file, or both name standard output ("-"): a mistake of the command line.
type DuplicateError struct{ msg string }

func (e *DuplicateError) Error() string { return e.msg }

// CheckOutputs returns an error naming the flag when one of the output
// files (pairs of flag name and path; "" is no output, "-" standard
// output) is one of the inputs (CheckOutput), or a *DuplicateError when
// two of them are one file or both standard output. Commands call it
// before any work is done.
func CheckOutputs(inputs []string, flagPaths ...string) error {
	seen := map[string]string{} // a cleaned output path, or "-", -> its flag
	for i := 0; i+1 < len(flagPaths); i += 2 {
		flag, path := flagPaths[i], flagPaths[i+1]
		if err := CheckOutput(path, inputs); err != nil {
			return fmt.Errorf("--%s: %w", flag, err)
		}
		if path == "" {
			continue
		}
		if path == "-" {
			if other, ok := seen["-"]; ok {
				return &DuplicateError{fmt.Sprintf("--%s -: the --%s output goes to stdout already", flag, other)}
			}
			seen["-"] = flag
			continue
		}
		if other, ok := seen[filepath.Clean(path)]; ok {
			return &DuplicateError{fmt.Sprintf("--%s %s: also the --%s output", flag, path, other)}
		}
		seen[filepath.Clean(path)] = flag
	}
	return nil
}

// CheckDir returns an error naming the flag when dir, a directory an
// option writes files into, is one of the inputs, or holds an input whose
// name ends with one of suffixes (the endings of the names of the files it
// writes there, compared without regard to case, as on a file system that
// ignores it): an input that a file written there could replace. ""
// (no directory) and a directory that does not exist yet hold no input.
func CheckDir(inputs []string, flag, dir string, suffixes []string) error {
	if dir == "" {
		return nil
	}
	if err := CheckOutput(dir, inputs); err != nil {
		return fmt.Errorf("--%s: %w", flag, err)
	}
	di, err := os.Stat(dir)
	if err != nil || !di.IsDir() {
		return nil
	}
	for _, in := range inputs {
		pi, err := os.Stat(filepath.Dir(in))
		if err != nil || !os.SameFile(di, pi) {
			continue
		}
		base := strings.ToLower(filepath.Base(in))
		for _, s := range suffixes {
			if strings.HasSuffix(base, strings.ToLower(s)) {
				return fmt.Errorf("--%s %s: its file %s %w", flag, dir, filepath.Base(in), ErrInput)
			}
		}
	}
	return nil
}

// Outputs are a command's outputs, staged and put in place together:
// files in Batch and the bytes for standard output ("-", or the table a
// command prints) in memory, written to Stdout before the files are put in
// place (a full disk or a closed pipe there leaves the files as they
// were). The zero value with Stdout set is ready to use.
type Outputs struct {
	Stdout io.Writer
	Batch  Batch
	parts  []stdoutPart
}

// stdoutPart is an output for stdout: its flag ("" for the table) and its
// bytes.
type stdoutPart struct {
	flag string
	buf  *bytes.Buffer
}

// Add stages the output of --flag: the bytes write produces, for a file at
// path or for standard output when path is "-"; "" is no output. It
// returns write's error or the file's, naming the flag (none when flag is
// ""); the file is then not staged.
func (o *Outputs) Add(flag, path string, write func(io.Writer) error) error {
	switch path {
	case "":
		return nil
	case "-":
		b := new(bytes.Buffer)
		if err := write(b); err != nil {
			return flagError(flag, err)
		}
		o.parts = append(o.parts, stdoutPart{flag: flag, buf: b})
		return nil
	}
	if err := o.Batch.WriteFile(path, write); err != nil {
		return flagError(flag, err)
	}
	return nil
}

func flagError(flag string, err error) error {
	if flag == "" {
		return err
	}
	return fmt.Errorf("--%s: %w", flag, err)
}

// Commit writes the standard output parts in order to Stdout, then puts
// the staged files in place, all of them or none. It returns the first
// error, naming the flag of a part that could not be written ("writing
// standard output" for the table); the files are then not put in place.
func (o *Outputs) Commit() error {
	for _, p := range o.parts {
		if _, err := o.Stdout.Write(p.buf.Bytes()); err != nil {
			if p.flag == "" {
				return fmt.Errorf("writing standard output: %w", err)
			}
			return fmt.Errorf("--%s -: %w", p.flag, err)
		}
	}
	o.parts = nil
	return o.Batch.Commit()
}

// Abort drops the outputs not committed. It is safe to defer.
func (o *Outputs) Abort() {
	o.Batch.Abort()
	o.parts = nil
}

// WriteOutput writes an output file atomically (WriteFile), or to stdout
// when path is "-".
func WriteOutput(stdout io.Writer, path string, write func(io.Writer) error) error {
	if path == "-" {
		return write(stdout)
	}
	return WriteFile(path, write)
}

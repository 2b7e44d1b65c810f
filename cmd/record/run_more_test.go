package main

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/gpualloc/allocsim/trace"
)

// TestImportToStdout: -o - writes the native trace to stdout (the report
// to stderr), and no file named "-".
func TestImportToStdout(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "t.txt")
	if err := os.WriteFile(path, []byte("malloc id=1 size=1MiB\nfree id=1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	stdout, stderr, err := runCmd(t, "import", "-o", "-", path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(stdout, trace.Magic) || stderr != "record: 2 events from "+path+" (text) to stdout\n" {
		t.Errorf("stdout %q, stderr %q", stdout, stderr)
	}
	if _, err := os.Stat(filepath.Join(dir, "-")); err == nil {
		t.Error(`a file named "-" was written`)
	}
	r, err := trace.NewReader(strings.NewReader(stdout), "stdout")
	if err != nil {
		t.Fatal(err)
	}
	evs, err := trace.ReadAll(r)
	if err != nil || len(evs) != 2 {
		t.Errorf("%d events read back: %v", len(evs), err)
	}
}

// TestRecordHelp: every record command's --help, on stdout, has a synopsis, and no
// flag shows a bare "string" for its value.
func TestRecordHelp(t *testing.T) {
	for _, cmd := range []string{"import", "run", "synth"} {
		stdout, stderr, err := runCmd(t, cmd, "--help")
		if err != nil || stderr != "" || !strings.HasPrefix(stdout, "usage: record "+cmd) || strings.Contains(stdout, " string ") {
			t.Errorf("record %s --help: %v\n%s%s", cmd, err, stdout, stderr)
		}
	}
}

var updateHelp = flag.Bool("update-help", false, "rewrite testdata/help/*.golden from the commands' --help")

// TestHelpGolden: record's usage and every command's --help are the golden
// files' text (testdata/help; -update-help rewrites them after a
// deliberate change: read the diff), in the manner of benchstat's golden
// tests.
func TestHelpGolden(t *testing.T) {
	for _, cmd := range []string{"", "import", "run", "synth"} {
		args, name := []string{cmd, "--help"}, cmd
		if cmd == "" {
			args, name = []string{"--help"}, "record"
		}
		stdout, stderr, err := runCmd(t, args...)
		if err != nil {
			t.Errorf("record %s: %v", strings.Join(args, " "), err)
			continue
		}
		got := stdout + stderr
		path := filepath.Join("testdata", "help", name+".golden")
		if *updateHelp {
			os.MkdirAll(filepath.Dir(path), 0o755)
			if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (run go test -run TestHelpGolden -update-help)", err)
		}
		if got != string(want) {
			t.Errorf("record %s differs from %s:\n%s", strings.Join(args, " "), path, got)
		}
	}
}

// TestSynthUsageErrors: record synth's argument errors (no -o, an unknown
// workload or parameter, a value the workload refuses) are usage errors,
// exit 2, naming what is wrong; they exited 1.
func TestSynthUsageErrors(t *testing.T) {
	out := filepath.Join(t.TempDir(), "x.trace")
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"synth", "--workload", "train"}, "-o OUT is required"},
		{[]string{"synth", "--workload", "nosuch", "-o", out}, `unknown workload "nosuch"`},
		{[]string{"synth", "--workload", "train", "--keep", "0.5", "-o", out}, `workload train has no parameter "keep"`},
		{[]string{"synth", "--workload", "train", "--layers", "-1", "-o", out}, "--layers=-1: must be at least 1"},
	} {
		_, _, err := runCmd(t, tc.args...)
		var ec interface{ ExitCode() int }
		if err == nil || !errors.As(err, &ec) || ec.ExitCode() != 2 || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("record %s: %v, want a usage error (exit 2) saying %q", strings.Join(tc.args, " "), err, tc.msg)
		}
	}
	if _, err := os.Stat(out); err == nil {
		t.Errorf("%s written by a refused command", out)
	}
}

// record run refuses, before the program runs, an -o that is the program
// itself or an existing directory (issue 36, item 4).
func TestRunOutputRefused(t *testing.T) {
	dir := t.TempDir()
	prog := filepath.Join(dir, "prog")
	marker := filepath.Join(dir, "ran")
	script := []byte("#!/bin/sh\ntouch " + marker + "\n")
	if err := os.WriteFile(prog, script, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ out, want string }{
		{prog, "run: -o: " + prog + " is also an input: refusing to write over it"},
		{dir, "run: -o " + dir + ": a directory; want a file"},
	} {
		_, _, err := runCmd(t, "run", "-o", tc.out, "--", prog)
		if err == nil || err.Error() != tc.want {
			t.Errorf("-o %s: err = %v, want %s", tc.out, err, tc.want)
		}
		if _, err := os.Stat(marker); err == nil {
			t.Errorf("-o %s: the program ran", tc.out)
		}
		if got, _ := os.ReadFile(prog); !bytes.Equal(got, script) {
			t.Errorf("-o %s: the program changed: %q", tc.out, got)
		}
	}
}

// fullWriter fails every write, as stdout redirected to /dev/full does.
type fullWriter struct{}

func (fullWriter) Write([]byte) (int, error) { return 0, syscall.ENOSPC }

// TestStdoutWriteError: record synth and import whose summary line
// cannot be written to stdout (record ... > /dev/full) fail, naming
// standard output (they exited 0).
func TestStdoutWriteError(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "t.txt")
	if err := os.WriteFile(in, []byte("malloc id=1 size=1MiB\nfree id=1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"synth", "--workload", "random", "--allocations", "10", "-o", filepath.Join(dir, "s.trace")},
		{"import", "-o", filepath.Join(dir, "i.trace"), in},
		{"import", "-o", "-", in},
	} {
		var stderr strings.Builder
		err := run(fullWriter{}, &stderr, args)
		if !errors.Is(err, syscall.ENOSPC) {
			t.Errorf("record %s to a full stdout: %v, want ENOSPC", strings.Join(args, " "), err)
		}
	}
}

package main

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/gpu/interpose"
	"github.com/gpualloc/allocsim/trace/tracefile"
)

func runCmd(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	var out, errb bytes.Buffer
	err := run(&out, &errb, args)
	return out.String(), errb.String(), err
}

// interposer builds the preload library, or skips without a C compiler.
func interposer(t *testing.T) string {
	t.Helper()
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "gcc"
	}
	if _, err := exec.LookPath(cc); err != nil {
		t.Skipf("no C compiler: %v", err)
	}
	lib := filepath.Join(t.TempDir(), interpose.LibraryName)
	out, err := exec.Command(cc, "-O2", "-shared", "-fPIC", "-o", lib, "../../gpu/interpose/preload/interpose.c", "-ldl", "-lpthread").CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	return lib
}

func countEvents(t *testing.T, path string) (int, map[string]string) {
	t.Helper()
	f, err := tracefile.Open(path, tracefile.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n := 0
	for {
		_, err := f.Next()
		if err == io.EOF {
			return n, f.Header().Metadata
		}
		if err != nil {
			t.Fatal(err)
		}
		n++
	}
}

// TestRunExitStatus runs programs that make no CUDA call: the trace is
// written (empty) and the exit status, or the signal, passes through.
func TestRunExitStatus(t *testing.T) {
	lib := interposer(t)
	dir := t.TempDir()
	for _, tc := range []struct {
		name   string
		script string
		code   int
		msg    string
	}{
		{"ok", "exit 0", 0, ""},
		{"status", "exit 7", 7, "exited with status 7"},
		{"signal", "kill -9 $$", 137, "killed by signal 9"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(dir, tc.name+".trace")
			_, stderr, err := runCmd(t, "run", "--interposer", lib, "-o", out, "--", "/bin/sh", "-c", tc.script)
			var es *exitStatus
			switch {
			case tc.code == 0 && err != nil:
				t.Fatal(err)
			case tc.code != 0 && (!errors.As(err, &es) || es.ExitCode() != tc.code || !strings.Contains(err.Error(), tc.msg)):
				t.Fatalf("error %v, want exit %d", err, tc.code)
			}
			n, md := countEvents(t, out)
			if n != 0 || !strings.Contains(stderr, out+": 0 events") || md["command"] != "/bin/sh -c "+strconv.Quote(tc.script) {
				t.Errorf("%d events, metadata %v, stderr %q", n, md, stderr)
			}
		})
	}
}

func TestRunErrors(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"run"}, "run: no program given"},
		{[]string{"run", "--interposer", filepath.Join(dir, "nope.so"), "--", "true"}, "interposer library"},
		{[]string{"run", "--bogus", "--", "true"}, "unknown flag: --bogus"},
	} {
		_, _, err := runCmd(t, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want %q", tc.args, err, tc.want)
		}
	}
}

// TestCard reads the GPU's name and total memory through a runtime, here
// the fake one of package gpu's tests, and gives a zero Card without one.
func TestCard(t *testing.T) {
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "gcc"
	}
	if _, err := exec.LookPath(cc); err != nil {
		t.Skipf("no C compiler: %v", err)
	}
	lib := filepath.Join(t.TempDir(), "libfakecudart.so")
	if out, err := exec.Command(cc, "-O1", "-shared", "-fPIC", "-o", lib, "../../gpu/testdata/fakecudart.c").CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	t.Setenv("FAKECUDA_TOTAL", "150000000000")
	if c := card(lib); c != (interpose.Card{Name: "Fake CUDA Device", Memory: 150000000000}) {
		t.Errorf("card = %+v", c)
	}
	if c := card(filepath.Join(t.TempDir(), "none.so")); c != (interpose.Card{}) {
		t.Errorf("card of no runtime = %+v", c)
	}
}

// record import refuses to write its output over its input.
func TestImportOverInput(t *testing.T) {
	path := filepath.Join(t.TempDir(), "t.txt")
	text := []byte("malloc id=1 size=1MiB\nfree id=1\n")
	if err := os.WriteFile(path, text, 0o644); err != nil {
		t.Fatal(err)
	}
	_, _, err := runCmd(t, "import", "-o", path, path)
	if err == nil || !strings.Contains(err.Error(), "is also an input") {
		t.Errorf("err = %v, want a refusal", err)
	}
	if got, _ := os.ReadFile(path); !bytes.Equal(got, text) {
		t.Errorf("the input changed: %q", got)
	}
}

package replaycli

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/trace/atomicfile"
)

// failAfter is a writer that takes n bytes, then fails as a full disk does.
type failAfter struct{ n int }

var errFull = errors.New("no space left on device")

func (f *failAfter) Write(p []byte) (int, error) {
	if len(p) > f.n {
		k := f.n
		f.n = 0
		return k, errFull
	}
	f.n -= len(p)
	return len(p), nil
}

// TestStdoutWriteError: a command whose table cannot be written to stdout
// (replay sim > /dev/full) fails, naming standard output.
func TestStdoutWriteError(t *testing.T) {
	var errb strings.Builder
	err := run(&failAfter{n: 10}, &errb, []string{"sim", "--policy", "cuda", tokenLengths})
	if err == nil || !errors.Is(err, errFull) || !strings.Contains(err.Error(), "writing standard output") {
		t.Fatalf("replay sim to a full stdout: %v", err)
	}
	if err := run(&failAfter{n: 1 << 20}, &errb, []string{"sim", "--policy", "cuda", tokenLengths}); err != nil {
		t.Fatalf("replay sim with room for its table: %v", err)
	}
}

// TestSimOutputsAllOrNone: replay sim --json --viz --plots whose charts
// cannot be written (--plots names a path under a file) fails and leaves
// every output as it was: the JSON's previous contents, no snapshot (the
// snapshots were put in place as each trace finished, before the charts).
func TestSimOutputsAllOrNone(t *testing.T) {
	dir := t.TempDir()
	jsonPath, vizDir := filepath.Join(dir, "r.json"), filepath.Join(dir, "viz")
	blocker := filepath.Join(dir, "file")
	for _, p := range []string{jsonPath, blocker} {
		if err := os.WriteFile(p, []byte("the previous good results\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var out, errb strings.Builder
	err := run(&out, &errb, []string{"sim", "--policy", "cuda,pytorch", "--json", jsonPath, "--viz", vizDir, "--plots", filepath.Join(blocker, "sub"), tokenLengths})
	if err == nil || !strings.Contains(err.Error(), "--plots") {
		t.Fatalf("replay sim with --plots under a file: %v, want a --plots error", err)
	}
	if b, _ := os.ReadFile(jsonPath); string(b) != "the previous good results\n" {
		t.Errorf("the JSON now holds %q", b)
	}
	if left, _ := os.ReadDir(vizDir); len(left) > 0 {
		t.Errorf("--viz holds %d files: %v", len(left), left)
	}
	if out.Len() > 0 {
		t.Errorf("stdout: %q", out.String())
	}
}

// TestMergeOutputOverInput: replay merge -o DIR DIR, DIR a directory
// with a results.json (no sweep's), is refused before anything is read or
// written: its results.json is the input (merge wrote over it).
func TestMergeOutputOverInput(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "results.json")
	var out, errb strings.Builder
	if err := run(&out, &errb, []string{"sim", "--policy", "cuda", "--json", in, tokenLengths}); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(in)
	out.Reset()
	err := run(&out, &errb, []string{"merge", "-o", dir, dir})
	if !errors.Is(err, atomicfile.ErrInput) {
		t.Fatalf("merge -o DIR DIR: %v, want an error wrapping ErrInput", err)
	}
	if after, _ := os.ReadFile(in); string(after) != string(before) {
		t.Errorf("the input results.json changed")
	}
	if _, err := os.Stat(filepath.Join(dir, "results.csv")); err == nil {
		t.Errorf("results.csv written")
	}
}

// replay gpu --plots DIR refuses, before it opens the CUDA runtime, an
// input that one of its charts would replace, as replay sim does (it ran
// the replay and wrote over it).
func TestGPUPlotsOverInput(t *testing.T) {
	dir := t.TempDir()
	inputs := writeFiles(t, dir, tinyText, "t.txt", "t-memory.svg")
	_, _, err := runCmd(t, "gpu", "--from", "text", "--cudart", filepath.Join(dir, "no-libcudart.so"), "--policy", "cuda", "--plots", dir, inputs[0], inputs[1])
	want := "--plots " + dir + ": its file t-memory.svg is also an input: refusing to write over it"
	if err == nil || err.Error() != want {
		t.Errorf("err = %v, want %s", err, want)
	}
	for _, p := range inputs {
		if got, _ := os.ReadFile(p); string(got) != tinyText {
			t.Errorf("%s changed: %q", p, got)
		}
	}
}

// replay sweep -o DIR refuses, before it runs, a trace that is one of the
// files it writes in DIR (it replayed the trace, then wrote its
// results.csv over it).
func TestSweepOutputOverInput(t *testing.T) {
	dir := t.TempDir()
	in := writeFiles(t, dir, tinyText, "results.csv")[0]
	_, _, err := runCmd(t, "sweep", "--from", "text", "--traces", in, "--policy", "cuda", "--progress", "none", "-o", dir)
	want := "--out: " + in + " is also an input: refusing to write over it"
	if err == nil || err.Error() != want {
		t.Errorf("err = %v, want %s", err, want)
	}
	if got, _ := os.ReadFile(in); string(got) != tinyText {
		t.Errorf("the trace changed: %q", got)
	}
	if _, err := os.Stat(filepath.Join(dir, "plan.json")); err == nil {
		t.Errorf("plan.json written")
	}
}

// replay report -o PAGE --plots DIR whose charts cannot be written fails
// and leaves the earlier page as it was (the page was put in place
// before the charts were drawn).
func TestReportPageAndChartsTogether(t *testing.T) {
	dir := t.TempDir()
	res, page, blocker := filepath.Join(dir, "r.json"), filepath.Join(dir, "r.html"), filepath.Join(dir, "file")
	if _, _, err := runCmd(t, "sim", "--policy", "pytorch,cuda", "--json", res, tokenLengths); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{page, blocker} {
		if err := os.WriteFile(p, []byte("the previous page\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	_, _, err := runCmd(t, "report", "-o", page, "--plots", filepath.Join(blocker, "sub"), res)
	if err == nil || !strings.Contains(err.Error(), "--plots") {
		t.Fatalf("report with --plots under a file: %v, want a --plots error", err)
	}
	if b, _ := os.ReadFile(page); string(b) != "the previous page\n" {
		t.Errorf("the page now holds %.40q", b)
	}
}

// TestVizFileNamesOfExecPolicies: --viz names each snapshot by the policy,
// and an exec: policy's name is its command, with spaces and slashes: the
// file was put under folders named by the command, or outside DIR
// ("a/../../escaped"). Each is one flat file in DIR, and two commands
// whose names meet once made safe get two files.
func TestVizFileNamesOfExecPolicies(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 is not installed: the exec policy runs a Python child")
	}
	dir := t.TempDir()
	vizDir := filepath.Join(dir, "a", "viz")
	const child = "exec:sh -c 'exec python3 ../../../python/examples/firstfit.py' "
	const mlp = "../../../testdata/pytorch/mlp.pickle.gz"
	var out, errb bytes.Buffer
	if err := run(&out, &errb, []string{"sim", "--policy", child + "x/../../../escaped," + child + "x_.._.._.._escaped,first-fit", "--viz", vizDir, mlp}); err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	var got []string
	filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(dir, path)
			got = append(got, rel)
		}
		return nil
	})
	safe := "exec_sh_-c__exec_python3_.._.._.._python_examples_firstfit.py__x_.._.._.._escaped"
	want := []string{"a/viz/mlp." + safe + "-2.pickle", "a/viz/mlp." + safe + ".pickle", "a/viz/mlp.first-fit.pickle"}
	if !slices.Equal(got, want) {
		t.Errorf("files %q, want %q", got, want)
	}
}

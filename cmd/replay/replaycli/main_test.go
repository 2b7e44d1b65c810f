package replaycli

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/trace/tracefile"
)

const splitFragOOM = "../../../testdata/pytorch/split_frag_oom.pickle.gz"

func runCmd(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	var out, errb bytes.Buffer
	err := run(&out, &errb, args)
	return out.String(), errb.String(), err
}

func readResults(t *testing.T, path string) []sim.Result {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct{ Results []sim.Result }
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	return doc.Results
}

// TestSimSplitFragOOM replays the split_frag_oom snapshot under the cap it
// was recorded with: the real allocator reserved at most 3145728000 bytes,
// called cudaMalloc 30 times, retried once and raised one OOM.
func TestSimSplitFragOOM(t *testing.T) {
	dir := t.TempDir()
	js := filepath.Join(dir, "r.json")
	if _, _, err := runCmd(t, "sim", "--policy", "pytorch", "--capacity", "4000MiB", "--json", js, splitFragOOM); err != nil {
		t.Fatal(err)
	}
	rs := readResults(t, js)
	if len(rs) != 1 {
		t.Fatalf("got %d results", len(rs))
	}
	r := rs[0]
	if r.Trace != splitFragOOM || r.Policy != "pytorch" || r.Capacity != 4194304000 {
		t.Errorf("result names %q %q cap %d", r.Trace, r.Policy, r.Capacity)
	}
	if r.PeakReserved != 3145728000 || r.PeakAllocated != 3145728000 || r.DeviceAllocs != 30 || r.DeviceFrees != 0 ||
		r.AllocRetries != 1 || r.OOMs != 1 || r.SourceOOMs != 1 {
		t.Errorf("got reserved %d allocated %d allocs %d frees %d retries %d ooms %d source ooms %d",
			r.PeakReserved, r.PeakAllocated, r.DeviceAllocs, r.DeviceFrees, r.AllocRetries, r.OOMs, r.SourceOOMs)
	}
	if r.FirstOOMEvent < 0 || r.FirstOOMSize == 0 {
		t.Errorf("first OOM at event %d, size %d", r.FirstOOMEvent, r.FirstOOMSize)
	}
	if len(r.Series) == 0 || len(r.Series) > sim.MaxSeriesPoints {
		t.Errorf("series of %d points", len(r.Series))
	}
}

// TestImportThenReplay checks that replaying the imported native trace gives
// the same results as replaying the snapshot directly.
func TestImportThenReplay(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"multistream", "token_lengths"} {
		snap := "../../../testdata/pytorch/" + name + ".pickle.gz"
		native := filepath.Join(dir, name+".trace")
		if _, _, err := tracefile.Import(snap, native, tracefile.Options{}); err != nil {
			t.Fatal(err)
		}
		a, b := filepath.Join(dir, name+".a.json"), filepath.Join(dir, name+".b.json")
		if _, _, err := runCmd(t, "sim", "--policy", "all", "--json", a, snap); err != nil {
			t.Fatal(err)
		}
		if _, _, err := runCmd(t, "sim", "--policy", "all", "--json", b, native); err != nil {
			t.Fatal(err)
		}
		ra, rb := readResults(t, a), readResults(t, b)
		if len(ra) == 0 || len(ra) != len(rb) {
			t.Fatalf("%s: %d vs %d results", name, len(ra), len(rb))
		}
		for i := range ra {
			ra[i].Trace, rb[i].Trace = "", ""
			if !reflect.DeepEqual(ra[i], rb[i]) {
				t.Errorf("%s, policy %s: snapshot and imported trace replay differently", name, ra[i].Policy)
			}
		}
	}
}

func TestSimBadInput(t *testing.T) {
	dir := t.TempDir()
	notTrace := filepath.Join(dir, "notes.txt")
	os.WriteFile(notTrace, []byte("hello, world\n"), 0o644)
	snap, err := os.ReadFile(splitFragOOM)
	if err != nil {
		t.Fatal(err)
	}
	cut := filepath.Join(dir, "cut.pickle.gz")
	os.WriteFile(cut, snap[:len(snap)/2], 0o644)
	js := filepath.Join(dir, "out.json")
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no trace", []string{"sim"}, "sim: no trace given"},
		{"missing file", []string{"sim", filepath.Join(dir, "nope")}, "no such file"},
		{"not a trace", []string{"sim", "--json", js, notTrace}, notTrace + ": not a trace"},
		{"truncated snapshot", []string{"sim", "--json", js, cut}, cut + ":"},
		{"unknown policy", []string{"sim", "--policy", "pytorch,magic", "--json", js, splitFragOOM}, `--policy: unknown policy "magic"`},
		{"bad size", []string{"sim", "--capacity", "12 parsecs", "--json", js, splitFragOOM}, "--capacity: bad size"},
		{"bad set", []string{"sim", "--set", "pytorch", splitFragOOM}, `--set "pytorch": want NAME.key=value`},
		{"unknown setting", []string{"sim", "--policy", "pytorch", "--set", "pytorch.colour=blue", "--json", js, splitFragOOM}, `unknown setting "colour"`},
		{"unknown command", []string{"simulate"}, `unknown command "simulate"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := runCmd(t, tc.args...)
			if err == nil {
				t.Fatal("no error")
			}
			if !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q, want one line containing %q", err, tc.want)
			}
			if _, err := os.Stat(js); err == nil {
				t.Errorf("%s was written", js)
			}
			if leftovers, _ := filepath.Glob(filepath.Join(dir, ".*tmp*")); len(leftovers) > 0 {
				t.Errorf("temporary files left: %v", leftovers)
			}
		})
	}
}

func TestSimTable(t *testing.T) {
	out, errOut, err := runCmd(t, "sim", "--policy", "pytorch,cuda", splitFragOOM)
	if err != nil {
		t.Fatal(err)
	}
	// Two rows, the lower peak reserved first (cuda's 3900 MiB, then
	// pytorch's 4500); on stderr, once for both policies, the warning that
	// the recording's failed malloc asks for the cap it ran under.
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], "reserved MiB") || !strings.Contains(lines[1], "split_frag_oom.pickle.gz") ||
		!strings.Contains(lines[1], " cuda ") || !strings.Contains(lines[1], "3900.0") || !strings.Contains(lines[2], " pytorch ") || strings.Contains(out, "failed malloc") ||
		strings.Count(errOut, "\n") != 1 || !strings.HasPrefix(errOut, splitFragOOM+": warning: the recording has 1 failed malloc(s)") {
		t.Errorf("table:\n%s\nstderr:\n%s", out, errOut)
	}
	out, errOut, err = runCmd(t, "sim", "--policy", "pytorch", "--capacity", "4194304000", splitFragOOM)
	if err != nil || errOut != "" {
		t.Errorf("with the cap: %v\n%s\nstderr:\n%s", err, out, errOut)
	}
	// --strict: a warning is an error, and nothing is written.
	js := filepath.Join(t.TempDir(), "r.json")
	_, errOut, err = runCmd(t, "sim", "--policy", "pytorch", "--strict", "--json", js, splitFragOOM)
	if err == nil || err.Error() != "--strict: 1 warning(s); nothing written" || !strings.Contains(errOut, ": warning: ") {
		t.Errorf("--strict with a warning: %v\nstderr:\n%s", err, errOut)
	}
	if _, serr := os.Stat(js); serr == nil {
		t.Errorf("--strict with a warning wrote %s", js)
	}
}

// TestSimStrictAndCostModel: --strict stops at the trace's first semantic
// problem; --cost-model charges the device calls to the given model.
func TestSimStrictAndCostModel(t *testing.T) {
	_, _, err := runCmd(t, "sim", "--strict", "--policy", "cuda", "../../../sim/testdata/engine.txt")
	if err == nil || err.Error() != "../../../sim/testdata/engine.txt: event 7: free of unknown address 0x9 (--strict)" {
		t.Errorf("--strict: %v", err)
	}
	dir := t.TempDir()
	model := filepath.Join(dir, "flat.csv")
	// Every call costs 1000 ns: the cuda policy's 4 allocs and 3 frees on
	// engine.txt (its malloc that fails in the source but fits here
	// included) cost 7000 ns.
	os.WriteFile(model, []byte("api,size_bytes,n,first_us,median_us,p90_us,min_us\n"+
		"cudaMalloc,512,1,1,1,1,1\ncudaFree,512,1,1,1,1,1\ncudaMalloc_suballoc,512,1,1,1,1,1\ncudaFree_suballoc,512,1,1,1,1,1\n"), 0o644)
	js := filepath.Join(dir, "r.json")
	if _, _, err := runCmd(t, "sim", "--policy", "cuda", "--capacity", "8192B", "--cost-model", model, "--json", js, "../../../sim/testdata/engine.txt"); err != nil {
		t.Fatal(err)
	}
	if r := readResults(t, js)[0]; r.SimAllocTimeNS != 7000 || r.Anomalies != 1 {
		t.Errorf("sim_alloc_time_ns %d, anomalies %d; want 7000 and 1", r.SimAllocTimeNS, r.Anomalies)
	}
	if _, _, err := runCmd(t, "sim", "--cost-model", filepath.Join(dir, "none.csv"), splitFragOOM); err == nil || !strings.HasPrefix(err.Error(), "--cost-model: ") {
		t.Errorf("missing cost model: %v", err)
	}
}

// TestUsageExitAndVersion: a usage error (unknown flag or command, no
// command) exits 2, a runtime error 1; --version names the trace format
// and results versions; help CMD is CMD --help.
func TestUsageExitAndVersion(t *testing.T) {
	code := func(err error) int {
		var ec interface{ ExitCode() int }
		if errors.As(err, &ec) {
			return ec.ExitCode()
		}
		return 1
	}
	mlp := "../../../testdata/pytorch/mlp.pickle.gz"
	for _, args := range [][]string{{"sim", "--bogus"}, {"nosuch"}, {}, {"tune", "--top", "x"},
		// A setting the policy does not know, or a value it refuses.
		{"sim", "--policy", "best-fit", "--set", "best-fit.nosuch=1", mlp},
		{"sim", "--policy", "best-fit", "--set", "best-fit.alignment=3", mlp},
		{"sim", "--policy", "pytorch", "--set", "pytorch.conf=garbage::", mlp},
		// Two outputs on stdout, one after the other, would read as neither.
		{"sim", "--policy", "cuda", "--json", "-", "--csv", "-", mlp},
		{"sim", "--policy", "cuda", "--site-depth", "2", mlp},
		{"sim", "--policy", "cuda", "--capacity", "24", mlp}, // 24 bytes: 24 GiB meant
		{"sweep", "--traces", mlp, "--capacity", "0,512", "-o", t.TempDir()}} {
		if _, _, err := runCmd(t, args...); err == nil || code(err) != 2 {
			t.Errorf("%v: %v (exit %d), want a usage error, exit 2", args, err, code(err))
		}
	}
	if _, _, err := runCmd(t, "sim", "no-such-file.trace"); err == nil || code(err) != 1 {
		t.Errorf("a missing trace: %v (exit %d), want exit 1", err, code(err))
	}
	out, _, err := runCmd(t, "--version")
	if err != nil || !strings.HasPrefix(out, "replay (allocsim) ") || !strings.Contains(out, "; trace format version 3; results version 2\n") {
		t.Errorf("--version: %v %q", err, out)
	}
	out, _, err = runCmd(t, "help", "fit")
	if err != nil || !strings.HasPrefix(out, "usage: replay fit ") {
		t.Errorf("help fit: %v\n%s", err, out)
	}
	if _, _, err := runCmd(t, "fidelty", "x"); err == nil || code(err) != 2 || !strings.Contains(err.Error(), `unknown command "fidelty" (did you mean "fidelity"?)`) {
		t.Errorf("a mistyped command: %v", err)
	}
	if _, _, err := runCmd(t, "sim", "--polcy", "cuda", mlp); err == nil || code(err) != 2 || !strings.Contains(err.Error(), "unknown flag: --polcy (did you mean --policy?)") {
		t.Errorf("a mistyped flag: %v", err)
	}
	if _, _, err := runCmd(t, "sim", "--policy", "bestfit", mlp); err == nil || !strings.Contains(err.Error(), `unknown policy "bestfit" (did you mean "best-fit"?`) {
		t.Errorf("a mistyped policy: %v", err)
	}
	if _, _, err := runCmd(t, "sim", "--policy", "pytorch", "--set", "pytorch.max_split_size=64", mlp); err == nil || !strings.Contains(err.Error(), `unknown setting "max_split_size" (did you mean "max_split_size_mb"?`) {
		t.Errorf("a mistyped setting: %v", err)
	}
}

package replaycli

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var updateFuzzCases = flag.Bool("update-fuzz-cases", false, "rewrite testdata/fuzz/cases/expected.txt from replay fidelity's output on the cases")

// fuzzCasesDir holds the kept programs of the differential fuzzer
// (testdata/fuzz/README.md, "The kept cases"): KIND/NAME.prog.json, the
// recording it names and the real allocator's figures beside it, recorded
// on an H200; KIND/open/ the programs that do not replay identical yet.
const fuzzCasesDir = "../../../testdata/fuzz/cases"

// fuzzCaseMin is the fewest cases of each kind TestFuzzCases accepts
// (open/ not counted): a kind's cases gone missing (a bad glob, a folder
// renamed) fail the test instead of passing on nothing. jax is 6: all the
// JAX recordings of the fuzzer's H200 runs that were kept (jaxgen.py's
// programs are never tiny, so run.py --export keeps no identical one).
var fuzzCaseMin = map[string]int{"torch": 50, "cupy": 15, "jax": 6}

// fuzzRecordingExts are the recordings' file name endings, one per kind.
var fuzzRecordingExts = map[string]string{"torch": ".pickle.gz", "cupy": ".jsonl", "jax": ".xplane.pb.gz"}

type fuzzCase struct {
	kind string // torch, cupy, jax
	open bool   // under KIND/open/: a divergence not fixed yet
	path string // the recording
	base string // its file name, which names it in fidelity's output
	name string // the subtest's: KIND/NAME or KIND/open/NAME
}

// fuzzCases lists the recordings under fuzzCasesDir/KIND and KIND/open,
// sorted by subtest name; each must have its NAME.prog.json naming it and
// its figures beside it.
func fuzzCases(t *testing.T) []fuzzCase {
	t.Helper()
	var cases []fuzzCase
	for _, kind := range []string{"torch", "cupy", "jax"} {
		ext := fuzzRecordingExts[kind]
		for _, open := range []bool{false, true} {
			dir := filepath.Join(fuzzCasesDir, kind)
			if open {
				dir = filepath.Join(dir, "open")
			}
			paths, err := filepath.Glob(filepath.Join(dir, "*"+ext))
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range paths {
				base := filepath.Base(p)
				stem := strings.TrimSuffix(base, ext)
				name := kind + "/" + stem
				if open {
					name = kind + "/open/" + stem
				}
				c := fuzzCase{kind: kind, open: open, path: p, base: base, name: name}
				var prog struct{ Trace string }
				if data, err := os.ReadFile(filepath.Join(dir, stem+".prog.json")); err != nil {
					t.Errorf("%s: no program: %v", name, err)
				} else if err := json.Unmarshal(data, &prog); err != nil || prog.Trace != base {
					t.Errorf("%s: %s.prog.json names the recording %q (%v)", name, stem, prog.Trace, err)
				}
				figures := stem + ".stats.json"
				if kind == "jax" {
					figures = stem + ".json"
				}
				if _, err := os.Stat(filepath.Join(dir, figures)); err != nil {
					t.Errorf("%s: no figures beside the recording: %v", name, err)
				}
				cases = append(cases, c)
			}
		}
	}
	slices.SortFunc(cases, func(a, b fuzzCase) int { return strings.Compare(a.name, b.name) })
	return cases
}

// readFuzzExpected reads expected.txt: fidelity's output lines, each
// starting with the file name of the recording it is about, grouped by
// that name ('#' lines are comments).
func readFuzzExpected(t *testing.T, path string) map[string][]string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./cmd/replay/replaycli -run TestFuzzCases -update-fuzz-cases)", err)
	}
	want := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSuffix(string(data), "\n"), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		base, _, ok := strings.Cut(line, ":")
		if !ok {
			t.Errorf("expected.txt: a line that names no recording: %q", line)
			continue
		}
		want[base] = append(want[base], line)
	}
	return want
}

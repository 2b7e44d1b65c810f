package replaycli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// TestFuzzCases replays every kept case of the differential fuzzer with
// `replay fidelity` and holds it to its output in expected.txt, line for
// line: a case under KIND/ must exit 0 with only warnings naming an event
// and a last line "NAME: identical (...)" or "NAME: figures agree (...)";
// a case under KIND/open/ must still exit 1 at its divergence, with no
// warning before it, so that a fix (or a new divergence) changes the test.
// After a deliberate change run it with -update-fuzz-cases (a fixed open
// case moved out of open/ first) and read the diff of expected.txt.
func TestFuzzCases(t *testing.T) {
	cases := fuzzCases(t)
	count := map[string]int{}
	seen := map[string]string{}
	for _, c := range cases {
		if !c.open {
			count[c.kind]++
		}
		if other, dup := seen[c.base]; dup {
			t.Errorf("%s and %s have the same file name, which fidelity's output cannot tell apart", other, c.name)
		}
		seen[c.base] = c.name
	}
	for kind, min := range fuzzCaseMin {
		if count[kind] < min {
			t.Errorf("%d %s cases under %s/%s, want at least %d", count[kind], kind, fuzzCasesDir, kind, min)
		}
	}
	path := filepath.Join(fuzzCasesDir, "expected.txt")
	var want map[string][]string
	if !*updateFuzzCases {
		want = readFuzzExpected(t, path)
		for base, lines := range want {
			if _, ok := seen[base]; !ok {
				t.Errorf("expected.txt names %s, which is no case (%q)", base, lines[0])
			}
		}
	}
	var mu sync.Mutex
	got := map[string][]string{}
	t.Cleanup(func() {
		if !*updateFuzzCases || t.Failed() {
			return
		}
		var b strings.Builder
		b.WriteString("# replay fidelity's output on each case of testdata/fuzz/cases (KIND/ and KIND/open/), line for line;\n")
		b.WriteString("# written by: go test ./cmd/replay/replaycli -run TestFuzzCases -update-fuzz-cases\n")
		for _, c := range cases {
			for _, l := range got[c.base] {
				b.WriteString(l + "\n")
			}
		}
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			t.Error(err)
		}
	})
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			stdout, stderr, err := runCmd(t, "fidelity", c.path)
			lines := strings.Split(strings.TrimSuffix(stdout+stderr, "\n"), "\n")
			for _, l := range lines {
				if !strings.HasPrefix(l, c.base+":") {
					t.Fatalf("a line of fidelity's output that does not name %s: %q", c.base, l)
				}
			}
			last := lines[len(lines)-1]
			if c.open {
				if err == nil {
					t.Fatalf("replays without a divergence now: move it out of open/ (git mv) and run -update-fuzz-cases; output:\n%s", stdout)
				}
				// The first line is the divergence: a warning before it
				// makes it a case the recording cannot tell, not an open one.
				if first := lines[0]; !strings.HasPrefix(first, c.base+": diverges at event ") &&
					!strings.HasPrefix(first, c.base+": same device calls and placements, but figures differ") {
					t.Fatalf("does not start at a divergence: %v\n%s", err, stdout+stderr)
				}
			} else {
				if err != nil {
					t.Fatalf("fidelity: %v\n%s", err, stdout+stderr)
				}
				if !strings.HasPrefix(last, c.base+": identical (") && !strings.HasPrefix(last, c.base+": figures agree (") {
					t.Fatalf("does not end identical or figures agree:\n%s", stdout+stderr)
				}
				for _, l := range lines[:len(lines)-1] {
					if !strings.HasPrefix(l, c.base+": warning:") {
						t.Fatalf("a line that is no warning before the verdict: %q", l)
					}
				}
			}
			if *updateFuzzCases {
				mu.Lock()
				got[c.base] = lines
				mu.Unlock()
				return
			}
			if w := want[c.base]; !slices.Equal(lines, w) {
				t.Errorf("fidelity's output differs from expected.txt (run -update-fuzz-cases after a deliberate change)\ngot:\n%s\nwant:\n%s",
					strings.Join(lines, "\n"), strings.Join(w, "\n"))
			}
		})
	}
}

// TestFuzzCasesSimWarns holds `replay sim` to what fidelity finds on the
// kept PyTorch cases, replayed under their job's cap as a user would
// (--capacity): an open case (one the simulation parts from) warns that
// it parts, at the event of fidelity's divergence; a case that replays
// identical warns of no parting. No figure of a recording's own allocator
// is then reported as the real allocator's without a word.
func TestFuzzCasesSimWarns(t *testing.T) {
	want := readFuzzExpected(t, filepath.Join(fuzzCasesDir, "expected.txt"))
	var open int
	for _, c := range fuzzCases(t) {
		if c.kind != "torch" {
			continue
		}
		if c.open {
			open++
		}
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			stats := strings.TrimSuffix(c.path, ".pickle.gz") + ".stats.json"
			var fig struct {
				Cap uint64 `json:"mem_cap_bytes"`
			}
			data, err := os.ReadFile(stats)
			if err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(data, &fig); err != nil {
				t.Fatal(err)
			}
			args := []string{"sim", "--policy", "pytorch", c.path}
			if fig.Cap > 0 {
				args = append(args, "--capacity", strconv.FormatUint(fig.Cap, 10))
			}
			_, stderr, err := runCmd(t, args...)
			if err != nil {
				t.Fatalf("sim: %v\n%s", err, stderr)
			}
			_, parted, ok := strings.Cut(stderr, "parts from the recording at event ")
			if !c.open {
				if ok {
					t.Fatalf("a case fidelity calls identical warns of a parting:\n%s", stderr)
				}
				return
			}
			if !ok {
				t.Fatalf("no warning of the parting fidelity finds (%q):\n%s", want[c.base], stderr)
			}
			event, _, _ := strings.Cut(parted, ":")
			if len(want[c.base]) == 0 || !strings.Contains(want[c.base][0], " at event "+event+":") {
				t.Fatalf("warns of a parting at event %s, fidelity diverges at %q", event, want[c.base])
			}
		})
	}
	if open == 0 {
		t.Fatal("no open torch case: nothing shows the warning")
	}
}

package replaycli

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/cmd/internal/cli"
	"github.com/gpualloc/allocsim/trace/pytorch"
)

const readmeTrain = "../../../testdata/pytorch/stacks/readme_train.pickle.gz"

// TestSliceDocs runs the replay slice commands that docs/slice.md shows
// ("$ bin/replay slice ...", then its output) and compares their output
// with the page's, the output file put in a temporary directory.
func TestSliceDocs(t *testing.T) {
	page, err := os.ReadFile("../../../docs/slice.md")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	lines := strings.Split(string(page), "\n")
	ran := 0
	for i, line := range lines {
		cmd, ok := strings.CutPrefix(line, "$ bin/replay ")
		if !ok || i+1 >= len(lines) {
			continue
		}
		args := strings.Fields(cmd)
		want := lines[i+1]
		for k := range args {
			switch {
			case k > 0 && args[k-1] == "-o":
				out := filepath.Join(dir, args[k])
				want = strings.Replace(want, "wrote "+args[k]+":", "wrote "+out+":", 1)
				args[k] = out
			case strings.HasPrefix(args[k], "testdata/"):
				args[k] = "../../../" + args[k]
			}
		}
		stdout, stderr, err := runCmd(t, args...)
		if err != nil {
			t.Fatalf("%s: %v\n%s", cmd, err, stderr)
		}
		if got := strings.TrimSuffix(stdout, "\n"); got != want {
			t.Errorf("%s:\n got %s\nwant %s", cmd, got, want)
		}
		ran++
	}
	if ran == 0 {
		t.Fatal("docs/slice.md shows no replay command")
	}
}

// TestSliceCommand writes a gzip-compressed slice of the last 1000
// entries: it holds them, and imports as a snapshot whose history was cut.
func TestSliceCommand(t *testing.T) {
	out := filepath.Join(t.TempDir(), "tail.pickle.gz")
	stdout, stderr, err := runCmd(t, "slice", "--events", "-1000:", "-o", out, readmeTrain)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	if !strings.HasPrefix(stdout, "wrote "+out+": entries 4620 to 5619 of 5620 (") || stderr != "" {
		t.Errorf("stdout %q, stderr %q", stdout, stderr)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(data) < 2 || data[0] != 0x1f || data[1] != 0x8b {
		t.Fatalf("%s is not gzip-compressed", out)
	}
	src, err := pytorch.Import(bytes.NewReader(data), out, pytorch.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if h := src.Header(); h.Metadata["entries"] != "1000" || h.Metadata["truncated"] != "true" {
		t.Errorf("metadata %v, want 1000 entries and a cut history", h.Metadata)
	}
}

// TestSliceErrors: usage errors (exit 2) for a range given two ways or
// badly, and one-line errors naming the file for a range without entries,
// an input that is no snapshot, an output that cannot be written or that
// is the input; none leaves a file, temporary or not, behind.
func TestSliceErrors(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "out", "s.pickle")
	text := filepath.Join(dir, "notes.txt")
	if err := os.WriteFile(text, []byte("not a snapshot\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		args  []string
		usage bool
		want  string
	}{
		{"no snapshot", []string{"-o", out}, true, "slice: want one snapshot, got 0"},
		{"no output", []string{readmeTrain}, true, "slice: no output file (-o OUT.pickle)"},
		{"two ways", []string{"--events", "1:2", "--from", "1s", "-o", out, readmeTrain}, true, "slice: --events and --from/--to select the entries two ways: give one"},
		{"no colon", []string{"--events", "12", "-o", out, readmeTrain}, true, `--events "12": want A:B (entry indexes; A:, :B)`},
		{"bad index", []string{"--events", "a:2", "-o", out, readmeTrain}, true, `--events "a:2": "a" is not an entry index`},
		{"bad time", []string{"--from", "soon", "-o", out, readmeTrain}, true, `--from "soon": want a time_us (an integer) or a duration after the first entry (1.5s, 200ms)`},
		{"negative", []string{"--to", "-2s", "-o", out, readmeTrain}, true, `--to "-2s": a negative duration`},
		{"backwards", []string{"--from", "2s", "--to", "1s", "-o", out, readmeTrain}, true, "slice: --to 1s is not after --from 2s"},
		{"empty", []string{"--from", "2s", "--to", "2.5s", "-o", out, readmeTrain}, false,
			readmeTrain + ": no trace entry in the range from 2s after the first entry to 2.5s after the first entry: the first entry from its start is entry 59 at time_us 1796287852178197 (3.371622s after the first entry)"},
		{"not a snapshot", []string{"-o", out, text}, false, text + ": "},
		{"unwritable", []string{"-o", filepath.Join(text, "s.pickle"), readmeTrain}, false, filepath.Join(text, "s.pickle")},
		{"the input", []string{"-o", readmeTrain, readmeTrain}, false, "--out: " + readmeTrain + " is also an input"},
		// A device that is full: written directly, not renamed.
		{"full", []string{"-o", "/dev/full", readmeTrain}, false, ": write /dev/full: no space left on device"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "full" {
				if _, err := os.Stat("/dev/full"); err != nil {
					t.Skip("no /dev/full")
				}
			}
			_, _, err := runCmd(t, append([]string{"slice"}, tc.args...)...)
			if err == nil {
				t.Fatal("no error")
			}
			var ue cli.UsageError
			if errors.As(err, &ue) != tc.usage {
				t.Errorf("%v: usage error %v, want %v", err, !tc.usage, tc.usage)
			}
			if msg := err.Error(); !strings.HasPrefix(msg, tc.want) && !strings.Contains(msg, tc.want) || strings.Contains(msg, "\n") {
				t.Errorf("got %q, want %q", msg, tc.want)
			}
			if left, _ := filepath.Glob(filepath.Join(dir, "out", "*")); len(left) > 0 {
				t.Errorf("left behind: %v", left)
			}
			if left, _ := filepath.Glob(filepath.Join(filepath.Dir(readmeTrain), ".*tmp*")); len(left) > 0 {
				t.Errorf("left behind: %v", left)
			}
		})
	}
}

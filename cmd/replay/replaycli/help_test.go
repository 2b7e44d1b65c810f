package replaycli

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var updateHelp = flag.Bool("update-help", false, "rewrite testdata/help/*.golden from the commands' --help")

// helpCommands are the commands whose --help the golden files hold.
var helpCommands = []string{"sim", "gpu", "calibrate", "stats", "dump", "check", "sweep", "merge", "fit", "tune", "report", "fidelity", "diff", "policies", "slice"}

// TestHelpGolden: every command's --help (on stdout, as the top-level
// help, so that `replay sim --help | grep capacity` finds it; exit 0,
// nothing on stderr) is the golden
// file's text, with a synopsis ("usage: replay CMD") and its flags; run
// with -update-help after a deliberate change and read the diff.
func TestHelpGolden(t *testing.T) {
	for _, cmd := range helpCommands {
		stdout, stderr, err := runCmd(t, cmd, "--help")
		if err != nil || stderr != "" {
			t.Errorf("%s --help: %v, stderr %q", cmd, err, stderr)
			continue
		}
		stderr = stdout
		if !strings.HasPrefix(stderr, "usage: replay "+cmd) || !strings.Contains(stderr, "\nFlags:\n") {
			t.Errorf("%s --help has no synopsis or no flags:\n%s", cmd, stderr)
		}
		path := filepath.Join("testdata", "help", cmd+".golden")
		if *updateHelp {
			os.MkdirAll(filepath.Dir(path), 0o755)
			if err := os.WriteFile(path, []byte(stderr), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (run go test -run TestHelpGolden -update-help)", err)
		}
		if stderr != string(want) {
			t.Errorf("%s --help differs from %s:\n%s", cmd, path, stderr)
		}
	}
}

// TestCompactTableGolden: replay sim's default table, which fits 120
// columns, on a small real snapshot; --wide has every column.
func TestCompactTableGolden(t *testing.T) {
	out, _, err := runCmd(t, "sim", "--policy", "pytorch,cuda,best-fit,bfc", "--capacity", "4194304000", splitFragOOM)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "MiB") && len([]rune(line)) > 120 {
			t.Errorf("a table line of %d columns: %q", len([]rune(line)), line)
		}
	}
	path := filepath.Join("testdata", "help", "sim-table.golden")
	if *updateHelp {
		if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -run TestCompactTableGolden -update-help)", err)
	}
	if out != string(want) {
		t.Errorf("the table differs from %s:\n%s", path, out)
	}
	wide, _, err := runCmd(t, "sim", "--wide", "--policy", "pytorch", splitFragOOM)
	if err != nil || !strings.Contains(wide, "first OOM (event, bytes)") || !strings.Contains(wide, "allocated MiB") {
		t.Errorf("--wide: %v\n%s", err, wide)
	}
}

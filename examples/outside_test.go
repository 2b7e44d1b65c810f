// Package examples holds the test of examples/segfit as a user's module
// outside allocsim: each example has its own go.mod (a replace line to
// this repository) and is also built and tested in place by make test.
package examples

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestOutsideModule copies examples/segfit into a fresh module in a
// temporary directory, its go.mod replacing allocsim by this checkout, as
// a researcher's own module is; runs its tests there (the conformance kit
// and a hand-worked trace); builds its main, the replay command with
// segfit in it; and finds segfit named by --policy in the table, the
// results JSON, the charts, the report and the policies list, with the
// hinter ability derived from its type.
func TestOutsideModule(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module: not under -short")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH")
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, f := range []string{"segfit.go", "segfit_test.go", "go.sum", filepath.Join("cmd", "replay", "main.go")} {
		data, err := os.ReadFile(filepath.Join("segfit", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	mod, err := os.ReadFile(filepath.Join("segfit", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	rep := regexp.MustCompile(`(?m)^replace github.com/gpualloc/allocsim => .*$`)
	if !rep.Match(mod) {
		t.Fatal("segfit/go.mod has no replace line for allocsim")
	}
	mod = rep.ReplaceAll(mod, []byte("replace github.com/gpualloc/allocsim => "+root))
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), mod, 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(name string, args ...string) string {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	if out := run(goBin, "test", "-count=1", "./..."); !strings.Contains(out, "ok  \texample.com/segfit") {
		t.Fatalf("go test in the outside module:\n%s", out)
	}
	run(goBin, "build", "-o", "replay", "./cmd/replay")
	replay := filepath.Join(dir, "replay")
	trace := filepath.Join(root, "testdata", "pytorch", "churn.pickle.gz")
	js := filepath.Join(dir, "r.json")
	plots := filepath.Join(dir, "plots")
	table := run(replay, "sim", "--policy", "segfit,pytorch", "--json", js, "--plots", plots, trace)
	if !regexp.MustCompile(`(?m)^\s*churn\.pickle\.gz\s+segfit\s+\d`).MatchString(table) {
		t.Errorf("no segfit row in the table:\n%s", table)
	}
	var doc struct {
		Results []struct {
			Policy       string
			PeakReserved uint64 `json:"peak_reserved_bytes"`
		}
	}
	data, err := os.ReadFile(js)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Results) != 2 || doc.Results[0].Policy != "segfit" || doc.Results[0].PeakReserved == 0 {
		t.Errorf("results JSON: %+v", doc.Results)
	}
	charts, _ := filepath.Glob(filepath.Join(plots, "*"))
	found := false
	for _, c := range charts {
		if b, err := os.ReadFile(c); err == nil && strings.HasSuffix(c, ".svg") && strings.Contains(string(b), "segfit") {
			found = true
		}
	}
	if len(charts) == 0 || !found {
		t.Errorf("no chart names segfit among %q", charts)
	}
	html := filepath.Join(dir, "report.html")
	run(replay, "report", "-o", html, js)
	if b, err := os.ReadFile(html); err != nil || !strings.Contains(string(b), "segfit") {
		t.Errorf("the report does not name segfit (%v)", err)
	}
	if out := run(replay, "policies"); !regexp.MustCompile(`(?m)^segfit: .*\n\s+abilities: hinter`).MatchString(out) {
		t.Errorf("replay policies:\n%s", out)
	}
}

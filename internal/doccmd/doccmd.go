// Package doccmd runs the commands a docs page shows, for the tests that
// keep the pages from rotting: each line "$ bin/replay ARGS" or "$
// bin/record ARGS" in a code block, its expected standard output the lines
// after it up to the block's end.
package doccmd

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// UpdateEnv names the environment variable that, set to 1, makes Run write
// each command's output into the page in place of the expected output
// instead of comparing them (ALLOCSIM_UPDATE_DOCS=1 go test ./docs).
const UpdateEnv = "ALLOCSIM_UPDATE_DOCS"

// Run builds cmd/replay and cmd/record from the repository at root (Build)
// and runs the commands of the page at path with them (RunWith).
func Run(t *testing.T, root, path string) int {
	t.Helper()
	return RunWith(t, Build(t, root), root, path)
}

// Build builds cmd/replay and cmd/record from the repository at root into
// a directory of t's, which it returns.
func Build(t *testing.T, root string) string {
	t.Helper()
	bin := t.TempDir()
	for _, c := range []string{"replay", "record"} {
		build := exec.Command("go", "build", "-o", filepath.Join(bin, c), "./cmd/"+c)
		build.Dir = root
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build: %v\n%s", err, out)
		}
	}
	return bin
}

// RunWith runs each command of the page at path (relative to root) from
// root with /bin/sh, bin/replay and bin/record those in the directory bin,
// compares its standard output with the page's, and returns how many
// commands it ran. It fails t where a command fails or prints otherwise.
func RunWith(t *testing.T, bin, root, path string) int {
	t.Helper()
	page, err := os.ReadFile(filepath.Join(root, path))
	if err != nil {
		t.Fatal(err)
	}
	update := os.Getenv(UpdateEnv) == "1"
	lines := strings.Split(string(page), "\n")
	var updated []string
	ran := 0
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		updated = append(updated, line)
		cmd, ok := strings.CutPrefix(line, "$ bin/")
		if !ok || !(strings.HasPrefix(cmd, "replay ") || strings.HasPrefix(cmd, "record ")) {
			continue
		}
		var want []string
		j := i + 1
		for ; j < len(lines) && lines[j] != "```"; j++ {
			want = append(want, lines[j])
		}
		c := exec.Command("/bin/sh", "-c", bin+string(filepath.Separator)+cmd)
		c.Dir = root
		out, err := c.Output()
		if err != nil {
			t.Fatalf("%s: %s: %v", path, cmd, err)
		}
		got := strings.TrimSuffix(string(out), "\n")
		if update {
			if got != "" {
				updated = append(updated, strings.Split(got, "\n")...)
			}
			i = j - 1
		} else if got != strings.Join(want, "\n") {
			t.Errorf("%s: %s:\n got:\n%s\nwant:\n%s", path, cmd, got, strings.Join(want, "\n"))
		}
		ran++
	}
	if update {
		if err := os.WriteFile(filepath.Join(root, path), []byte(strings.Join(updated, "\n")), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return ran
}

package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/trace/synth"
)

func TestSynth(t *testing.T) {
	out := filepath.Join(t.TempDir(), "r.trace")
	stdout, _, err := runCmd(t, "synth", "--workload", "random", "--allocations", "100", "--seed", "3", "-o", out)
	if err != nil {
		t.Fatal(err)
	}
	n, md := countEvents(t, out)
	if n != 200 || md["workload"] != "random" || md["seed"] != "3" || md["param.allocations"] != "100" {
		t.Errorf("%d events, metadata %v", n, md)
	}
	if stdout != out+": 200 events (synth random, seed 3)\n" {
		t.Errorf("stdout %q", stdout)
	}
}

func TestSynthList(t *testing.T) {
	stdout, _, err := runCmd(t, "synth", "--list")
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range synth.Workloads {
		if !strings.Contains(stdout, w.Name+": ") || !strings.Contains(stdout, "--"+w.Params[0].Name) {
			t.Errorf("--list lacks %s:\n%s", w.Name, stdout)
		}
	}
}

func TestSynthErrors(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "x.trace")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"synth", "-o", out}, "synth: --workload is required"},
		{[]string{"synth", "--workload", "random"}, "synth: -o OUT is required"},
		{[]string{"synth", "--workload", "lottery", "-o", out}, `synth: unknown workload "lottery"`},
		{[]string{"synth", "--workload", "random", "--layers", "3", "-o", out}, `synth: workload random has no parameter "layers"`},
		{[]string{"synth", "--workload", "train", "--layers", "x", "-o", out}, "synth: train: --layers=x: not an integer"},
	} {
		_, _, err := runCmd(t, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want %q", tc.args, err, tc.want)
		}
	}
	if m, _ := filepath.Glob(filepath.Join(dir, "*")); len(m) > 0 {
		t.Errorf("files left: %v", m)
	}
}

package replaycli

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/sim/results/tables"
)

// TestPrivatePoolWarning: `replay sim` on a snapshot whose mallocs went to
// private pools (a CUDA graph capture, torch.compile's cudagraph trees)
// places them in the pytorch policy's private pools, without a warning; a
// policy that keeps no private pools warns on stderr and in the JSON that
// it placed them with the others, naming the pools and counting their
// mallocs. A snapshot without private pools gets no such warning.
func TestPrivatePoolWarning(t *testing.T) {
	for _, tc := range []struct{ name, pools string }{
		{"graph_step", "(1,0): 30 mallocs"}, {"serve_graphs", "(0,1): 14 mallocs"}, {"compile_ro", "(0,1): 571 mallocs"}, {"train_gpt", ""},
	} {
		js := filepath.Join(t.TempDir(), "out.json")
		_, errOut, err := runCmd(t, "sim", "--policy", "pytorch,best-fit", "--json", js, "../../../testdata/pytorch/"+tc.name+".pickle.gz")
		if err != nil {
			t.Fatalf("%s: %v\n%s", tc.name, err, errOut)
		}
		want := "best-fit: warning: the best-fit policy keeps no private pools: the trace's mallocs into private pools (a CUDA graph capture's or a MemPool's; " + tc.pools + ") were placed with the others"
		if got := strings.Contains(errOut, want); got != (tc.pools != "") || strings.Contains(errOut, "pytorch: warning") {
			t.Errorf("%s: stderr %q, want the warning %q: %v", tc.name, errOut, want, tc.pools != "")
		}
		raw, err := os.ReadFile(js)
		if err != nil {
			t.Fatal(err)
		}
		var doc struct {
			Results []struct {
				Policy       string   `json:"policy"`
				PrivatePools string   `json:"private_pools"`
				Warnings     []string `json:"warnings"`
			} `json:"results"`
		}
		if err := json.Unmarshal(raw, &doc); err != nil {
			t.Fatal(err)
		}
		for _, r := range doc.Results {
			want := ""
			if r.Policy == "best-fit" {
				want = tc.pools
			}
			if r.PrivatePools != want || (want != "") != (len(r.Warnings) > 0) {
				t.Errorf("%s, %s: private_pools %q, warnings %q; want pools %q", tc.name, r.Policy, r.PrivatePools, r.Warnings, want)
			}
		}
	}
}

// TestUnnamedPoolWarning: on the MemPool recording, whose pools were
// deleted before the dump (no segment_pool_id names them), the importer
// finds the three pools from the order of their release; the pytorch
// policy keeps them apart without a warning, best-fit warns that it
// placed their mallocs with the others, naming each pool by the trace
// entry it was deleted before.
func TestUnnamedPoolWarning(t *testing.T) {
	js := filepath.Join(t.TempDir(), "out.json")
	_, errOut, err := runCmd(t, "sim", "--policy", "pytorch,best-fit", "--json", js, "../../../testdata/pytorch/mempool.pickle.gz")
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut)
	}
	const want = "mempool.pickle.gz: best-fit: warning: the best-fit policy keeps no private pools: the trace's mallocs into private pools (a CUDA graph capture's or a MemPool's; unnamed1-released-at-entry-142: 32 mallocs, unnamed2-released-at-entry-309: 32 mallocs, unnamed3-released-at-entry-477: 32 mallocs) were placed with the others\n"
	if !strings.HasSuffix(errOut, want) || strings.Count(errOut, "warning") != 1 {
		t.Errorf("stderr %q, want only %q", errOut, want)
	}
}

// TestWriteWarnings: a warning every result of a trace has is printed once
// for the trace; one of some policies once, naming them all, also when the
// text names each policy; one that names its policy keeps its name.
func TestWriteWarnings(t *testing.T) {
	rs := []*sim.Result{
		{Trace: "a", Policy: "p", Warnings: []string{"all", "some", "the p policy keeps x"}},
		{Trace: "a", Policy: "q", Warnings: []string{"all", "the q policy keeps x"}},
		{Trace: "a", Policy: "r", Warnings: []string{"some", "all", "the r policy keeps y"}},
		{Trace: "b", Policy: "p", Warnings: []string{"some", "the p policy keeps x"}},
	}
	var b strings.Builder
	if n := tables.Warnings(&b, rs); n != 6 {
		t.Errorf("%d lines", n)
	}
	const want = "a: warning: all\na: p, r: warning: some\na: p, q: warning: the p, q policies keep x\na: r: warning: the r policy keeps y\nb: warning: some\nb: p: warning: the p policy keeps x\n"
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
}

// TestFidelityAnomalies: a recording with an event the replay cannot make
// (here a free of an address no malloc gave, put into a real CuPy log) is
// not "identical": fidelity names the event and fails.
func TestFidelityAnomalies(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "..", "testdata", "cupy", "linalg.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(raw), "\n")
	bad := strings.Join(lines[:10], "") + `{"hook":"free","device_id":0,"mem_size":512,"mem_ptr":1000000000,"pmem_id":"0x1"}` + "\n" + strings.Join(lines[10:], "")
	path := filepath.Join(t.TempDir(), "unknown_free.jsonl")
	if err := os.WriteFile(path, []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	out, _, err := runCmd(t, "fidelity", path)
	const want = "unknown_free.jsonl: 1 event(s) could not be replayed as recorded (first: event 10: free of unknown address 0x3b9aca00): not a whole recording of the allocator (policy cupy)\n"
	if err == nil || out != want {
		t.Errorf("fidelity: %v, output %q, want %q", err, out, want)
	}
}

// TestFidelityNoRecordedAllocator: a MiniMalloc problem or a text trace
// records no allocator's decisions; fidelity says so (it said "diverges at
// event 0: real allocator: no device call") and fails, as nothing was
// compared.
func TestFidelityNoRecordedAllocator(t *testing.T) {
	for _, path := range []string{"../../../testdata/plan/tiny.problem.csv", "../../../testdata/plan/tiny.trace"} {
		out, _, err := runCmd(t, "fidelity", path)
		var ec interface{ ExitCode() int }
		if err == nil || errors.As(err, &ec) || out != "" || !strings.Contains(err.Error(), path+": no real allocator recorded: a ") {
			t.Errorf("fidelity %s: %v output %q; want the error \"no real allocator recorded\" (exit 1)", path, err, out)
		}
	}
}

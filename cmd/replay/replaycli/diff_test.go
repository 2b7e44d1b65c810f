package replaycli

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDiff: two recordings of one job under two settings (mlp, and mlp
// under expandable segments with garbage collection), side by side: each
// side's figures are its own replay's, which are the real allocator's
// (peak reserved 830472192 and 652214272 bytes, 61 and 42 device
// allocations), with the deltas, in the table and the JSON; one trace
// under two policies; one trace under --set-b.
func TestDiff(t *testing.T) {
	const mlp, mlpX = "../../../testdata/pytorch/mlp.pickle.gz", "../../../testdata/pytorch/mlp_expandable.pickle.gz"
	js := filepath.Join(t.TempDir(), "d.json")
	out, _, err := runCmd(t, "diff", "--json", js, mlp, mlpX)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"A: " + mlp + " under pytorch\n",
		"B: " + mlpX + " under pytorch (expandable_segments=True, garbage_collection_threshold=0.5)\n",
		"peak reserved  792.0 MiB  622.0 MiB  -170.0 MiB  0.785\n",
		"device allocs         61         42         -19  0.689\n",
		"retries          0          0          +0      -\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	raw, err := os.ReadFile(js)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Kind    string `json:"kind"`
		Results []struct {
			A, B struct {
				PeakReserved uint64 `json:"peak_reserved_bytes"`
			}
			Figures []struct {
				Figure string
				Delta  float64
			}
		}
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	if d := doc.Results; doc.Kind != "diff" || len(d) != 1 || d[0].A.PeakReserved != 830472192 || d[0].B.PeakReserved != 652214272 || d[0].Figures[2].Figure != "peak reserved" || d[0].Figures[2].Delta != 652214272-830472192 {
		t.Errorf("JSON %+v", doc)
	}
	// The report shows the comparison as a section of its own.
	page := filepath.Join(t.TempDir(), "r.html")
	if _, _, err := runCmd(t, "report", "-o", page, js); err != nil {
		t.Fatal(err)
	}
	html, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`<a href="#diff-1">Compare 1</a>`,
		"<h2>Compare 1: mlp.pickle.gz (pytorch) against mlp_expandable.pickle.gz (pytorch)</h2>",
		"<tr><th>B</th><td>" + mlpX + " under pytorch (expandable_segments=True, garbage_collection_threshold=0.5)</td></tr>",
		`<tr><td>peak reserved</td><td class="num" data-v="830472192">792.0 MiB</td><td class="num" data-v="652214272">622.0 MiB</td><td class="num" data-v="-178257920">-170.0 MiB</td><td class="num" data-v="0.7853535353535354">0.785</td></tr>`,
	} {
		if !strings.Contains(string(html), want) {
			t.Errorf("report lacks %q", want)
		}
	}
	out, _, err = runCmd(t, "diff", "--policy-b", "best-fit", mlp)
	if err != nil || !strings.Contains(out, "B: "+mlp+" under best-fit\n") {
		t.Errorf("--policy-b: %v\n%s", err, out)
	}
	out, _, err = runCmd(t, "diff", "--set-b", "pytorch.expandable_segments=True", mlp)
	if err != nil || !strings.Contains(out, "B: "+mlp+" under pytorch (expandable_segments=True)\n") {
		t.Errorf("--set-b: %v\n%s", err, out)
	}
	for _, args := range [][]string{{"diff", mlp}, {"diff", mlp, mlp, mlp}, {"diff"}, {"diff", "--policy", "nope", mlp, mlpX},
		// --set-b of a policy B does not run; the same settings twice.
		{"diff", "--policy-b", "best-fit", "--set-b", "pytorch.expandable_segments=True", mlp},
		{"diff", "--set", "pytorch.expandable_segments=True", "--set-b", "pytorch.expandable_segments=True", mlp},
		{"diff", "--capacity", "foo", mlp}, {"diff", "--set", "best-fit.nosuch=1", mlp}} {
		var ec interface{ ExitCode() int }
		if _, _, err := runCmd(t, args...); !errors.As(err, &ec) || ec.ExitCode() != 2 {
			t.Errorf("%v: %v, want a usage error (exit 2)", args, err)
		}
	}
	if _, _, err := runCmd(t, "diff", "no-such.pickle.gz"); err == nil || !strings.Contains(err.Error(), "no-such.pickle.gz: no such file") {
		t.Errorf("a missing trace: %v", err)
	}
}

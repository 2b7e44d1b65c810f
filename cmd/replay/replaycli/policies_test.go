package replaycli

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/policies"
)

// TestPoliciesTable: the table names every policy with its design, and
// every setting with its default.
func TestPoliciesTable(t *testing.T) {
	out, _, err := runCmd(t, "policies")
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range policies.Infos() {
		if !strings.Contains(out, "\n"+in.Name+": "+in.Design+"\n") && !strings.HasPrefix(out, in.Name+": "+in.Design+"\n") {
			t.Errorf("no line for %s", in.Name)
		}
		for _, s := range in.Settings {
			if !strings.Contains(out, "  "+s.Key+"=") {
				t.Errorf("%s: no line for setting %s", in.Name, s.Key)
			}
		}
	}
	if !strings.Contains(out, "  expandable_segments=False ") {
		t.Errorf("pytorch's expandable_segments default is not shown:\n%s", out)
	}
	// The direct targets of replay gpu, with cuda-async's settings.
	if !strings.Contains(out, "\ncuda-async: replay gpu only: ") || !strings.Contains(out, "  release_threshold=0 ") || !strings.Contains(out, "  pool=own ") {
		t.Errorf("the gpu targets are not listed:\n%s", out)
	}
}

// TestPoliciesJSON: --json writes the registry's Infos as they are.
func TestPoliciesJSON(t *testing.T) {
	out, _, err := runCmd(t, "policies", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct{ Policies []policies.Info }
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatal(err)
	}
	if want := policies.Infos(); !reflect.DeepEqual(doc.Policies, want) {
		t.Errorf("got %+v\nwant %+v", doc.Policies, want)
	}
}

func TestPoliciesBadArgs(t *testing.T) {
	if _, _, err := runCmd(t, "policies", "extra"); err == nil || !strings.Contains(err.Error(), "takes no arguments") {
		t.Errorf("got %v", err)
	}
}

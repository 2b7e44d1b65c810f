package replaycli

import (
	"strings"
	"testing"
)

// TestSimAsRecorded: replay sim takes a snapshot's recorded settings, with
// --set over them, and says under the table which were used.
func TestSimAsRecorded(t *testing.T) {
	const snap = "../../../testdata/pytorch/churn_maxsplit.pickle.gz"
	out, errOut, err := runCmd(t, "sim", "--wide", "--policy", "pytorch", "--capacity", "1271922688", snap)
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut)
	}
	// The real allocator: 1268776960 bytes reserved at most, 42 device
	// allocations, 29 frees, 3 retries, 1 OOM.
	if !strings.Contains(out, "1210.0") || !strings.Contains(out, "  42  ") || !strings.Contains(out, "churn_maxsplit.pickle.gz: pytorch settings: max_split_size_mb=64 (recorded)\n") {
		t.Errorf("as recorded:\n%s", out)
	}
	out, _, err = runCmd(t, "sim", "--policy", "pytorch", "--set", "pytorch.expandable_segments=True", snap)
	if err != nil || !strings.Contains(out, "pytorch settings: expandable_segments=True (--set), max_split_size_mb=64 (recorded)\n") {
		t.Errorf("with --set: %v\n%s", err, out)
	}
	out, _, err = runCmd(t, "sim", "--policy", "pytorch", "--set", "pytorch.conf=roundup_power2_divisions:[>:4],garbage_collection_threshold:0.5", snap)
	if err != nil || !strings.Contains(out, "pytorch settings: conf=roundup_power2_divisions:[>:4],garbage_collection_threshold:0.5 (--set)\n") {
		t.Errorf("with --set conf: %v\n%s", err, out)
	}
	out, _, err = runCmd(t, "sim", "--policy", "pytorch", "--as-recorded=false", snap)
	if err != nil || strings.Contains(out, "settings") {
		t.Errorf("--as-recorded=false: %v\n%s", err, out)
	}
	_, _, err = runCmd(t, "sim", "--policy", "pytorch", "--set", "pytorch.conf=max_split_size_mb:8", snap)
	if err == nil || !strings.Contains(err.Error(), "max_split_size_mb: 8 is too small") {
		t.Errorf("a bad conf: %v, want an error naming the key", err)
	}
}

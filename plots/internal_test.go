package plots

import (
	"errors"
	"github.com/gpualloc/allocsim/sim/results"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/trace/atomicfile"
)

// writeAtomic writes one file through stage and a batch of its own.
func writeAtomic(path string, write func(io.Writer) error) error {
	var b atomicfile.Batch
	defer b.Abort()
	if err := stage(&b, path, write); err != nil {
		return err
	}
	return b.Commit()
}

func TestWriteAtomic(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "chart.png")
	if err := os.WriteFile(path, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	err := writeAtomic(path, func(w io.Writer) error {
		io.WriteString(w, "half a pic")
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("writeAtomic(failing write) = %v, want it to wrap %v", err, boom)
	}
	if data, _ := os.ReadFile(path); string(data) != "old" {
		t.Errorf("after a failed write the file holds %q, want it untouched", data)
	}
	if err := writeAtomic(path, func(w io.Writer) error { _, err := io.WriteString(w, "new"); return err }); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(path); string(data) != "new" {
		t.Errorf("after a write the file holds %q, want %q", data, "new")
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("file mode %v (%v), want 0644", fi.Mode().Perm(), err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries, want only the chart (no temporary files)", len(entries))
	}
	// The chart is a file, so no directory can be made under it.
	if err := writeAtomic(filepath.Join(path, "x.png"), func(io.Writer) error { return nil }); err == nil {
		t.Errorf("writeAtomic under a regular file succeeded")
	}
}

func TestRoundTicker(t *testing.T) {
	for _, tc := range []struct {
		name   string
		ticker roundTicker
		lo, hi float64
		want   []string
	}{
		{"GiB", roundTicker{Step: 2}, 0, 10, []string{"0", "2", "4", "6", "8", "10"}},
		{"fractions", roundTicker{Step: 0.25}, 0, 1.25, []string{"0.00", "0.25", "0.50", "0.75", "1.00", "1.25"}},
		{"events", roundTicker{Target: 6, Format: formatCount}, 0, 26620, []string{"0", "5k", "10k", "15k", "20k", "25k"}},
		{"few events", roundTicker{Target: 6, Format: formatCount}, 0, 3000, []string{"0", "500", "1000", "1500", "2000", "2500", "3000"}},
		{"millions", roundTicker{Target: 6, Format: formatCount}, 0, 2_500_000, []string{"0", "0.5M", "1.0M", "1.5M", "2.0M", "2.5M"}},
		{"hundreds of thousands", roundTicker{Target: 6, Format: formatCount}, 0, 771165, []string{"0", "200k", "400k", "600k"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, tk := range tc.ticker.Ticks(tc.lo, tc.hi) {
				if !tk.IsMinor() {
					got = append(got, tk.Label)
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("labels %q, want %q", got, tc.want)
			}
		})
	}
	if ticks := (roundTicker{}).Ticks(1, 1); ticks != nil {
		t.Errorf("Ticks of an empty range = %v, want none", ticks)
	}
}

func TestLog10Ticker(t *testing.T) {
	var got []string
	for _, tk := range (log10Ticker{}).Ticks(-1, 7) {
		if !tk.IsMinor() {
			got = append(got, tk.Label)
		}
	}
	want := []string{"0.1", "1", "10", "100", "1k", "10k", "100k", "1M", "10M"}
	if !slices.Equal(got, want) {
		t.Errorf("labels %q, want %q", got, want)
	}
}

func TestFormatExact(t *testing.T) {
	for v, want := range map[float64]string{0: "0", 125: "125", 9876: "9876", 12345: "12.3k", 1e6: "1M", 4_560_000: "4.56M", 3.5e9: "3.5G"} {
		if got := formatExact(v); got != want {
			t.Errorf("formatExact(%v) = %q, want %q", v, got, want)
		}
	}
}

func TestPolicyLabels(t *testing.T) {
	long := strings.Repeat("x", 40)
	rs := []results.Result{
		{Policy: "best_fit", Settings: map[string]string{"round": "512"}},
		{Policy: "best_fit", Settings: map[string]string{"round": "4096"}},
		{Policy: "caching"},
		{Policy: ""},
		{Policy: long + "1"},
		{Policy: long + "2"},
		{Policy: "twin"},
		{Policy: "twin"},
	}
	want := []string{
		"best_fit round=512",
		"best_fit round=4096",
		"caching",
		"(unnamed)",
		"xxxxxxxxxxxxx…xxxxxxxxxxxxx1",
		"xxxxxxxxxxxxx…xxxxxxxxxxxxx2",
		"twin #1",
		"twin #2",
	}
	if got := policyLabels(rs); !slices.Equal(got, want) {
		t.Errorf("policyLabels = %q, want %q", got, want)
	}
}

// chooseX: the trace's time in seconds when every series has times that go
// forward and span some time; events for MiniMalloc's logical steps,
// times that go back, or none.
func TestChooseX(t *testing.T) {
	pts := func(times ...int64) []results.Point {
		var s []results.Point
		for i, tm := range times {
			s = append(s, results.Point{Event: int64(10 * i), Time: tm})
		}
		return s
	}
	for _, tc := range []struct {
		name   string
		rs     []results.Result
		byTime bool
		x      float64 // of the second point of the first result
	}{
		{"times", []results.Result{{Series: pts(5e9, 7e9)}, {Series: pts(6e9)}}, true, 2},
		{"minimalloc", []results.Result{{TraceSource: "minimalloc", Series: pts(5e9, 7e9)}}, false, 10},
		{"backwards", []results.Result{{Series: pts(7e9, 5e9)}}, false, 10},
		{"no time", []results.Result{{Series: pts(0, 0)}}, false, 10},
	} {
		ax := chooseX(tc.rs)
		if ax.byTime != tc.byTime || ax.of(tc.rs[0].Series[1]) != tc.x {
			t.Errorf("%s: %+v, x %v; want by time %v, x %v", tc.name, ax, ax.of(tc.rs[0].Series[1]), tc.byTime, tc.x)
		}
	}
}

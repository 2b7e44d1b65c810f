package policies

import (
	"encoding/json"
	"math"
	"math/bits"
	"os"
	"strconv"
	"strings"
	"testing"
)

// TestPytorchConfPyTorch parses every settings string of
// testdata/pytorch/parse.json, where PyTorch 2.11 (on the H200 that
// recorded the testdata traces, by testdata/pytorch/record.py) wrote the
// allocator settings it took from each, or its error, and demands the
// same: an error where PyTorch refused, else the same max_split_size,
// roundup_power2_divisions, garbage_collection_threshold and
// expandable_segments.
func TestPytorchConfPyTorch(t *testing.T) {
	raw, err := os.ReadFile("../testdata/pytorch/parse.json")
	if err != nil {
		t.Fatal(err)
	}
	var probes []struct {
		Conf     string `json:"conf"`
		Error    string `json:"error"`
		Settings struct {
			MaxSplit   int64            `json:"max_split_size"`
			GC         float64          `json:"garbage_collection_threshold"`
			Expandable bool             `json:"expandable_segments"`
			Roundup    map[string]int64 `json:"roundup_power2_divisions"`
		} `json:"settings"`
	}
	if err := json.Unmarshal(raw, &probes); err != nil {
		t.Fatal(err)
	}
	for _, pr := range probes {
		cfg := defaultPytorchConfig()
		err := parsePytorchConf(pr.Conf, &cfg)
		if pr.Error != "" {
			if err == nil {
				t.Errorf("%q: parsed, PyTorch said %s", pr.Conf, pr.Error)
			} else {
				t.Logf("%q: %v (PyTorch: %s)", pr.Conf, err, pr.Error)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v, PyTorch took it", pr.Conf, err)
			continue
		}
		want := defaultPytorchConfig()
		if pr.Settings.MaxSplit >= 0 {
			want.maxSplitSize = uint64(pr.Settings.MaxSplit)
		}
		want.garbageCollectionThreshold = pr.Settings.GC
		want.expandableSegments = pr.Settings.Expandable
		for k, d := range pr.Settings.Roundup {
			mb, _ := strconv.ParseUint(k, 10, 64)
			want.roundupDivisions[bits.Len64(mb)-1] = uint64(d)
		}
		want.maxNonSplitRounding = cfg.maxNonSplitRounding // not recorded by PyTorch
		if cfg != want {
			t.Errorf("%q:\n got %+v\nwant %+v", pr.Conf, cfg, want)
		}
	}
}

func TestPytorchConf(t *testing.T) {
	const MiB = 1 << 20
	div := func(ds ...uint64) (a [ptRoundupIntervals]uint64) {
		copy(a[:], ds)
		return a
	}
	cases := []struct {
		conf string
		want pytorchConfig
	}{
		{"", defaultPytorchConfig()},
		{"max_split_size_mb:128", pytorchConfig{maxSplitSize: 128 * MiB, maxNonSplitRounding: 20 * MiB}},
		// stoull reads the digits and ignores the rest; spaces are dropped.
		{" max_split_size_mb : 64MB ,", pytorchConfig{maxSplitSize: 64 * MiB, maxNonSplitRounding: 20 * MiB}},
		{"max_non_split_rounding_mb:40", pytorchConfig{maxSplitSize: math.MaxUint64, maxNonSplitRounding: 40 * MiB}},
		{"roundup_power2_divisions:4", pytorchConfig{maxSplitSize: math.MaxUint64, maxNonSplitRounding: 20 * MiB,
			roundupDivisions: div(4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4)}},
		// The first entry sets the intervals below it too; 128 MiB is
		// left at 0; ">" sets every interval after the last named.
		{"roundup_power2_divisions:[64:8,256:4,>:1]", pytorchConfig{maxSplitSize: math.MaxUint64, maxNonSplitRounding: 20 * MiB,
			roundupDivisions: div(8, 8, 8, 8, 8, 8, 8, 0, 4, 1, 1, 1, 1, 1, 1, 1)}},
		// Intervals past 32 GiB are the last one.
		{"roundup_power2_divisions:[65536:2]", pytorchConfig{maxSplitSize: math.MaxUint64, maxNonSplitRounding: 20 * MiB,
			roundupDivisions: div(2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2)}},
		{"garbage_collection_threshold:0.6", pytorchConfig{maxSplitSize: math.MaxUint64, maxNonSplitRounding: 20 * MiB, garbageCollectionThreshold: 0.6}},
		{"expandable_segments:True,release_lock_on_cudamalloc:True,pinned_num_register_threads:8,backend:native",
			pytorchConfig{maxSplitSize: math.MaxUint64, maxNonSplitRounding: 20 * MiB, expandableSegments: true}},
	}
	for _, tc := range cases {
		cfg := defaultPytorchConfig()
		if err := parsePytorchConf(tc.conf, &cfg); err != nil {
			t.Errorf("%q: %v", tc.conf, err)
			continue
		}
		if cfg != tc.want {
			t.Errorf("%q:\n got %+v\nwant %+v", tc.conf, cfg, tc.want)
		}
	}
}

// TestPytorchConfErrors: every error names the key at fault.
func TestPytorchConfErrors(t *testing.T) {
	cases := []struct{ conf, want string }{
		{"max_split_size:128", `unknown key "max_split_size"`},
		{"max_split_size_mb:19", "max_split_size_mb: 19 is too small, must be >= 20"},
		{"max_split_size_mb:abc", `max_split_size_mb: "abc" is not a number`},
		{"max_split_size_mb", "max_split_size_mb: the settings end before its value"},
		{"max_split_size_mb:99999999999999999999", `max_split_size_mb: "99999999999999999999" is out of range`},
		{"max_non_split_rounding_mb:10", "max_non_split_rounding_mb: 10 is too small, must be >= 20"},
		{"garbage_collection_threshold:1.0", "garbage_collection_threshold: 1 is not in (0.0, 1.0)"},
		{"garbage_collection_threshold:0", "garbage_collection_threshold: 0 is not in (0.0, 1.0)"},
		{"garbage_collection_threshold:x", `garbage_collection_threshold: "x" is not a number`},
		{"expandable_segments:true", `expandable_segments: want True or False, got "true"`},
		{"roundup_power2_divisions:3", "roundup_power2_divisions: 3 divisions, must be a power of 2"},
		{"roundup_power2_divisions:[64:3]", "roundup_power2_divisions: 3 divisions, must be a power of 2 or 0"},
		{"roundup_power2_divisions:[3:4]", "roundup_power2_divisions: interval 3 MiB, must be a power of 2"},
		{"roundup_power2_divisions:[128:2,", "roundup_power2_divisions: no closing ]"},
		// PyTorch steps over whatever stands where a comma should: here
		// "True" becomes a key.
		{"max_split_size_mb:128;expandable_segments:True", `unknown key "True"`},
		{"backend:cudaMallocAsync", "backend: cudaMallocAsync replaces the caching allocator"},
		{"release_lock_on_cudamalloc:yes", `release_lock_on_cudamalloc: want True or False, got "yes"`},
		{"pinned_num_register_threads:3", "pinned_num_register_threads: 3, must be a power of 2 up to 128"},
	}
	for _, tc := range cases {
		cfg := defaultPytorchConfig()
		err := parsePytorchConf(tc.conf, &cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want %q", tc.conf, err, tc.want)
		}
	}
}

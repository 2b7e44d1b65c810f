package replaycli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/sim/fidelity"
)

// copyFiles copies files of the repository into dir: names maps each new
// name (relative to dir) to its file (from the repository's root). It
// makes the folders they need.
func copyFiles(t *testing.T, dir string, names map[string]string) {
	t.Helper()
	for to, from := range names {
		raw, err := os.ReadFile(filepath.Join("..", "..", "..", from))
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, to)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, raw, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// noFigures is what fidelity says a figures file without figures lacks.
const noFigures = ": no figure to compare: it has none of max_memory_reserved, max_memory_allocated, " +
	"memory_stats' num_device_alloc, num_device_free, num_alloc_retries or num_ooms (PyTorch), " +
	"peak_bytes_in_use, peak_pool_bytes or num_allocs under stats or memory_stats (JAX), " +
	"peak_total_bytes or device_allocs (CuPy)"

// TestFidelityNoFigures: a figures file beside a trace that holds nothing
// fidelity can compare (a snapshot's stats.json with only its cap, an
// XSpace's NAME.json with only JAX's memory limit, a CuPy log's stats.json
// with only its limit) fails the command, naming the file and what it
// lacks, with nothing printed, also when a good trace comes first; before,
// each printed that its figures agreed, having compared none.
func TestFidelityNoFigures(t *testing.T) {
	dir := t.TempDir()
	copyFiles(t, dir, map[string]string{
		"good.pickle.gz":    "testdata/pytorch/churn.pickle.gz",
		"good.stats.json":   "testdata/pytorch/churn.stats.json",
		"snap.pickle.gz":    "testdata/pytorch/churn.pickle.gz",
		"attn.xplane.pb.gz": "testdata/jax/xspace/attn.growth.xplane.pb.gz",
		"linalg.jsonl":      "testdata/cupy/linalg.jsonl",
	})
	files := map[string]string{
		"snap.stats.json":   `{"workload": "churn", "mem_cap_bytes": 0, "ooms_caught": 0}`,
		"attn.json":         `{"workload": "attn", "stats": {"bytes_limit": 112583507968, "bytes_in_use": 0}}`,
		"linalg.stats.json": `{"workload": "linalg", "limit_bytes": 0}`,
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct{ trace, figures string }{
		{"snap.pickle.gz", "snap.stats.json"},
		{"attn.xplane.pb.gz", "attn.json"},
		{"linalg.jsonl", "linalg.stats.json"},
	} {
		out, _, err := runCmd(t, "fidelity", filepath.Join(dir, "good.pickle.gz"), filepath.Join(dir, tc.trace))
		if want := filepath.Join(dir, tc.figures) + noFigures; err == nil || err.Error() != want || out != "" {
			t.Errorf("fidelity %s: %v, output %q; want no output and the error %q", tc.trace, err, out, want)
		}
	}
}

// TestFidelityXSpaceMemoryStats: JAX's memory_stats() beside an XSpace
// under "memory_stats" instead of "stats" (the figures of
// testdata/jax/xspace rewrapped) gives the same verdict: the same
// settings inferred from them (attn's grown pool: allow_growth=true; train's
// preallocated one: false) and the same figures compared; before, the
// "memory_stats" shape was not read, so that attn replayed preallocated
// and nothing was compared.
func TestFidelityXSpaceMemoryStats(t *testing.T) {
	for name, want := range map[string]string{
		"attn.growth": "attn.growth.xplane.pb.gz: figures agree (1963 mallocs, no device call recorded; peaks and counters as measured in attn.growth.json; policy bfc, settings allow_growth=true memory_limit=112583507968)\n",
		"train.bfc":   "train.bfc.xplane.pb.gz: figures agree (1377 mallocs, no device call recorded; peaks and counters as measured in train.bfc.json; policy bfc, settings allow_growth=false memory_limit=112583507968)\n",
	} {
		src := filepath.Join("testdata", "jax", "xspace", name)
		raw, err := os.ReadFile(filepath.Join("..", "..", "..", src+".json"))
		if err != nil {
			t.Fatal(err)
		}
		var doc map[string]any
		if err := json.Unmarshal(raw, &doc); err != nil {
			t.Fatal(err)
		}
		rewrapped, _ := json.Marshal(map[string]any{"workload": doc["workload"], "memory_stats": doc["stats"]})
		for shape, figures := range map[string][]byte{"stats": raw, "memory_stats": rewrapped} {
			dir := t.TempDir()
			copyFiles(t, dir, map[string]string{name + ".xplane.pb.gz": src + ".xplane.pb.gz"})
			if err := os.WriteFile(filepath.Join(dir, name+".json"), figures, 0o644); err != nil {
				t.Fatal(err)
			}
			out, _, err := runCmd(t, "fidelity", filepath.Join(dir, name+".xplane.pb.gz"))
			if err != nil || out != want {
				t.Errorf("%s under %q: %v, output %q; want %q", name, shape, err, out, want)
			}
		}
	}
	// Figures that differ are found in either shape: train's grown pool
	// against the preallocated run's figures.
	dir := t.TempDir()
	copyFiles(t, dir, map[string]string{"train.xplane.pb.gz": "testdata/jax/xspace/train.bfc.xplane.pb.gz"})
	if err := os.WriteFile(filepath.Join(dir, "train.json"), []byte(`{"memory_stats": {"num_allocs": 1377, "peak_bytes_in_use": 388236800, "bytes_limit": 112583507968, "peak_pool_bytes": 112583507968}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	out, _, err := runCmd(t, "fidelity", "--set", "bfc.allow_growth=true", filepath.Join(dir, "train.xplane.pb.gz"))
	const want = "train.xplane.pb.gz: figures differ from the real allocator's (train.json; policy bfc):\n" +
		"train.xplane.pb.gz:   peak reserved bytes: real allocator 112583507968, simulation "
	if err == nil || !strings.HasPrefix(out, want) {
		t.Errorf("grown: %v, output %q; want an error and the output to start %q", err, out, want)
	}
}

// TestFidelityJob: a job given as a directory, a glob, or its ranks one
// by one is replayed rank by rank, and a line follows for the job. The
// real DDP job of two ranks on one GPU (testdata/pytorch/ddp) is identical
// rank by rank, 939524096 bytes peak reserved at rank 1 and 734003200 at
// rank 0 (its stats.json's max_memory_reserved), a spread of 21.9%
// (205520896/939524096); a job of churn_oom's two recordings under their
// cap (the later, stacks/, as rank 0) fails first at rank 1, whose OOM at
// event 180 came first in time, though both OOM there; traces whose names
// say no rank are ranked in their order (churn then mlp, sorted:
// 1818230784 and 830472192 bytes, 54.3%); a folder can say the rank. The
// directory case is the README's command, with its job line.
func TestFidelityJob(t *testing.T) {
	dir := t.TempDir()
	copyFiles(t, dir, map[string]string{
		"oom/job-rank0.pickle.gz":          "testdata/pytorch/stacks/churn_oom.pickle.gz",
		"oom/job-rank0.stats.json":         "testdata/pytorch/stacks/churn_oom.stats.json",
		"oom/job-rank1.pickle.gz":          "testdata/pytorch/churn_oom.pickle.gz",
		"oom/job-rank1.stats.json":         "testdata/pytorch/churn_oom.stats.json",
		"order/a.pickle.gz":                "testdata/pytorch/churn.pickle.gz",
		"order/a.stats.json":               "testdata/pytorch/churn.stats.json",
		"order/b.pickle.gz":                "testdata/pytorch/mlp.pickle.gz",
		"order/b.stats.json":               "testdata/pytorch/mlp.stats.json",
		"folders/rank1/snapshot.pickle.gz": "testdata/pytorch/ddp/ddp_rank1.pickle.gz",
		"folders/rank0/snapshot.pickle.gz": "testdata/pytorch/ddp/ddp_rank0.pickle.gz",
	})
	const (
		ddp0 = "ddp_rank0.pickle.gz: identical (24 device calls, 153 mallocs; peaks and counters as measured in ddp_rank0.stats.json; policy pytorch, settings default)\n"
		ddp1 = "ddp_rank1.pickle.gz: identical (24 device calls, 161 mallocs; peaks and counters as measured in ddp_rank1.stats.json; policy pytorch, settings default)\n"
		ddpJ = "job ddp_rank*.pickle.gz (2 ranks, policy pytorch): largest peak reserved 939524096 bytes (rank 1), smallest 734003200 bytes (rank 0), spread 21.9%; no rank ran out of memory; every rank as recorded\n"
		oom0 = "job-rank0.pickle.gz: identical (39 device calls, 295 mallocs; peaks and counters as measured in job-rank0.stats.json; policy pytorch, settings default)\n"
		oom1 = "job-rank1.pickle.gz: identical (39 device calls, 295 mallocs; peaks and counters as measured in job-rank1.stats.json; policy pytorch, settings default)\n"
		oomJ = "job job-rank*.pickle.gz (2 ranks, policy pytorch): largest peak reserved 811597824 bytes (rank 0), smallest 811597824 bytes (rank 0), spread 0.0%; first to fail: rank 1, out of memory at event 180 (ranks out of memory: 0,1); every rank as recorded\n"
	)
	ddp := filepath.Join("..", "..", "..", "testdata", "pytorch", "ddp")
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"directory", []string{ddp}, ddp0 + ddp1 + ddpJ},
		{"glob", []string{filepath.Join(ddp, "*rank*.pickle.gz")}, ddp0 + ddp1 + ddpJ},
		{"one by one, in any order", []string{filepath.Join(ddp, "ddp_rank1.pickle.gz"), filepath.Join(ddp, "ddp_rank0.pickle.gz")}, ddp1 + ddp0 + ddpJ},
		{"first to fail by time", []string{filepath.Join(dir, "oom")}, oom0 + oom1 + oomJ},
		{"ranks in order", []string{filepath.Join(dir, "order")},
			"a.pickle.gz (rank 0): identical (31 device calls, 285 mallocs; peaks and counters as measured in a.stats.json; policy pytorch, settings default)\n" +
				"b.pickle.gz (rank 1): identical (94 device calls, 417 mallocs; peaks and counters as measured in b.stats.json; policy pytorch, settings default)\n" +
				"job " + filepath.Join(dir, "order") + " (2 ranks, policy pytorch): largest peak reserved 1818230784 bytes (rank 0), smallest 830472192 bytes (rank 1), spread 54.3%; no rank ran out of memory; every rank as recorded\n"},
		{"rank folders", []string{filepath.Join(dir, "folders", "rank*", "*.pickle.gz")},
			"snapshot.pickle.gz (rank 0): identical (24 device calls, 153 mallocs; no measured figures beside it; policy pytorch, settings default)\n" +
				"snapshot.pickle.gz (rank 1): identical (24 device calls, 161 mallocs; no measured figures beside it; policy pytorch, settings default)\n" +
				"job rank*/snapshot.pickle.gz (2 ranks, policy pytorch): largest peak reserved 939524096 bytes (rank 1), smallest 734003200 bytes (rank 0), spread 21.9%; no rank ran out of memory; every rank as recorded\n"},
		{"a job and a trace", []string{filepath.Join("..", "..", "..", "testdata", "pytorch", "mlp.pickle.gz"), ddp},
			"mlp.pickle.gz: identical (94 device calls, 417 mallocs; peaks and counters as measured in mlp.stats.json; policy pytorch, settings default)\n" + ddp0 + ddp1 + ddpJ},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, _, err := runCmd(t, append([]string{"fidelity"}, tc.args...)...)
			if err != nil || out != tc.want {
				t.Errorf("fidelity %q: %v, output\n%s\nwant\n%s", tc.args, err, out, tc.want)
			}
		})
	}
	// Without their cap both ranks diverge at their OOM: the job's line
	// says so, its figures stopping there.
	out, _, err := runCmd(t, "fidelity", "--capacity", "0", filepath.Join(dir, "oom"))
	const diverged = "job job-rank*.pickle.gz (2 ranks, policy pytorch): largest peak reserved 843055104 bytes (rank 0), smallest 843055104 bytes (rank 0), spread 0.0%; no rank ran out of memory; ranks that differ from their recording: 0,1 (the figures of 0,1 stop at their divergence)\n"
	if err == nil || err.Error() != "fidelity: 2 of 2 traces diverge from their recording" || !strings.HasPrefix(out, "job-rank0.pickle.gz: diverges at event 180: ") || !strings.HasSuffix(out, diverged) {
		t.Errorf("fidelity --capacity 0: %v, output\n%s\nwant it to end\n%s", err, out, diverged)
	}
}

// TestFidelityJobErrors: two traces of one rank of a job, and a
// directory without a trace, are errors naming them, with nothing
// printed.
func TestFidelityJobErrors(t *testing.T) {
	dir := t.TempDir()
	copyFiles(t, dir, map[string]string{
		"job/ddp_rank0.pickle.gz":  "testdata/pytorch/ddp/ddp_rank0.pickle.gz",
		"job/ddp_rank00.pickle.gz": "testdata/pytorch/ddp/ddp_rank1.pickle.gz",
	})
	if err := os.Mkdir(filepath.Join(dir, "empty"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		arg, want string
	}{
		{filepath.Join(dir, "job"), "fidelity: " + filepath.Join(dir, "job", "ddp_rank0.pickle.gz") + " and " + filepath.Join(dir, "job", "ddp_rank00.pickle.gz") + " are both rank 0 of job ddp_rank*.pickle.gz"},
		{filepath.Join(dir, "empty"), "fidelity: " + filepath.Join(dir, "empty") + ": no trace in it"},
	} {
		out, _, err := runCmd(t, "fidelity", tc.arg)
		if err == nil || err.Error() != tc.want || out != "" {
			t.Errorf("fidelity %s: %v, output %q; want the error %q", tc.arg, err, out, tc.want)
		}
	}
}

// TestRankOf: the rank of a trace from its file name (the names the help
// gives), else from its folder's; none from a name without one.
func TestRankOf(t *testing.T) {
	for path, want := range map[string]struct {
		pattern string
		rank    int
		inName  bool
		ok      bool
	}{
		"d/rank0.pickle.gz":         {"d/rank*.pickle.gz", 0, true, true},
		"d/job_rank_1.pickle.gz":    {"d/job_rank_*.pickle.gz", 1, true, true},
		"d/snap-rank3.pickle.gz":    {"d/snap-rank*.pickle.gz", 3, true, true},
		"d/rank2/snapshot.pickle":   {"d/rank*/snapshot.pickle", 2, false, true},
		"rank12/snapshot.pickle.gz": {"rank*/snapshot.pickle.gz", 12, false, true},
		"d/rank5/job.rank1.trace":   {"d/rank5/job.rank*.trace", 1, true, true}, // the file's name first
		"d/frank1/snapshot.pickle":  {"", 0, false, false},
		"snapshot.pickle":           {"", 0, false, false},
	} {
		pattern, rank, inName, ok := fidelity.RankOf(filepath.FromSlash(path))
		if pattern != filepath.FromSlash(want.pattern) || rank != want.rank || inName != want.inName || ok != want.ok {
			t.Errorf("rankOf(%q) = %q, %d, %v, %v; want %+v", path, pattern, rank, inName, ok, want)
		}
	}
}

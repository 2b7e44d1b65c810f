package replaycli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/sim/results"
)

// TestSimJob replays a job of two ranks made from two real one-GPU
// recordings (testdata/pytorch: mlp as rank 0, churn as rank 1; there is no
// real multi-GPU recording yet) under a 1 GiB device per rank: mlp fits
// (792 MiB reserved, as its table row says), churn runs out of memory
// first at its event 310, and the job's line names rank 1 as the largest
// and failing rank, with the spread (1024-792)/1024 = 22.7%.
func TestSimJob(t *testing.T) {
	dir := jobDir(t)
	out, _, err := runCmd(t, "sim", "--policy", "pytorch", "--capacity", "1GiB", filepath.Join(dir, "job.rank0.pickle.gz"), filepath.Join(dir, "job.rank1.pickle.gz"))
	if err != nil {
		t.Fatal(err)
	}
	checkJobLine(t, out, "job.rank*.pickle.gz pytorch 2 1024.0 1 792.0 0 22.7% 1024.0 1 1 rank 1, event 310")
}

// TestFitJob: replay fit on the same job: it fits where its largest rank,
// churn (rank 1), does, whose rows say 1734.0 MiB and a 2260.8 MiB card.
func TestFitJob(t *testing.T) {
	dir := jobDir(t)
	out, _, err := runCmd(t, "fit", "--policy", "pytorch", "--cards", "2GiB,3GiB", filepath.Join(dir, "job.rank0.pickle.gz"), filepath.Join(dir, "job.rank1.pickle.gz"))
	if err != nil {
		t.Fatal(err)
	}
	checkJobLine(t, out, "job.rank*.pickle.gz pytorch 2 1734.0 1 2260.8 1 no yes")
}

// checkJobLine finds the line of out that names the job and compares its
// fields with want's.
func checkJobLine(t *testing.T, out, want string) {
	t.Helper()
	var line string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "job.rank*") {
			line = l
		}
	}
	if strings.Join(strings.Fields(line), " ") != want {
		t.Errorf("job line %q, want the fields %q\n%s", line, want, out)
	}
}

// jobDir returns a directory with a job of two ranks made from real
// one-GPU recordings: mlp as rank 0, churn as rank 1.
func jobDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for rank, name := range []string{"mlp", "churn"} {
		raw, err := os.ReadFile(filepath.Join("..", "..", "..", "testdata", "pytorch", name+".pickle.gz"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "job.rank"+strconv.Itoa(rank)+".pickle.gz"), raw, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestTuneJob: replay tune on the same job under 1 GiB a rank recommends
// one setting for both ranks, ranked by the largest rank's peak and the
// ranks' OOMs together (measured: churn's 8 OOMs under the recorded
// setting, 6 under the recommended one; mlp fits either way).
func TestTuneJob(t *testing.T) {
	dir := jobDir(t)
	out, _, err := runCmd(t, "tune", "--top", "1", "--capacity", "1GiB", filepath.Join(dir, "job.rank0.pickle.gz"), filepath.Join(dir, "job.rank1.pickle.gz"))
	if err != nil {
		t.Fatal(err)
	}
	const want = `job job.rank*.pickle.gz (2 ranks): recommended for every rank: PYTORCH_CUDA_ALLOC_CONF="roundup_power2_divisions:8,garbage_collection_threshold:0.6": predicted peak reserved of its largest rank 1071644672 bytes, 6 OOMs over the ranks, 115 device calls (recorded: 1073741824 bytes, 8 OOMs, 125)`
	if !strings.Contains(out, want+"\n") {
		t.Errorf("no job line %q in\n%s", want, out)
	}
}

// TestReportJob: the report of the job's replay has a section with the
// ranks side by side, a row per policy.
func TestReportJob(t *testing.T) {
	dir := jobDir(t)
	js := filepath.Join(dir, "job.json")
	if _, _, err := runCmd(t, "sim", "--policy", "pytorch", "--capacity", "1GiB", "--json", js, filepath.Join(dir, "job.rank0.pickle.gz"), filepath.Join(dir, "job.rank1.pickle.gz")); err != nil {
		t.Fatal(err)
	}
	html := filepath.Join(dir, "r.html")
	if _, _, err := runCmd(t, "report", "-o", html, js); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(html)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"<h2>Job job.rank*.pickle.gz</h2>", "<h3>Ranks side by side</h3>", `<th class="sortable" tabindex="0" aria-sort="none">rank 0 reserved MiB</th><th class="sortable" tabindex="0" aria-sort="none">rank 1 reserved MiB</th>`,
		`<td>pytorch</td><td class="num" data-v="830472192">792.0</td><td class="num" title="the largest rank" data-v="1073741824">1024.0</td><td class="num" data-v="0.2265625">22.7%</td><td>1</td><td>rank 1, event 310</td>`} {
		if !strings.Contains(string(raw), want) {
			t.Errorf("no %q in the report", want)
		}
	}
}

// TestSimAllDevices: --device all replays each device of a multi-device
// snapshot (trace/pytorch/testdata/tiny_proto4: device 0 with a failed
// 1 TiB malloc, device 1 with one 4 KiB block) as a rank of a job.
func TestSimAllDevices(t *testing.T) {
	out, _, err := runCmd(t, "sim", "--policy", "pytorch", "--device", "all", filepath.Join("..", "..", "..", "trace", "pytorch", "testdata", "tiny_proto4.pickle.gz"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"tiny_proto4.pickle.gz#rank0  pytorch", "tiny_proto4.pickle.gz#rank1  pytorch"} {
		if !strings.Contains(out, want) {
			t.Errorf("no row %q in\n%s", want, out)
		}
	}
	var line string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "tiny_proto4.pickle.gz#rank*") {
			line = l
		}
	}
	if got := strings.Join(strings.Fields(line), " "); got != "tiny_proto4.pickle.gz#rank* pytorch 2 4.0 0 2.0 1 50.0% 4.0 0 0 rank 0, event 5" {
		t.Errorf("job line %q\n%s", got, out)
	}
	if _, _, err := runCmd(t, "sim", "--device", "x", "t.trace"); err == nil || !strings.Contains(err.Error(), `--device "x": want a device index or all`) {
		t.Errorf("--device x: %v", err)
	}
}

// TestSimJobJSON: replay sim --json over a job's ranks (the job of
// TestSimJob: mlp as rank 0, churn as rank 1, under 1 GiB a rank) gives
// each rank's result its rank and lists the job after the results, with
// the figures of its line in the table: rank 1 the largest (1073741824
// bytes) and the first to run out of memory (event 310), rank 0 the
// smallest (830472192), a spread of 0.2265625. A trace of no job has no
// rank, and a file without a job no "jobs".
func TestSimJobJSON(t *testing.T) {
	dir := jobDir(t)
	js := filepath.Join(dir, "job.json")
	r0, r1 := filepath.Join(dir, "job.rank0.pickle.gz"), filepath.Join(dir, "job.rank1.pickle.gz")
	if _, _, err := runCmd(t, "sim", "--policy", "pytorch", "--capacity", "1GiB", "--json", js, r1, r0, splitFragOOM); err != nil {
		t.Fatal(err)
	}
	rd, err := results.Open(js)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	ranks := map[string]int{}
	for rd.Scan() {
		r := rd.Record().Sim
		ranks[filepath.Base(r.Trace)] = -1
		if r.Rank != nil {
			ranks[filepath.Base(r.Trace)] = *r.Rank
		}
	}
	if err := rd.Err(); err != nil {
		t.Fatal(err)
	}
	if want := map[string]int{"job.rank0.pickle.gz": 0, "job.rank1.pickle.gz": 1, filepath.Base(splitFragOOM): -1}; !reflect.DeepEqual(ranks, want) {
		t.Errorf("ranks %v, want %v", ranks, want)
	}
	peak1 := uint64(1073741824)
	want := []*results.Job{{Job: filepath.Join(dir, "job.rank*.pickle.gz"), Policy: "pytorch", Ranks: []int{0, 1}, Traces: []string{r0, r1},
		MaxReserved: peak1, MaxReservedRank: 1, MinReserved: 830472192, MinReservedRank: 0, Spread: 0.2265625,
		MaxFootprint: peak1, MaxFootprintRank: 1, OOMRanks: []int{1}, FirstOOMRank: 1, FirstOOMEvent: 310}}
	got := rd.Jobs()
	if len(got) == 1 {
		want[0].FirstOOMTime = got[0].FirstOOMTime // churn's clock
	}
	if !reflect.DeepEqual(got, want) || want[0].FirstOOMTime == 0 {
		raw, _ := json.Marshal(got)
		t.Errorf("jobs %s, want one like %+v", raw, want[0])
	}
	if _, _, err := runCmd(t, "sim", "--policy", "pytorch", "--json", js, splitFragOOM); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(js)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(raw), `"jobs"`) || strings.Contains(string(raw), `"rank"`) {
		t.Errorf("a trace of no job: %s", raw)
	}
}

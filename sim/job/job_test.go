package job

import (
	"reflect"
	"testing"

	"github.com/gpualloc/allocsim/sim/results"
)

func TestRank(t *testing.T) {
	for path, want := range map[string]struct {
		job  string
		rank int
		ok   bool
	}{
		"runs/job.rank1.trace":                          {"runs/job.rank*.trace", 1, true},
		"job.rank12.pickle.gz":                          {"job.rank*.pickle.gz", 12, true},
		"snap/iteration_5/rank0_memory_snapshot.pickle": {"snap/iteration_5/rank*_memory_snapshot.pickle", 0, true},
		"job_rank3.pickle.gz":                           {"job_rank*.pickle.gz", 3, true},
		"RANK-2.jsonl":                                  {"RANK-*.jsonl", 2, true},
		"ranked/frank1.trace":                           {"", 0, false}, // "rank" inside a word
		"train_gpt.pickle.gz":                           {"", 0, false},
	} {
		job, rank, ok := Rank(path)
		if job != want.job || rank != want.rank || ok != want.ok {
			t.Errorf("Rank(%q) = %q, %d, %v; want %q, %d, %v", path, job, rank, ok, want.job, want.rank, want.ok)
		}
	}
}

// TestSummarize: two jobs of results worked by hand; the first OOM is the
// earliest in time, not in events.
func TestSummarize(t *testing.T) {
	r := func(trace, policy string, reserved, footprint uint64, ooms, event, time int64) *results.Result {
		return &results.Result{Trace: trace, Policy: policy, PeakReserved: reserved, PeakFootprint: footprint, OOMs: ooms, FirstOOMEvent: event, FirstOOMTime: time}
	}
	sums := Summarize([]*results.Result{
		r("a.rank1.trace", "p", 300, 310, 2, 50, 9000),
		r("a.rank0.trace", "p", 200, 220, 1, 900, 4000), // later event, earlier time: first
		r("a.rank2.trace", "p", 300, 330, 0, -1, 0),
		r("single.trace", "p", 999, 999, 0, -1, 0), // no rank: no job
		r("b.rank0.trace", "p", 10, 10, 0, -1, 0),  // one rank: no summary
	})
	if len(sums) != 1 {
		t.Fatalf("%d summaries, want 1", len(sums))
	}
	s := sums[0]
	got := [...]any{s.Job, len(s.Ranks), s.MaxReserved, s.MaxReservedRank, s.MinReserved, s.MinReservedRank, s.MaxFootprint, s.MaxFootprintRank, len(s.OOMRanks), s.FirstOOMRank, s.FirstOOMEvent, s.FirstOOMTime}
	want := [...]any{"a.rank*.trace", 3, uint64(300), 1, uint64(200), 0, uint64(330), 2, 2, 0, int64(900), int64(4000)}
	if got != want {
		t.Errorf("summary %v, want %v", got, want)
	}
	if sp := s.Spread(); sp != 1.0/3 {
		t.Errorf("spread %v, want 1/3", sp)
	}
	// Two failing ranks without times: no first rank.
	sums = Summarize([]*results.Result{r("c.rank0.t", "p", 1, 1, 1, 5, 0), r("c.rank1.t", "p", 1, 1, 1, 3, 0)})
	if s := sums[0]; s.FirstOOMRank != -1 || len(s.OOMRanks) != 2 {
		t.Errorf("untimed: first OOM rank %d, OOM ranks %v", s.FirstOOMRank, s.OOMRanks)
	}
}

// TestRecord: a job's record in a results file (the jobs of TestSummarize,
// worked by hand) and each result marked with its rank; a job without an
// OOM lists no OOM rank and no first one.
func TestRecord(t *testing.T) {
	r := func(trace string, reserved, footprint uint64, ooms, event, time int64) *results.Result {
		return &results.Result{Trace: trace, Policy: "p", PeakReserved: reserved, PeakFootprint: footprint, OOMs: ooms, FirstOOMEvent: event, FirstOOMTime: time}
	}
	rs := []*results.Result{r("a.rank1.trace", 300, 310, 2, 50, 9000), r("a.rank0.trace", 200, 220, 1, 900, 4000), r("a.rank2.trace", 400, 330, 0, -1, 0), r("b.trace", 1, 1, 0, -1, 0)}
	sums := Summarize(rs)
	MarkRanks(sums)
	got := *sums[0].Record()
	want := results.Job{Job: "a.rank*.trace", Policy: "p", Ranks: []int{0, 1, 2}, Traces: []string{"a.rank0.trace", "a.rank1.trace", "a.rank2.trace"},
		MaxReserved: 400, MaxReservedRank: 2, MinReserved: 200, MinReservedRank: 0, Spread: 0.5, MaxFootprint: 330, MaxFootprintRank: 2,
		OOMRanks: []int{0, 1}, FirstOOMRank: 0, FirstOOMEvent: 900, FirstOOMTime: 4000}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("record\n%+v\nwant\n%+v", got, want)
	}
	for i, wantRank := range []int{1, 0, 2} {
		if rs[i].Rank == nil || *rs[i].Rank != wantRank {
			t.Errorf("%s: rank %v, want %d", rs[i].Trace, rs[i].Rank, wantRank)
		}
	}
	if rs[3].Rank != nil {
		t.Errorf("b.trace, of no job: rank %d, want none", *rs[3].Rank)
	}
	s := SummaryOf("dir", "q", []int{0, 1}, []*results.Result{r("x", 8, 8, 0, -1, 0), r("y", 6, 6, 0, -1, 0)})
	got = *s.Record()
	want = results.Job{Job: "dir", Policy: "q", Ranks: []int{0, 1}, Traces: []string{"x", "y"},
		MaxReserved: 8, MaxReservedRank: 0, MinReserved: 6, MinReservedRank: 1, Spread: 0.25, MaxFootprint: 8, MaxFootprintRank: 0,
		OOMRanks: []int{}, FirstOOMRank: -1, FirstOOMEvent: -1}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("record\n%+v\nwant\n%+v", got, want)
	}
}

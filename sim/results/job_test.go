package results

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"
)

// TestJobsRoundTrip: a sim file with jobs lists them after the results,
// and reads back each result's rank and the jobs; without jobs the file is
// what WriteSim writes, with no "jobs" key and no "rank".
func TestJobsRoundTrip(t *testing.T) {
	zero, one := 0, 1
	rs := []*Result{
		{Trace: "j.rank0.trace", Policy: "pytorch", Rank: &zero, PeakReserved: 2048, FirstOOMEvent: -1},
		{Trace: "j.rank1.trace", Policy: "pytorch", Rank: &one, PeakReserved: 4096, OOMs: 1, FirstOOMEvent: 7, FirstOOMTime: 900},
		{Trace: "alone.trace", Policy: "pytorch", PeakReserved: 1, FirstOOMEvent: -1},
	}
	jobs := []*Job{{Job: "j.rank*.trace", Policy: "pytorch", Ranks: []int{0, 1}, Traces: []string{"j.rank0.trace", "j.rank1.trace"},
		MaxReserved: 4096, MaxReservedRank: 1, MinReserved: 2048, MinReservedRank: 0, Spread: 0.5,
		OOMRanks: []int{1}, FirstOOMRank: 1, FirstOOMEvent: 7, FirstOOMTime: 900}}
	var buf bytes.Buffer
	if err := WriteSimJobs(&buf, rs, jobs); err != nil {
		t.Fatal(err)
	}
	text := buf.String()
	if !strings.Contains(text, "\n   \"rank\": 1,\n") || strings.Count(text, `"rank":`) != 2 ||
		!strings.Contains(text, "\n ],\n \"jobs\": [\n  {\n   \"job\": \"j.rank*.trace\",\n   \"policy\": \"pytorch\",\n   \"ranks\": [\n    0,\n    1\n   ],") ||
		!strings.Contains(text, "\n   \"spread\": 0.5,\n") || !strings.Contains(text, "\n   \"first_oom_rank\": 1,\n") {
		t.Errorf("file:\n%s", text)
	}
	r, err := NewReader(strings.NewReader(text), "in.json")
	if err != nil {
		t.Fatal(err)
	}
	var got []*Result
	for r.Scan() {
		got = append(got, r.Record().Sim)
	}
	if r.Err() != nil {
		t.Fatal(r.Err())
	}
	if !reflect.DeepEqual(got, rs) || !reflect.DeepEqual(r.Jobs(), jobs) {
		t.Errorf("read %+v and jobs %+v", got, r.Jobs())
	}
	var plain, none bytes.Buffer
	if err := WriteSim(&plain, rs[2:]); err != nil {
		t.Fatal(err)
	}
	if err := WriteSimJobs(&none, rs[2:], nil); err != nil {
		t.Fatal(err)
	}
	if plain.String() != none.String() || strings.Contains(plain.String(), `"jobs"`) || strings.Contains(plain.String(), `"rank"`) {
		t.Errorf("without jobs:\n%s\nWriteSim:\n%s", none.String(), plain.String())
	}
}

// TestJobsOldAndMoved: files without jobs (version 2 before jobs, version
// 1, no version) read as before, with no jobs; jobs before the results
// are read too; a job without a policy is an error naming the file.
func TestJobsOldAndMoved(t *testing.T) {
	for _, tc := range []struct {
		name, data string
		ranks      []int // the results' ranks, -1 for none
		jobs       int
	}{
		{"version 2 without jobs", `{"kind": "sim", "version": 2, "results": [{"trace": "a.rank0.t", "policy": "p"}, {"trace": "a.rank1.t", "policy": "p"}]}`, []int{-1, -1}, 0},
		{"version 1", `{"kind": "sim", "version": 1, "results": [{"trace": "t", "policy": "p"}]}`, []int{-1}, 0},
		{"no version", `{"results": [{"trace": "t", "policy": "p"}]}`, []int{-1}, 0},
		{"jobs first", `{"kind": "sim", "version": 2, "jobs": [{"job": "a.rank*.t", "policy": "p", "ranks": [0, 1]}], "results": [{"trace": "a.rank0.t", "policy": "p", "rank": 0}, {"trace": "a.rank1.t", "policy": "p", "rank": 1}]}`, []int{0, 1}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := NewReader(strings.NewReader(tc.data), "in.json")
			if err != nil {
				t.Fatal(err)
			}
			var ranks []int
			for r.Scan() {
				rank := -1
				if p := r.Record().Sim.Rank; p != nil {
					rank = *p
				}
				ranks = append(ranks, rank)
			}
			if r.Err() != nil || !reflect.DeepEqual(ranks, tc.ranks) || len(r.Jobs()) != tc.jobs {
				t.Errorf("err %v, ranks %v, %d jobs; want ranks %v, %d jobs", r.Err(), ranks, len(r.Jobs()), tc.ranks, tc.jobs)
			}
		})
	}
	_, _, err := readAll(t, `{"kind": "sim", "version": 2, "results": [{"trace": "t", "policy": "p"}], "jobs": [{"job": "a.rank*.t"}]}`)
	const want = `in.json: byte offset 104: jobs: job 0: no job or policy: not a job of replay sim`
	if !errors.Is(err, ErrNoJobOrPolicy) || err.Error() != want {
		t.Errorf("err = %v, want %q", err, want)
	}
}

package gpu

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/trace"
	"github.com/gpualloc/allocsim/trace/synth"
	"github.com/gpualloc/allocsim/trace/tracefile"
)

// TestBatchedSameAsUnbatched replays traces on the cuda target in batches
// and event by event: every figure, latency count, call-log line (but the
// durations), OOM, anomaly and recorded sequence must be the same.
func TestBatchedSameAsUnbatched(t *testing.T) {
	anomalies := "malloc id=1 size=100\nmalloc id=1 size=200\nfree id=7\nmalloc id=2 size=0\nfree id=2\n" +
		"malloc id=3 size=4096 kind=pinned\nmalloc id=4 size=5000\nfree id=3\nfree id=1\nfree id=4\nfree id=1\n"
	var churn strings.Builder // frees and mallocs of the same address within one batch
	for k := 0; k < 3000; k++ {
		fmt.Fprintf(&churn, "malloc id=%d size=%d\n", k%7, 512+k%13*1000)
		if k%3 != 0 {
			fmt.Fprintf(&churn, "free id=%d\n", k%7)
		} else {
			fmt.Fprintf(&churn, "stream_sync stream=0\n")
		}
	}
	for _, tc := range []struct {
		name     string
		open     func(t *testing.T) trace.Source
		env      []string
		maxBytes uint64
	}{
		{name: "multistream", open: func(t *testing.T) trace.Source { return textTrace(t, multistream) }, maxBytes: 32 << 20},
		{name: "anomalies", open: func(t *testing.T) trace.Source { return textTrace(t, anomalies) }, maxBytes: 1 << 20},
		{name: "churn", open: func(t *testing.T) trace.Source { return textTrace(t, churn.String()) }, maxBytes: 1 << 20},
		{name: "planted-oom", open: func(t *testing.T) trace.Source { return textTrace(t, churn.String()) }, maxBytes: 1 << 20,
			env: []string{"FAKECUDA_FAIL=cudaMalloc:5:2,cudaMalloc:1500:2"}},
		{name: "random-refused", open: func(t *testing.T) trace.Source {
			src, err := synth.New("random", 3, map[string]string{"allocations": "5000", "max-size": "1MiB"})
			if err != nil {
				t.Fatal(err)
			}
			return src
		}, maxBytes: 64 << 20},
		{name: "train_gpt", open: func(t *testing.T) trace.Source {
			f, err := tracefile.Open("../testdata/pytorch/multistream.pickle.gz", tracefile.Options{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { f.Close() })
			return f
		}, maxBytes: 4 << 30},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out [2]struct {
				res  string
				log  string
				seq  [2]string
				ooms int64
			}
			for k, unbatched := range []bool{false, true} {
				rt := fakeRuntime(t, "", append([]string{"FAKECUDA_TOTAL=8589934592"}, tc.env...)...)
				var log bytes.Buffer
				res, err := Replay(context.Background(), rt, tc.open(t), Config{
					Policy: TargetCUDA, MaxBytes: tc.maxBytes, CallLog: &log, RecordSeq: true, Unbatched: unbatched, SampleEvery: 100,
				})
				if err != nil {
					t.Fatal(err)
				}
				size, slot := res.Seq.Calls()
				out[k].seq = [2]string{fmt.Sprint(size), fmt.Sprint(slot)}
				out[k].ooms = res.OOMs
				// Timings differ, and so may the pointers the fake runtime
				// hands out; everything else must not.
				res.AllocTimeNS, res.SyncTimeNS, res.PolicyTimeNS, res.ReplayWallNS = 0, 0, 0, 0
				res.Seq, res.Runtime = nil, ""
				for i := range res.Latency {
					res.Latency[i].MedianNS, res.Latency[i].P90NS, res.Latency[i].P99NS, res.Latency[i].MaxNS, res.Latency[i].TotalNS = 0, 0, 0, 0, 0
				}
				j, err := json.Marshal(res)
				if err != nil {
					t.Fatal(err)
				}
				out[k].res = string(j)
				out[k].log = regexp.MustCompile(`,0x[0-9a-f]+,[0-9]+,[0-9]*\n`).ReplaceAllString(log.String(), "\n")
				if n := live(t, rt); n != 0 {
					t.Errorf("unbatched=%v: %d objects live at the end", unbatched, n)
				}
			}
			if a, b := out[0].res, out[1].res; a != b {
				k := 0
				for k < len(a) && k < len(b) && a[k] == b[k] {
					k++
				}
				t.Errorf("results differ from byte %d:\nbatched   ...%.300s\nunbatched ...%.300s", k, a[max(k-100, 0):], b[max(k-100, 0):])
			}
			if out[0].log != out[1].log {
				t.Errorf("call logs differ")
			}
			if out[0].seq != out[1].seq {
				t.Errorf("recorded sequences differ")
			}
			if tc.name == "planted-oom" && out[0].ooms != 2 || tc.name == "churn" && out[0].ooms != 0 {
				t.Errorf("%d OOMs", out[0].ooms)
			}
		})
	}
}

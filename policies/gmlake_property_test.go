package policies_test

import (
	"errors"
	"strconv"
	"testing"

	"pgregory.net/rapid"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/policies/policytest"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/trace"
)

// TestGMLakeStitchingProperty runs the conformance kit on gmlake with
// settings under which the kit's traces (requests up to 80 MiB) stitch: the
// default fragLimit of 512 MiB never does there. fragLimit=0 stitches every
// large request that no free block fits; autoGC=0 collects the free
// stitched blocks after each stitch; the defragLevels stitch only under a
// capacity (the kit caps a quarter of its traces).
func TestGMLakeStitchingProperty(t *testing.T) {
	for _, s := range []policies.Settings{
		{"fragLimit": "0"},
		{"fragLimit": "0", "autoGC": "0"},
		{"fragLimit": "4MiB", "reuseLimit": "1.5"},
		{"fragLimit": "0", "defragLevel": "1"},
		{"fragLimit": "0", "defragLevel": "2", "reuseLimit": "0"},
	} {
		t.Run(s.Join(","), func(t *testing.T) {
			policytest.Run(t, "gmlake", &policytest.Options{Settings: s, Rounds: 2})
		})
	}
}

// TestGMLakeReuseProperty replays random traces of large requests of a few
// sizes (so that stitched blocks are freed and taken again, their pages
// shared with original blocks, and segments under stitched blocks in use
// given back by retries and empty_cache) under the invariant checker
// (sim.Checker: no two live blocks overlap, each lies in mapped memory,
// the device's reserved bytes are the mapped pages', free space agrees),
// on a capacity (PyTorch's memory fraction, or the card's, where the
// device refuses maps) or none. Each replay must end without error, and
// one without OOMs must reserve at least its peak of requested bytes.
func TestGMLakeReuseProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		sizes := []uint64{2, 4, 6, 10, 12, 16, 20, 24, 32, 40}
		streams := rapid.IntRange(1, 2).Draw(t, "streams")
		var evs []trace.Event
		emit := func(ev trace.Event) {
			ev.Time = int64(len(evs))
			evs = append(evs, ev)
		}
		// Steps of a training loop: the same mallocs each step, a few
		// sizes changed, some kept past the step, the rest freed in an
		// order of their own; empty_cache now and then.
		type req struct{ size, stream uint64 }
		step := make([]req, rapid.IntRange(2, 12).Draw(t, "mallocs"))
		draw := func(k int) {
			n := sizes[rapid.IntRange(0, len(sizes)-1).Draw(t, "size")] << 20
			n -= uint64(rapid.IntRange(0, 3).Draw(t, "less")) * 700 << 10
			if rapid.IntRange(0, 9).Draw(t, "small") == 0 {
				n = uint64(rapid.IntRange(1, 1<<20).Draw(t, "smallSize"))
			}
			step[k] = req{n, uint64(rapid.IntRange(0, streams-1).Draw(t, "stream"))}
		}
		for k := range step {
			draw(k)
		}
		var kept []uint64
		next := uint64(1)
		for range rapid.IntRange(1, 8).Draw(t, "steps") {
			for range rapid.IntRange(0, 2).Draw(t, "changes") {
				draw(rapid.IntRange(0, len(step)-1).Draw(t, "changed"))
			}
			var live []uint64
			for _, r := range step {
				emit(trace.Event{Op: trace.OpMalloc, Addr: next, Size: r.size, Stream: r.stream})
				live = append(live, next)
				next++
				// A free inside the step, of this step's or of a kept
				// block.
				if rapid.IntRange(0, 3).Draw(t, "early") == 0 {
					if i := rapid.IntRange(0, len(live)+len(kept)-1).Draw(t, "earlyVictim"); i < len(live) {
						emit(trace.Event{Op: trace.OpFree, Addr: live[i]})
						live = append(live[:i], live[i+1:]...)
					} else {
						i -= len(live)
						emit(trace.Event{Op: trace.OpFree, Addr: kept[i]})
						kept = append(kept[:i], kept[i+1:]...)
					}
				}
			}
			for len(live) > 0 {
				i := rapid.IntRange(0, len(live)-1).Draw(t, "victim")
				if rapid.IntRange(0, 5).Draw(t, "keep") == 0 {
					kept = append(kept, live[i])
				} else {
					emit(trace.Event{Op: trace.OpFree, Addr: live[i]})
				}
				live = append(live[:i], live[i+1:]...)
			}
			if rapid.IntRange(0, 4).Draw(t, "emptyCache") == 0 {
				emit(trace.Event{Op: trace.OpEmptyCache})
			}
		}
		s := policies.Settings{
			"fragLimit":   strconv.Itoa(rapid.IntRange(0, 24).Draw(t, "fragLimitMiB")) + "MiB",
			"reuseLimit":  []string{"1", "2", "10"}[rapid.IntRange(0, 2).Draw(t, "reuseLimit")],
			"defragLevel": strconv.Itoa(rapid.IntRange(0, 2).Draw(t, "defragLevel")),
			"autoGC":      []string{"0", "1000"}[rapid.IntRange(0, 1).Draw(t, "autoGC")],
		}
		cfg := sim.Config{Trace: "random", Policy: "gmlake", Settings: s, Check: true}
		if rapid.Bool().Draw(t, "capped") {
			cfg.Capacity = uint64(rapid.IntRange(24, 160).Draw(t, "capacityMiB")) << 20
			cfg.Card = rapid.Bool().Draw(t, "card")
		}
		rs, err := sim.Run(trace.NewSliceSource(trace.Header{Source: "text"}, evs), cfg)
		if err != nil {
			var ce *sim.CheckError
			if errors.As(err, &ce) {
				t.Fatalf("%+v: %v\ntrace:\n%s", cfg, err, policytest.TraceText(evs, ce.Event))
			}
			t.Fatalf("%+v: %v\ntrace:\n%s", cfg, err, policytest.TraceText(evs, -1))
		}
		if r := rs[0]; r.OOMs == 0 && r.PeakReserved < r.PeakRequested {
			t.Fatalf("peak reserved %d < peak requested %d with no OOM\ntrace:\n%s", r.PeakReserved, r.PeakRequested, policytest.TraceText(evs, -1))
		}
	})
}

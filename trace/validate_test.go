package trace

import (
	"strings"
	"testing"
)

func TestValidate(t *testing.T) {
	const text = `
malloc id=1 size=100 t=10
malloc id=2 size=0 t=11
malloc id=1 size=100 t=12
free id=1 t=13
free id=1 t=14
free id=9 t=15
free_requested id=8 t=16
malloc id=3 size=5 t=9
malloc id=1 size=7 t=20
free id=1 t=21
`
	_, evs, err := ParseText("v.txt", strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	got, err := Validate(NewSliceSource(Header{}, evs), 0)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"event 1: malloc of 0 bytes at 0x2",
		"event 2: malloc at 0x1, which is live since the malloc at event 0",
		"event 4: double free of 0x1: freed at event 3",
		"event 5: free of unknown address 0x9",
		"event 6: free_requested of unknown address 0x8",
		"event 7: time goes backwards: 9 ns after 16 ns at event 6",
	}
	if len(got) != len(want) {
		t.Fatalf("got %d problems, want %d: %v", len(got), len(want), got)
	}
	for i := range want {
		if got[i].Error() != want[i] {
			t.Errorf("problem %d = %q, want %q", i, got[i], want[i])
		}
	}
	if lim, _ := Validate(NewSliceSource(Header{}, evs), 2); len(lim) != 2 {
		t.Errorf("limit 2 gave %d problems", len(lim))
	}
}

// TestValidateBounded frees many distinct addresses: the validator keeps
// only the recent ones, and still names a recent double free.
func TestValidateBounded(t *testing.T) {
	v := NewValidator()
	i := int64(0)
	for a := uint64(1); a <= 3*RecentFrees; a++ {
		v.Check(i, Event{Op: OpMalloc, Addr: a, Size: 1})
		v.Check(i+1, Event{Op: OpFree, Addr: a})
		i += 2
	}
	if len(v.frees.ring) != RecentFrees || v.live.Len() != 0 {
		t.Errorf("remembers %d frees, %d live, want %d and 0", len(v.frees.ring), v.live.Len(), RecentFrees)
	}
	last := uint64(3 * RecentFrees)
	if err := v.Check(i, Event{Op: OpFree, Addr: last}); err == nil || !strings.Contains(err.Error(), "double free") {
		t.Errorf("double free of a recent address: %v", err)
	}
	if err := v.Check(i+1, Event{Op: OpFree, Addr: 1}); err == nil || !strings.Contains(err.Error(), "unknown address") {
		t.Errorf("free of a long-forgotten address: %v", err)
	}
	if err := v.Check(i+2, Event{Op: OpMalloc, Addr: 5, Size: 1 << 60}); err == nil || !strings.Contains(err.Error(), "more than any device holds") {
		t.Errorf("malloc of 2^60 bytes: %v", err)
	}
}

// A negative absolute time is a problem (replay check let it pass).
func TestValidateNegativeTime(t *testing.T) {
	checkProblems(t, "malloc id=1 size=100 t=-5\nfree id=1 t=3\n", "event 0: negative time: -5 ns")
}

// checkProblems validates the text-form trace text and checks its
// problems, in order.
func checkProblems(t *testing.T, text string, want ...string) {
	t.Helper()
	_, evs, err := ParseText("v.txt", strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	got, err := Validate(NewSliceSource(Header{}, evs), 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("problems %v, want %v", got, want)
	}
	for i := range want {
		if got[i].Error() != want[i] {
			t.Errorf("problem %d = %q, want %q", i, got[i], want[i])
		}
	}
}

// A wait on or a synchronize of an event never recorded is a problem: it
// orders nothing (replay check let both pass).
func TestValidateEvents(t *testing.T) {
	checkProblems(t, `event_record event=7 stream=1
stream_wait_event event=7 stream=2
stream_wait_event event=8 stream=2
event_sync event=9
event_sync event=7
`,
		"event 2: stream_wait_event of event 0x8, never recorded: it orders nothing",
		"event 3: event_sync of event 0x9, never recorded: it orders nothing",
	)
}

// TestValidateCrossStreamFree: a free on one stream of a block allocated
// on another is a problem unless an event wait or a synchronize orders the
// freeing stream after the malloc; the legacy default stream (0) is
// ordered with every stream. JAX's allocations on the H200 re-record
// events on other streams 67 times, which CUDA allows: not a problem.
func TestValidateCrossStreamFree(t *testing.T) {
	checkProblems(t, `malloc id=1 size=1KiB stream=1
free id=1 stream=2
malloc id=2 size=1KiB stream=1
event_record event=5 stream=1
stream_wait_event event=5 stream=2
free id=2 stream=2
event_record event=6 stream=1
malloc id=3 size=1KiB stream=1
stream_wait_event event=6 stream=2
free id=3 stream=2
malloc id=4 size=1KiB stream=1
stream_sync stream=1
free id=4 stream=2
malloc id=5 size=1KiB stream=1
free id=5 stream=0
malloc id=6 size=1KiB stream=0
free id=6 stream=2
malloc id=7 size=1KiB stream=1
event_record event=8 stream=1
event_sync event=8
free id=7 stream=3
malloc id=8 size=1KiB stream=1
device_sync
free id=8 stream=2
event_record event=5 stream=3
`,
		"event 1: free on stream 0x2 of 0x1, allocated on stream 0x1 at event 0, which no event wait or synchronize orders it after: stream 0x1 may still use it",
		"event 9: free on stream 0x2 of 0x3, allocated on stream 0x1 at event 7, which no event wait or synchronize orders it after: stream 0x1 may still use it",
	)
}

// A pool belongs to a malloc, a failed malloc or a pool_release, and the
// default pools (0) are never released.
func TestValidatePools(t *testing.T) {
	checkProblems(t, `malloc id=1 size=1KiB pool=2
malloc_failed size=1GiB pool=2
free id=1 pool=2
pool_release pool=2
pool_release
malloc id=2 size=1KiB restore=1
`,
		"event 2: free with pool 2: only a malloc, a failed malloc, a pool_release or an empty_cache names a pool",
		"event 4: pool_release of pool 0, the default pools, which are never released",
		"event 5: malloc of pool 0 marked restore: only a malloc into a private pool restores a block",
	)
}

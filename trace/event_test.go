package trace

import (
	"fmt"
	"slices"
	"testing"
)

// TestJobEnded: a record run trace ends with its job unless a signal ended
// the program or the process still ran; other sources only when they say
// so.
func TestJobEnded(t *testing.T) {
	for _, tc := range []struct {
		h    Header
		want bool
	}{
		{Header{Source: "record", Metadata: map[string]string{"exit_status": "0"}}, true},
		{Header{Source: "record", Metadata: map[string]string{"exit_status": "3"}}, true},
		{Header{Source: "record", Metadata: map[string]string{"exit_status": "137", "signal": "killed"}}, false},
		{Header{Source: "record", Metadata: map[string]string{"running": "true"}}, false},
		{Header{Source: "record"}, true},
		{Header{Source: "pytorch"}, false},
		{Header{Source: "pytorch", Metadata: map[string]string{"job_ended": "true"}}, true},
	} {
		if got := tc.h.JobEnded(); got != tc.want {
			t.Errorf("%+v: JobEnded %v, want %v", tc.h, got, tc.want)
		}
	}
}

// PoolNames reads the "pools" metadata and leaves malformed pairs out.
func TestPoolNames(t *testing.T) {
	h := Header{Metadata: map[string]string{"pools": "1=(1,0) 2=deleted@142 x=y 0=(0,0) 3= 4294967296=z 5"}}
	got := PoolNames(h)
	if len(got) != 2 || got[1] != "(1,0)" || got[2] != "deleted@142" {
		t.Errorf("PoolNames = %v", got)
	}
}

// FormatPoolNames writes what PoolNames reads; PoolLabel falls back to the
// pool's number.
func TestFormatPoolNames(t *testing.T) {
	md := FormatPoolNames([]string{"(1,0)", "unnamed2-released-at-entry-7"})
	if md != "1=(1,0) 2=unnamed2-released-at-entry-7" {
		t.Errorf("FormatPoolNames = %q", md)
	}
	names := PoolNames(Header{Metadata: map[string]string{"pools": md}})
	if PoolLabel(names, 2) != "unnamed2-released-at-entry-7" || PoolLabel(names, 3) != "pool 3" {
		t.Errorf("PoolLabel: %v", names)
	}
}

// TestAppendEvent checks that AppendEvent keeps every event in order and
// doubles a full list's capacity (256 at first).
func TestAppendEvent(t *testing.T) {
	var evs []Event
	var caps []int
	for i := range 1000 {
		evs = AppendEvent(evs, Event{Op: OpMalloc, Addr: uint64(i) << 9, Size: uint64(i + 1), Label: fmt.Sprint(i)})
		if len(caps) == 0 || caps[len(caps)-1] != cap(evs) {
			caps = append(caps, cap(evs))
		}
	}
	if want := []int{256, 512, 1024}; !slices.Equal(caps, want) {
		t.Errorf("capacities %v, want %v", caps, want)
	}
	for i, ev := range evs {
		if ev.Addr != uint64(i)<<9 || ev.Size != uint64(i+1) || ev.Label != fmt.Sprint(i) {
			t.Fatalf("event %d: %+v", i, ev)
		}
	}
}

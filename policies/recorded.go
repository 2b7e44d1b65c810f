package policies

import (
	"github.com/gpualloc/allocsim/sim/results"
	"github.com/gpualloc/allocsim/trace"
)

// This file holds what replaying a recording as recorded takes of a
// policy: the settings its allocator was recorded with, and the source
// allocator's own actions shown to the policy as the replay goes.

// Follower is implemented by policies that can follow a recording of their
// own allocator, so that the replay takes the same path as the recorded
// run (the pytorch policy on a PyTorch snapshot).
type Follower interface {
	// Follow is shown, in trace order, each event that records the source
	// allocator's own device calls (trace.OpSegmentAlloc, OpSegmentFree,
	// OpSegmentMap, OpSegmentUnmap), before the events after it are
	// replayed. The policy acts on none of them at once: they tell it what
	// the next malloc or free did in the source (a release of cached
	// memory that the policy does not make itself was an explicit
	// empty_cache, for instance).
	Follow(ev trace.Event)
	// FreeLate is Free for a block whose free completed later than the
	// program asked (free_completed after other events than its
	// free_requested: the block was used on another stream). Its memory
	// becomes reusable where the source allocator took it back, at the
	// start of the next malloc or at a synchronization.
	FreeLate(addr, stream uint64) error
	// Flush completes, at the end of the trace, what the events followed
	// so far imply.
	Flush() error
}

// RecordedFunc turns what a trace's header says of the allocator it was
// recorded under (trace.Header.Source and Settings) into the policy's
// settings, with user's settings over them. It reports false when the
// trace was not recorded under the policy's allocator; it returns an error
// for recorded settings it cannot read.
type RecordedFunc func(source string, recorded map[string]string, user Settings) (Settings, bool, error)

// recordedFuncs are the policies that replay recordings of their own
// allocator as recorded, by name.
var recordedFuncs = map[string]RecordedFunc{}

// registerRecorded adds the RecordedFunc of the policy called name; called
// from the policy files' init functions.
func registerRecorded(name string, f RecordedFunc) { recordedFuncs[name] = f }

// Recorded returns the settings that replay a trace with header h as it
// was recorded under the policy called name, user's settings (from --set)
// over the recorded ones. It reports false, and returns user as is, when
// the trace was not recorded under that policy's allocator.
func Recorded(name string, h trace.Header, user Settings) (Settings, bool, error) {
	f, ok := recordedFuncs[name]
	if !ok {
		return user, false, nil
	}
	s, ok, err := f(h.Source, h.Settings, user)
	if err != nil || !ok {
		return user, false, err
	}
	return s, true, nil
}

// TieFollower is implemented by policies whose choice among equally good
// free blocks depends on what no recording shows (CuPy's pool takes, of
// the free chunks of the best size, the one whose Python object has the
// lowest address). Replaying a recording as recorded, the replay gives
// such a policy the recorded address of each malloc right before its
// Malloc: the policy takes the block there when it is one of its equally
// good choices, and makes its own choice otherwise. The hint never changes
// what a malloc gets (its size, a split, a device call), only which of
// equal blocks; except where a Follower, following its own allocator's
// recording, takes the recorded block because the recording shows what
// its rule cannot know (a checkpoint restore's segments, a CuPy stream's
// arena), which it notes (Inferrer).
type TieFollower interface {
	// FollowTie gives the recorded address of the next Malloc; it holds
	// for that Malloc only.
	FollowTie(addr uint64)
}

// SourcePolicy returns the policy that simulates the allocator a trace
// from source (trace.Header.Source) was recorded under: cupy for a CuPy
// log, bfc for an XSpace (XLA's BFC), pytorch for the rest (PyTorch
// snapshots, torch.profiler traces, and record run traces of PyTorch
// jobs). It reports false for a source that records no allocator of its
// own (synthetic workloads, MiniMalloc problems, RMM logs, the text
// form), for which it still returns pytorch, the default to compare with.
func SourcePolicy(source string) (string, bool) { return results.RecordedPolicy(source) }

package sim

import (
	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/trace"
)

// ActionKind is what the allocator did, as an Observer is told: the
// actions of a PyTorch memory snapshot's trace. The zero value is invalid.
type ActionKind uint8

const (
	ActionInvalid ActionKind = iota
	// ActionAlloc: the policy placed a malloc in the block at Addr of Size
	// bytes, for Requested bytes.
	ActionAlloc
	// ActionFreeRequested: the program freed the block; its bytes leave
	// the live figures, but it goes back to the policy only at
	// ActionFreeCompleted (at once when the trace does not tell the two
	// apart).
	ActionFreeRequested
	// ActionFreeCompleted: the block goes back to the policy.
	ActionFreeCompleted
	// ActionSegmentAlloc and ActionSegmentFree: the policy allocated or
	// freed the device segment at Addr of Size bytes.
	ActionSegmentAlloc
	ActionSegmentFree
	// ActionOOM: a malloc of Requested bytes failed; Free is the device's
	// free bytes at that moment (capacity less reserved).
	ActionOOM
	// ActionSegmentMap and ActionSegmentUnmap: the policy backed with
	// memory, or gave back, [Addr, Addr+Size) of a reserved address range
	// (expandable segments, policies.Mapper).
	ActionSegmentMap
	ActionSegmentUnmap
	numActions
)

var actionNames = [numActions]string{
	"invalid", "alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "oom",
	"segment_map", "segment_unmap",
}

// String returns the action's name in a PyTorch snapshot ("alloc",
// "free_requested", ..., "oom").
func (k ActionKind) String() string {
	if k >= numActions {
		return "invalid"
	}
	return actionNames[k]
}

// Action is one thing the allocator did while the replay was at trace
// event Event (its index from 0), of time Time in nanoseconds, issued on
// Stream. Addresses are the simulated device's; sizes are in bytes.
type Action struct {
	Kind      ActionKind
	Event     int64
	Time      int64
	Stream    uint64
	Addr      uint64
	Size      uint64
	Requested uint64
	Free      uint64
	// Pool is the private pool of the malloc the action belongs to
	// (trace.Event.Pool), 0 for the default pools.
	Pool uint32
	// Stack and Label are those of the event being replayed
	// (trace.Event.Stack, an id in the trace's Stacks, and Label): for
	// the actions of a malloc, its call stack and call site.
	Stack uint32
	Label string
}

// SourceObserver is an Observer told of the trace before the replay
// starts (by Prepare): its header and its stack table (trace.StacksOf the
// source, nil if none), which Action.Stack names and which fills as the
// events are read.
type SourceObserver interface {
	Observer
	ObserveSource(h trace.Header, st *trace.Stacks)
}

// Observer is told, in order, of every action of the allocator during a
// replay (Config.Observer): block allocations and frees of device memory
// with their addresses, device segment allocations and frees, maps and
// unmaps of reserved ranges, and OOMs.
// A malloc's segment actions come before its ActionAlloc; a free's
// ActionFreeCompleted before the segment frees it causes. Host-side
// (pinned, managed) allocations and events that could not be replayed
// (anomalies) are not told. Observe must not call back into the replay.
type Observer interface {
	Observe(a Action)
}

// observing tells an Observer of a replay's actions; nil when there is no
// Observer, and then every method does nothing.
type observing struct {
	o   Observer
	dev *Device
	cur Action // the event being replayed
}

func newObserving(o Observer, dev *Device) *observing {
	if o == nil {
		return nil
	}
	return &observing{o: o, dev: dev}
}

// at starts event i.
func (s *observing) at(i int64, ev *trace.Event) {
	if s == nil {
		return
	}
	s.cur = Action{Event: i, Time: ev.Time, Stream: ev.Stream, Pool: ev.Pool, Stack: ev.Stack, Label: ev.Label}
}

// tell tells the Observer of an action of the current event. It is small
// enough to be inlined, so that a replay without an Observer pays a nil
// check, not a call, at each malloc and free.
func (s *observing) tell(kind ActionKind, b policies.Block, requested uint64) {
	if s != nil {
		s.told(kind, b, requested)
	}
}

// told is tell with an Observer.
func (s *observing) told(kind ActionKind, b policies.Block, requested uint64) {
	a := s.cur
	a.Kind, a.Addr, a.Size, a.Requested = kind, b.Addr, b.Size, requested
	if kind == ActionOOM {
		if c := s.dev.Capacity(); c > s.dev.Reserved() {
			a.Free = c - s.dev.Reserved()
		}
	}
	s.o.Observe(a)
}

// wrap returns the device for the policy: next (the device, or a wrapper of
// it), with its segment allocations and frees told.
func (s *observing) wrap(next policies.Device) policies.Device {
	if s == nil {
		return next
	}
	return &observedDevice{Device: s.dev, next: next, s: s}
}

// observedDevice is the device a policy sees under an Observer: the calls
// go through next, and every method of *Device is there, so that the
// policy's type assertions find the same abilities (policies.Capacitor,
// policies.Mapper).
type observedDevice struct {
	*Device
	next policies.Device
	s    *observing
}

func (d *observedDevice) Alloc(size uint64) (uint64, error) {
	addr, err := d.next.Alloc(size)
	if err == nil {
		d.s.tell(ActionSegmentAlloc, policies.Block{Addr: addr, Size: size}, 0)
	}
	return addr, err
}

func (d *observedDevice) Free(addr uint64) error {
	size, _ := d.Device.Segment(addr)
	if err := d.next.Free(addr); err != nil {
		return err
	}
	d.s.tell(ActionSegmentFree, policies.Block{Addr: addr, Size: size}, 0)
	return nil
}

// mapper returns the Mapper the calls go through: next when it is one.
func (d *observedDevice) mapper() policies.Mapper {
	if m, ok := d.next.(policies.Mapper); ok {
		return m
	}
	return d.Device
}

func (d *observedDevice) Reserve(size uint64) (uint64, error) { return d.mapper().Reserve(size) }

func (d *observedDevice) Release(addr uint64) error { return d.mapper().Release(addr) }

func (d *observedDevice) Map(addr, size uint64) error {
	if err := d.mapper().Map(addr, size); err != nil {
		return err
	}
	d.s.tell(ActionSegmentMap, policies.Block{Addr: addr, Size: size}, 0)
	return nil
}

func (d *observedDevice) Unmap(addr, size uint64) error {
	if err := d.mapper().Unmap(addr, size); err != nil {
		return err
	}
	d.s.tell(ActionSegmentUnmap, policies.Block{Addr: addr, Size: size}, 0)
	return nil
}

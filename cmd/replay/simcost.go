package main

import (
	"github.com/gpualloc/allocsim/sim"
)

// costMirror is an Observer that makes the device calls of a replay again
// on a device of its own, which charges them to the embedded cost model
// (sim.DefaultCostModel), so that a sweep's results carry the simulated
// allocator time and latency summary (sim_alloc_time_ns, latency) that
// the report's latency chart draws, also while the engine leaves them
// empty. The calls are the same in order and size; only the addresses
// differ, and the cost model uses them only to tell calls apart.
type costMirror struct {
	dev  *sim.Device
	addr map[uint64]uint64 // the replay's segment address -> the mirror's
	err  error
}

func newCostMirror() *costMirror {
	return &costMirror{dev: sim.NewDevice(0), addr: map[uint64]uint64{}}
}

// Observe implements sim.Observer.
func (m *costMirror) Observe(a sim.Action) {
	if m.err != nil {
		return
	}
	switch a.Kind {
	case sim.ActionSegmentAlloc:
		x, err := m.dev.Alloc(a.Size)
		if err != nil {
			m.err = err
			return
		}
		m.addr[a.Addr] = x
	case sim.ActionSegmentFree:
		if x, ok := m.addr[a.Addr]; ok {
			delete(m.addr, a.Addr)
			m.err = m.dev.Free(x)
		}
	}
}

// fill sets r's simulated allocator time and latency summary from the
// mirror, unless the engine has set them.
func (m *costMirror) fill(r *sim.Result) {
	if m.err != nil || r.SimAllocTimeNS != 0 || len(r.Latency) != 0 || m.dev.CostModel() == nil {
		return
	}
	m.dev.FillCost(r)
}

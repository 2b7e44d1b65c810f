package policies

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/gpualloc/allocsim/trace"
)

// STAllocName is the registry name of the STAlloc policy.
const STAllocName = "stalloc"

// STAlloc follows STAlloc (Huang et al., "STAlloc: Enhancing Memory
// Efficiency in Large-Scale Model Training with Spatio-Temporal Planning",
// arXiv 2507.16274; github.com/infinigence/STAlloc): a training job is run
// once to profile its first iterations, a plan gives the tensors that
// recur alike every iteration fixed offsets in one region of device memory
// reserved once, and a later run serves each planned malloc at its offset
// and everything else from an online allocator beside the region (its copy
// of PyTorch's caching allocator).
//
// Iterations. STAlloc's hook in the training loop tells it where each
// iteration starts. Here they start at the trace's markers whose label
// begins with the marker setting ("iteration", as trace/synth writes them)
// or, in a trace without such markers, where the trace repeats: the call
// stack (or, where the trace records none, the size) whose mallocs recur at
// regular gaps over most of the trace, and among those the one whose
// mallocs find the fewest live bytes (see stPeriod), starts each
// iteration. That search reads the whole trace, a stand-in for the hook
// only: the plan itself is made from the profiled iterations alone, and a
// warning names the events where the iterations were found to start. No
// iteration found: there is no profile, every malloc goes to the online
// manager, and a warning says so.
//
// Profile and classes. The profile is the mallocs before the first
// iteration and those of the first profile iterations (iterations 0 to
// profile-1, 3 by default: STAlloc traces three training iterations). The
// mallocs before iteration 1 (the setup and iteration 0, which makes the
// optimizer's state) are planned as profiled: persistent where still live
// at the end of the profile (weights, gradients, optimizer states: they
// keep their offset to the end), else with their profiled lifetime.
// Iteration 1 is the pattern of every later iteration: its malloc at
// position k (its k-th malloc) is static when every profiled iteration
// from 1 on makes, at position k, a malloc of the same size freed at the
// same position of the same iteration or of the next (a cross-iteration
// tensor, freed before its successor's malloc: as its offset is still
// held while the next iteration makes its first mallocs, it is planned
// clear of those too); else it is dynamic (a shape or a lifetime that
// varies, or a tensor that outlives its successor's malloc) and goes to
// the online manager in every iteration. Mallocs of
// at most small bytes go to the online manager too (STAlloc serves them
// from a pool of 512-byte slots of its own).
//
// Plan. The planned mallocs are placed by Offline's greedy orders (and its
// search, with a budget of nodes) over their profiled lifetimes in trace
// events, sizes rounded up to alignment bytes; the region is the plan's
// height, one device allocation made at the first planned malloc and never
// given back.
//
// Replay. The k-th malloc of iteration j >= 2 is served at the offset of
// the pattern's position k when that position is static and the malloc
// has its size and the offset is free; otherwise it deviates from the
// profile: a malloc past the pattern's last position, of another size, or
// whose offset a block still holds (a lifetime longer than profiled) goes
// to the online manager, is counted (Stats) and warned of, the first with
// its event. STAlloc matches its plan the same way, by the count of
// mallocs and the size (its StaticAllocator), and falls back to its
// caching allocator on a mismatch. When the device refuses the region
// (under a capacity), its mallocs go to the online manager, and a warning
// says so.
//
// Event numbers in warnings and Stats count the events given to Plan: the
// trace's own unless it has mallocs that go around the policy (a CUDA
// library's, trace.IsDirect), which the replay leaves out of the plan.
//
// Not modelled: STAlloc's layer hooks, which keep dynamic (MoE) layers out
// of its count of mallocs: here the count is of all of an iteration's
// mallocs, so one malloc more or less shifts the rest of the iteration,
// and each shifted planned malloc that no longer matches falls back; its
// own planner (grouping, splitting and fusing, reuse of the region's gaps
// by dynamic tensors, an assumed utilization of the online allocator) and
// its slot pool of small requests; streams (a block is reusable in the
// region once its free is replayed, whatever its stream); the online
// manager's settings, which are PyTorch's defaults.
//
// Settings (defaults in brackets):
//   - marker [iteration]: the label prefix of the markers that start an
//     iteration; empty: markers are not looked at.
//   - profile [3]: the iterations profiled, at least 2.
//   - alignment [512]: requests are rounded up to a multiple of it in the
//     region (bytes, a power of two up to 2 MiB; STAlloc's is 512 B).
//   - small [512]: requests of at most this many bytes go to the online
//     manager (bytes; STAlloc's is 512 B).
//   - nodes [0]: the plan's search budget in nodes (0: the greedy orders
//     only).
type STAlloc struct {
	dev       Device
	online    *PyTorch
	marker    string
	profile   int
	alignment uint64
	small     uint64
	nodes     int64

	plan    stPlan
	planned bool
	next    int // index of the next malloc call

	region     uint64 // region address, valid when hasRegion
	hasRegion  bool
	refused    bool              // the device refused the region
	refusedMsg string            // where and why
	live       []uint64          // offsets of live blocks in the region, sorted
	liveSize   map[uint64]uint64 // offset -> block size
	liveBytes  uint64

	stats STAllocStats
}

// STAllocStats describes an STAlloc plan and its replay so far.
type STAllocStats struct {
	// Found says how the iterations were found: "markers", "periodicity"
	// or "" (none found). Anchor names the mallocs that start them when
	// found by periodicity.
	Found, Anchor string
	// Starts are the event indices where the iterations start; Profiled
	// is the count of them profiled.
	Starts   []int
	Profiled int
	// The mallocs before iteration 1 by class: Persistent (live at the end
	// of the profile), Once (freed within it), Small (to the online
	// manager); and iteration 1's positions: Static (freed in their
	// iteration), Cross (freed in the next), Dynamic (to the online
	// manager), SmallPositions.
	Persistent, Once, Small            int
	Static, Cross, Dynamic, SmallSlots int
	// Height is the region's size in bytes.
	Height uint64
	// Planned counts the mallocs served in the region, Online those served
	// by the online manager (whatever the reason).
	Planned, Online int64
	// Deviations counts the mallocs of iterations 2 on that the plan did
	// not fit: Beyond (past the pattern's last position), Mismatched (of
	// another size than the static position's), Taken (its offset held by
	// a live block); First describes the first.
	Deviations, Beyond, Mismatched, Taken int64
	First                                 string
	// RegionRefused counts the planned mallocs served online because the
	// device refused the region.
	RegionRefused int64
}

var (
	_ Policy     = (*STAlloc)(nil)
	_ Planner    = (*STAlloc)(nil)
	_ Releaser   = (*STAlloc)(nil)
	_ FreeSpacer = (*STAlloc)(nil)
	_ Counter    = (*STAlloc)(nil)
	_ Warner     = (*STAlloc)(nil)
)

func init() {
	register(Info{
		Name:   STAllocName,
		Design: "STAlloc (Huang et al., arXiv 2507.16274; infinigence/STAlloc): profiles the first iterations of a training trace, plans the persistent and per-iteration static tensors into one region reserved once, serves later iterations' mallocs at their planned offsets and the rest (dynamic shapes, deviations) with PyTorch's caching allocator",
		Settings: []Setting{
			{Key: "marker", Default: "iteration", Doc: "the label prefix of the markers that start an iteration; empty: iterations are found by the trace's periodicity only"},
			{Key: "profile", Default: "3", Doc: "the iterations profiled, at least 2: the mallocs before iteration 1 are planned as profiled, iteration 1's are the pattern of every later one, and the others check it"},
			{Key: "alignment", Default: "512", Doc: "requests are rounded up to a multiple of it in the region, in bytes: a power of two up to 2 MiB"},
			{Key: "small", Default: "512", Doc: "requests of at most this many bytes go to the online manager, not the plan"},
			{Key: "nodes", Default: "0", Doc: "the plan's search budget in nodes (0: the greedy orders only), at most 2^40"},
		},
	}, func(dev Device, s Settings) (Policy, error) { return NewSTAlloc(dev, s) })
}

// NewSTAlloc returns the STAlloc policy on dev with settings s (see
// STAlloc). It returns an error naming the key for an unknown or malformed
// setting.
func NewSTAlloc(dev Device, s Settings) (*STAlloc, error) {
	const name = STAllocName
	if err := s.Check(name, "alignment", "marker", "nodes", "profile", "small"); err != nil {
		return nil, err
	}
	align, err := s.Bytes(name, "alignment", 512)
	if err != nil {
		return nil, err
	}
	if !isPowerOfTwo(align) || align > deviceGranularity {
		return nil, invalidSettingf(name, s, "alignment", "must be a power of two from 1 B to 2 MiB")
	}
	profile, err := s.Uint(name, "profile", 3)
	if err != nil {
		return nil, err
	}
	if profile < 2 || profile > 1<<20 {
		return nil, invalidSettingf(name, s, "profile", "must be from 2 to 2^20 iterations")
	}
	small, err := s.Bytes(name, "small", 512)
	if err != nil {
		return nil, err
	}
	nodes, err := s.Uint(name, "nodes", 0)
	if err != nil {
		return nil, err
	}
	if nodes > 1<<40 {
		return nil, invalidSettingf(name, s, "nodes", "must be at most 2^40")
	}
	marker, ok := s["marker"]
	if !ok {
		marker = "iteration"
	}
	online, err := NewPyTorch(dev, nil)
	if err != nil {
		return nil, err
	}
	return &STAlloc{dev: dev, online: online, marker: marker, profile: int(profile), alignment: align, small: small, nodes: int64(nodes)}, nil
}

// Name returns "stalloc".
func (p *STAlloc) Name() string { return STAllocName }

// Plan profiles evs and makes the plan (see STAlloc). It follows the
// replay's rules for which events reach a policy, as Offline.Plan does.
func (p *STAlloc) Plan(evs []trace.Event) error {
	key := stPlanKey{sum: eventsSum(evs), n: len(evs), marker: p.marker, profile: p.profile, alignment: p.alignment, small: p.small, nodes: p.nodes}
	stPlanMemo.Lock()
	if stPlanMemo.plan != nil && stPlanMemo.key == key {
		p.plan = *stPlanMemo.plan
	} else {
		p.plan.make(p, evs)
		pl := p.plan
		stPlanMemo.key, stPlanMemo.plan = key, &pl
	}
	stPlanMemo.Unlock()
	p.planned, p.next = true, 0
	st := &p.stats
	*st = STAllocStats{Found: p.plan.found, Anchor: p.plan.anchor, Starts: slices.Clone(p.plan.starts), Profiled: p.plan.profile, Height: p.plan.height}
	for _, c := range p.plan.calls {
		if c.iter > 0 || len(p.plan.starts) == 0 {
			continue
		}
		switch c.class {
		case stPersistent:
			st.Persistent++
		case stOnce:
			st.Once++
		case stSmall:
			st.Small++
		}
	}
	for _, s := range p.plan.pattern {
		switch s.class {
		case stStatic:
			st.Static++
		case stCross:
			st.Cross++
		case stDynamic:
			st.Dynamic++
		case stSmall:
			st.SmallSlots++
		}
	}
	return nil
}

// stPlanMemo is the last plan made, for the next STAlloc that plans the
// same events with the same settings: replay fit replays a trace at a
// dozen capacities or more, each replay a policy of its own, and making
// the plan each time took most of fit's time (hf_llama_train: 2.5 of 4.4
// s). A plan is only read once made (the replay's state is the
// policy's), so the policies share it.
var stPlanMemo struct {
	sync.Mutex
	key  stPlanKey
	plan *stPlan
}

// stPlanKey says what a plan is made from: the events (a 64-bit hash of
// all their fields, and their number) and the settings.
type stPlanKey struct {
	sum, alignment, small uint64
	n, profile            int
	nodes                 int64
	marker                string
}

// eventsSum is a 64-bit FNV-1a hash of every field of evs.
func eventsSum(evs []trace.Event) uint64 {
	h := uint64(14695981039346656037)
	mix := func(v uint64) {
		for range 8 {
			h ^= v & 0xff
			h *= 1099511628211
			v >>= 8
		}
	}
	for i := range evs {
		ev := &evs[i]
		restore := uint64(0)
		if ev.Restore {
			restore = 1
		}
		mix(uint64(ev.Op) | uint64(ev.Kind)<<8 | restore<<16 | uint64(ev.Pool)<<32)
		mix(uint64(ev.Time))
		mix(ev.Addr)
		mix(ev.Size)
		mix(ev.Stream)
		mix(ev.Thread)
		mix(uint64(ev.Stack) | uint64(len(ev.Label))<<32)
		for j := 0; j < len(ev.Label); j++ {
			h ^= uint64(ev.Label[j])
			h *= 1099511628211
		}
	}
	return h
}

// Stats returns what the plan made of the trace and how the replay has
// followed it so far.
func (p *STAlloc) Stats() STAllocStats {
	st := p.stats
	st.Starts = slices.Clone(st.Starts)
	return st
}

// Malloc serves the next malloc of the trace given to Plan, of size bytes
// on stream: at its planned offset in the region, or by the online
// manager (see STAlloc). It returns an error wrapping ErrOutOfMemory when
// the online manager cannot serve it, and another error when there is no
// plan or the malloc is not the plan's next.
func (p *STAlloc) Malloc(size, stream uint64) (Block, error) {
	if !p.planned {
		return Block{}, fmt.Errorf("policy %s: malloc of %d bytes: no plan: the policy must see the trace first (Plan)", STAllocName, size)
	}
	k := p.next
	calls := p.plan.calls
	if k >= len(calls) || calls[k].size != size {
		want := "none"
		if k < len(calls) {
			want = fmt.Sprintf("%d bytes", calls[k].size)
		}
		return Block{}, fmt.Errorf("policy %s: malloc #%d of %d bytes on stream %#x does not follow the plan (expected %s): replay the trace given to Plan", STAllocName, k, size, stream, want)
	}
	p.next++
	c := calls[k]
	off := noOffset
	switch {
	case len(p.plan.starts) == 0:
		// No profile.
	case c.iter <= 0:
		off = c.offset
	case c.pos < len(p.plan.pattern):
		s := p.plan.pattern[c.pos]
		if s.class != stStatic && s.class != stCross || s.offset == noOffset {
			break
		}
		if s.size != size {
			p.deviate(&p.stats.Mismatched, c, fmt.Sprintf("position %d was planned for %d bytes", c.pos, s.size))
			break
		}
		off = s.offset
	default:
		p.deviate(&p.stats.Beyond, c, fmt.Sprintf("past the %d positions of the profiled iteration 1", len(p.plan.pattern)))
	}
	if off != noOffset {
		b, ok, err := p.place(c, off)
		if err != nil || ok {
			return b, err
		}
	}
	p.stats.Online++
	return p.online.Malloc(size, stream)
}

// place serves call c at offset off of the region, allocating the region
// first if need be. It returns false when the call must go online: the
// region was refused, or the offset is held (a deviation).
func (p *STAlloc) place(c stCall, off uint64) (Block, bool, error) {
	if !p.hasRegion {
		if p.refused {
			p.stats.RegionRefused++
			return Block{}, false, nil
		}
		addr, err := p.dev.Alloc(p.plan.height)
		if err != nil {
			if !errors.Is(err, ErrOutOfMemory) {
				return Block{}, false, fmt.Errorf("policy %s: malloc of %d bytes: region of %d bytes: %w", STAllocName, c.size, p.plan.height, err)
			}
			p.refused = true
			p.refusedMsg = fmt.Sprintf("event %d (malloc #%d of %d bytes): %v", c.event, p.next-1, c.size, err)
			p.stats.RegionRefused++
			return Block{}, false, nil
		}
		p.region, p.hasRegion = addr, true
		p.liveSize = map[uint64]uint64{}
	}
	n := ceilToMultiple(c.size, p.alignment)
	i, found := slices.BinarySearch(p.live, off)
	if found || i > 0 && p.live[i-1]+p.liveSize[p.live[i-1]] > off || i < len(p.live) && off+n > p.live[i] {
		if c.iter <= 1 {
			// The profile's own mallocs never collide: a bug of the plan.
			return Block{}, false, fmt.Errorf("policy %s: malloc #%d at event %d: its planned offset %d is taken", STAllocName, p.next-1, c.event, off)
		}
		p.deviate(&p.stats.Taken, c, fmt.Sprintf("its offset %d is held by a block live longer than profiled", off))
		return Block{}, false, nil
	}
	p.live = slices.Insert(p.live, i, off)
	p.liveSize[off] = n
	p.liveBytes += n
	p.stats.Planned++
	return Block{Addr: p.region + off, Size: n}, true, nil
}

// deviate counts call c as a deviation from the profile, in count too,
// and keeps the first's description.
func (p *STAlloc) deviate(count *int64, c stCall, why string) {
	*count++
	p.stats.Deviations++
	if p.stats.First == "" {
		p.stats.First = fmt.Sprintf("event %d (malloc #%d of %d bytes, position %d of iteration %d): %s", c.event, p.next-1, c.size, c.pos, c.iter, why)
	}
}

// Free takes back the block at addr: from the region, or from the online
// manager. It returns an error if addr is not a live block.
func (p *STAlloc) Free(addr, stream uint64) error {
	if p.hasRegion && addr >= p.region && addr-p.region < p.plan.height {
		off := addr - p.region
		n, ok := p.liveSize[off]
		if !ok {
			return fmt.Errorf("policy %s: free of %#x: not a live block", STAllocName, addr)
		}
		delete(p.liveSize, off)
		i, _ := slices.BinarySearch(p.live, off)
		p.live = slices.Delete(p.live, i, i+1)
		p.liveBytes -= n
		return nil
	}
	return p.online.Free(addr, stream)
}

// EmptyCache empties the online manager's cache; the region is kept, as
// STAlloc keeps it for the whole job.
func (p *STAlloc) EmptyCache() error { return p.online.EmptyCache() }

// FreeSpace returns the free bytes of the region and of the online
// manager's cache, and the size in bytes of the largest free block of
// either.
func (p *STAlloc) FreeSpace() (total, largest uint64) {
	total, largest = p.online.FreeSpace()
	if !p.hasRegion {
		return total, largest
	}
	var end uint64
	for _, off := range p.live {
		if off > end {
			largest = max(largest, off-end)
		}
		end = off + p.liveSize[off]
	}
	if p.plan.height > end {
		largest = max(largest, p.plan.height-end)
	}
	return total + p.plan.height - p.liveBytes, largest
}

// Retries returns the online manager's allocation retries.
func (p *STAlloc) Retries() int64 { return p.online.Retries() }

// Warnings says where the replay could not follow the plan as STAlloc
// would, or the trace could not tell the policy what it needed: no
// iterations, iterations guessed from the trace's periodicity, fewer
// iterations than the profile, mallocs that deviated from it, a refused
// region.
func (p *STAlloc) Warnings() []string {
	if !p.planned {
		return nil
	}
	pl := &p.plan
	var ws []string
	switch {
	case len(pl.starts) == 0:
		how := fmt.Sprintf("no marker whose label starts with %q and no call stack or size recurring at regular gaps", p.marker)
		if p.marker == "" {
			how = "no call stack or size recurring at regular gaps (markers not looked at: marker is empty)"
		}
		ws = append(ws, fmt.Sprintf("stalloc found no iterations in the trace (%s): with nothing to profile, all %d mallocs went to the online manager (pytorch)", how, len(pl.calls)))
		return ws
	case pl.found == "periodicity":
		ws = append(ws, fmt.Sprintf("stalloc found no iteration markers: %d iterations were taken to start where the trace repeats, at %s (events %s)", len(pl.starts), pl.anchor, listEvents(pl.starts, 8)))
	}
	if len(pl.starts) <= p.profile {
		ws = append(ws, fmt.Sprintf("stalloc profiles %d iterations and the trace has %d (from event %d): the plan was made from the whole trace, and no later iteration tests it", p.profile, len(pl.starts), pl.starts[0]))
	}
	if st := p.stats; st.Deviations > 0 {
		ws = append(ws, fmt.Sprintf("stalloc: %d mallocs of iterations 2 on parted from the profile and went to the online manager (%d past the profiled iteration's %d mallocs, %d of another size, %d at an offset still held); first: %s", st.Deviations, st.Beyond, len(pl.pattern), st.Mismatched, st.Taken, st.First))
	}
	if p.refused {
		ws = append(ws, fmt.Sprintf("stalloc: the device refused the plan's region of %d bytes at %s: its %d planned mallocs went to the online manager", pl.height, p.refusedMsg, p.stats.RegionRefused))
	}
	return ws
}

// listEvents writes up to n of the events evs, and how many more.
func listEvents(evs []int, n int) string {
	var b strings.Builder
	for k, e := range evs {
		if k == n {
			fmt.Fprintf(&b, " and %d more", len(evs)-n)
			break
		}
		if k > 0 {
			b.WriteString(", ")
		}
		fmt.Fprint(&b, e)
	}
	return b.String()
}

package policies

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gpualloc/allocsim/trace"
)

// OptimalName is the registry name of the Optimal policy, whose proven
// least peak a replay reports beside the lower bound (results.Result's
// PeakOptimum) and against which the table's ×optimum column measures
// every policy.
const OptimalName = "optimal"

// Optimal is the exact clairvoyant placement: like Offline it sees the
// whole trace before the replay (it is a Planner) and gives each malloc a
// fixed offset in one arena so that blocks live at the same time never
// overlap, but it searches for the least height (the arena, so the peak
// reserved bytes) and proves it, after MiniMalloc (Moffitt, "MiniMalloc: A
// Lightweight Memory Allocator for Hardware-Accelerated Machine Learning",
// ASPLOS 2023; google/minimalloc, src/solver.cc: the search, and its
// minimize_capacity bisection): the best greedy placement is the first
// upper bound, the most bytes live at once (sizes rounded to the
// alignment) the first lower bound; then decision problems "do the blocks
// fit under C bytes?" are posed at the lower bound, then by bisection,
// each solved by a search over canonical placements with MiniMalloc's
// pruning (exactSearch: spatial inference at every section, dominance,
// hatless pruning, decomposition where no block still to place crosses a
// moment, preorders in round robin). A placement found lowers the upper
// bound; a search that ends without one proves the lower bound up to C
// plus the greatest common divisor of the sizes. The plan is the optimum
// when the bounds meet (Stats().Proven); when the time limit or the node
// budget ends the search first, it is the best placement found, with the
// proven lower bound beside it (PlanBound).
//
// On MiniMalloc's benchmarks A..K (sizes multiples of 1024 bytes, so the
// alignment changes nothing; each solvable in 1048576 bytes) it proves
// nine optimal at their load bound in 0.02 to 2.6 s (one core), 1048576
// bytes but C's 1039360; D and J stop at the 60 s limit within 1048576,
// 5.3% and 4.7% above their proven bound (BenchmarkOptimalMiniMalloc). On
// the PyTorch snapshots of the shared collection it proves the optimum of
// each (hf_llama_train's 7936 bytes below Offline's).
//
// What is not modelled: a block's offset is fixed for its whole life
// (no moves, no compaction, no virtual memory remapping); the arena is one
// segment; streams play no part (a block is reusable once its free is
// replayed, as for Offline); MiniMalloc's per-buffer alignment, fixed
// offsets and gaps are not read (a trace has none). The replay, and what
// happens under a device capacity below the plan's height, are Offline's.
//
// Determinism: with time=0 the plan depends on the trace and the settings
// alone (the node budget ends the search); with a time limit, where it
// ends the search, the plan and the bound depend on the machine's speed,
// and nothing else does. A plan is kept for the process, as Offline's,
// so the replays of one trace at several capacities plan it once.
//
// Settings (defaults in brackets):
//   - alignment [256]: sizes, and so offsets, are rounded up to a multiple
//     of it (bytes, a power of two up to 2 MiB); 1 places a MiniMalloc
//     problem's sizes exactly.
//   - time [60s]: the search's time limit (a duration, or seconds; 0:
//     none).
//   - nodes [0]: the search's node budget, placements tried (0: none, the
//     time limit alone; at most 2^40). One of time and nodes must be set.
type Optimal struct {
	off   *Offline // the replay of the plan, Offline's
	limit time.Duration
	nodes int64
	stats OptimalStats
}

var (
	_ Policy      = (*Optimal)(nil)
	_ Planner     = (*Optimal)(nil)
	_ Releaser    = (*Optimal)(nil)
	_ FreeSpacer  = (*Optimal)(nil)
	_ PlanBounder = (*Optimal)(nil)
)

// PlanBounder is implemented by a clairvoyant policy that knows, once it
// has planned, how far its plan's peak is from the least any placement of
// the trace reaches: the replay copies PlanBound into its result
// (results.Result.Plan).
type PlanBounder interface {
	// PlanBound returns what the policy knows of its plan; valid after
	// Plan.
	PlanBound() PlanBound
}

// PlanBound is what a PlanBounder knows of its plan, in bytes after the
// policy's rounding.
type PlanBound struct {
	// Height is the plan's peak: its arena.
	Height uint64
	// LowerBound is proven: no placement of the trace's blocks has a
	// lower peak.
	LowerBound uint64
	// Proven reports that Height is the least: Height == LowerBound.
	Proven bool
	// Elapsed is the time the plan took; Nodes the search nodes it used.
	Elapsed time.Duration
	Nodes   int64
	// Stopped says, when not Proven, what ended the search: "time" (its
	// time limit), "nodes" (its node budget), "pairs" (too many blocks
	// live at once to search).
	Stopped string
}

func init() {
	register(Info{
		Name:   OptimalName,
		Design: "exact clairvoyant static placement, the least peak of any fixed-address placement of the trace (proven, or its best and a lower bound at its limit), by MiniMalloc's search over canonical solutions (Moffitt, ASPLOS 2023; google/minimalloc)",
		Settings: []Setting{
			offlineAlignmentSetting,
			{Key: "time", Default: "60s", Doc: "the search's time limit, as a duration (60s, 500ms) or seconds; 0: none, the node budget alone"},
			{Key: "nodes", Default: "0", Doc: "the search's budget in nodes, placements tried (0: none, the time limit alone), at most 2^40"},
		},
		// Up to its time limit on each trace, and its figures depend
		// on the machine where the limit ends the search.
		Explicit: true,
	}, func(dev Device, s Settings) (Policy, error) { return NewOptimal(dev, s) })
}

// NewOptimal returns the optimal policy on dev. It returns an error naming
// the key for an unknown or malformed setting, and for time and nodes
// both 0 (a search without end).
func NewOptimal(dev Device, s Settings) (*Optimal, error) {
	if err := s.Check(OptimalName, "alignment", "time", "nodes"); err != nil {
		return nil, err
	}
	align, err := offlineAlignment(OptimalName, s)
	if err != nil {
		return nil, err
	}
	limit, err := optimalTime(s)
	if err != nil {
		return nil, err
	}
	nodes, err := s.Uint(OptimalName, "nodes", 0)
	if err != nil {
		return nil, err
	}
	if nodes > 1<<40 {
		return nil, invalidSettingf(OptimalName, s, "nodes", "must be at most 2^40")
	}
	if limit == 0 && nodes == 0 {
		return nil, fmt.Errorf("policy %s: settings time=0 and nodes=0: the search would have no end: set a time limit or a node budget", OptimalName)
	}
	off := &Offline{name: OptimalName, dev: dev, alignment: align, orders: greedyOrders, nodes: int64(nodes)}
	return &Optimal{off: off, limit: limit, nodes: int64(nodes)}, nil
}

// optimalTime returns the time setting: a Go duration ("60s", "1m30s") or
// a number of seconds, at least 0.
func optimalTime(s Settings) (time.Duration, error) {
	v, ok := s["time"]
	if !ok {
		return 60 * time.Second, nil
	}
	t := strings.TrimSpace(v)
	d, err := time.ParseDuration(t)
	if err != nil {
		f, ferr := strconv.ParseFloat(t, 64)
		if ferr != nil || f != f || f > 1e9 {
			return 0, invalidSettingf(OptimalName, s, "time", "not a duration (60s, 500ms) or a number of seconds")
		}
		d = time.Duration(f * float64(time.Second))
	}
	if d < 0 {
		return 0, invalidSettingf(OptimalName, s, "time", "must not be negative")
	}
	return d, nil
}

// Name returns the policy's registry name.
func (p *Optimal) Name() string { return OptimalName }

// Stats returns the statistics of the plan made by Plan.
func (p *Optimal) Stats() OptimalStats { return p.stats }

// PlanBound returns the plan's height, its proven lower bound, whether
// they meet, and the time and nodes the plan took.
func (p *Optimal) PlanBound() PlanBound {
	st := p.stats
	return PlanBound{Height: st.Height, LowerBound: st.LowerBound, Proven: st.Proven, Elapsed: st.Elapsed, Nodes: st.Nodes, Stopped: st.Stopped}
}

// Plan places every malloc of the trace evs, by the rules of Offline's
// Plan for which events are mallocs and how long each lives. It returns
// an error for a placement that fails its own check, a bug.
func (p *Optimal) Plan(evs []trace.Event) error {
	key := optimalKey{p.off.planKeyOf(evs), p.limit}
	if c := cachedOptimalOf(key); c != nil {
		o := p.off
		o.mallocs = append(o.mallocs[:0], c.mallocs...)
		o.height, p.stats = c.height, c.stats
		o.planned, o.next = true, 0
		return nil
	}
	bufs, err := p.off.blocks(evs)
	if err != nil {
		return err
	}
	res, err := solveOptimal(bufs, widths(evs, bufs), p.nodes, p.limit)
	if err != nil {
		return fmt.Errorf("policy %s: %w", OptimalName, err)
	}
	o := p.off
	for k, b := range bufs {
		o.mallocs[b.call].offset = res.offsets[k]
	}
	o.height, p.stats = res.height, res.stats
	o.planned, o.next = true, 0
	keepOptimal(key, &cachedOptimal{mallocs: slices.Clone(o.mallocs), height: o.height, stats: p.stats})
	return nil
}

// widths returns the lifetime of each block of bufs in the trace's time
// (a block never freed lives to the last event's time), which orders the
// search as MiniMalloc's lifespans do; nil, for lifetimes in events, when
// the trace has no times (all 0) or they go backwards.
func widths(evs []trace.Event, bufs []packBuf) []int64 {
	w := make([]int64, len(bufs))
	any := false
	for k, b := range bufs {
		end := evs[len(evs)-1].Time
		if b.end < int64(len(evs)) {
			end = evs[b.end].Time
		}
		w[k] = end - evs[b.start].Time
		if w[k] < 0 {
			return nil
		}
		any = any || w[k] > 0
	}
	if !any {
		return nil
	}
	return w
}

// Malloc places the next malloc of the plan, as Offline's Malloc does.
func (p *Optimal) Malloc(size, stream uint64) (Block, error) { return p.off.Malloc(size, stream) }

// Free takes back the block at addr, as Offline's Free does.
func (p *Optimal) Free(addr, stream uint64) error { return p.off.Free(addr, stream) }

// EmptyCache returns the arena to the device when no block is live.
func (p *Optimal) EmptyCache() error { return p.off.EmptyCache() }

// FreeSpace returns the free bytes in the arena and its largest free gap.
func (p *Optimal) FreeSpace() (total, largest uint64) { return p.off.FreeSpace() }

// optimalKey identifies a plan of the optimal policy: Offline's key (the
// events, the alignment, the node budget) and the time limit.
type optimalKey struct {
	planKey
	limit time.Duration
}

// cachedOptimal is a plan made.
type cachedOptimal struct {
	mallocs []plannedMalloc
	height  uint64
	stats   OptimalStats
}

// optimalCache keeps the last plans made in this process, as planCache
// does Offline's.
var optimalCache struct {
	sync.Mutex
	plans map[optimalKey]*cachedOptimal
	order []optimalKey // oldest first
}

func cachedOptimalOf(key optimalKey) *cachedOptimal {
	optimalCache.Lock()
	defer optimalCache.Unlock()
	return optimalCache.plans[key]
}

func keepOptimal(key optimalKey, c *cachedOptimal) {
	optimalCache.Lock()
	defer optimalCache.Unlock()
	if optimalCache.plans == nil {
		optimalCache.plans = map[optimalKey]*cachedOptimal{}
	}
	if _, ok := optimalCache.plans[key]; ok {
		return
	}
	optimalCache.plans[key] = c
	optimalCache.order = append(optimalCache.order, key)
	if len(optimalCache.order) > planCacheSize {
		delete(optimalCache.plans, optimalCache.order[0])
		optimalCache.order = optimalCache.order[1:]
	}
}

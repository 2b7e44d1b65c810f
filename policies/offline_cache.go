package policies

import (
	"encoding/binary"
	"hash/maphash"
	"slices"
	"strings"
	"sync"

	"github.com/gpualloc/allocsim/trace"
)

// A plan depends on the trace's events and the planner's settings only,
// not on the capacity it is replayed under, so the replays of one trace
// that replay fit makes at every capacity it tries (and tune, sweep) plan
// it once: Plan keeps the last plans made in this process, keyed by a hash
// of every field of the events it reads and by the settings, and a
// replay of the same events takes a copy. Planning hf_llama_train's 49k
// events took offline 0.9 s a replay, 25 replays in one fit.

// planKey identifies a plan.
type planKey struct {
	events    int
	sum       uint64 // maphash of the fields Plan reads, event by event
	orders    string // the greedy orders' names
	nodes     int64
	alignment uint64
}

// cachedPlan is a plan made: its mallocs (offsets by malloc call), height
// and statistics.
type cachedPlan struct {
	mallocs []plannedMalloc
	height  uint64
	stats   PlanStats
}

// planCacheSize is the number of plans kept: the planners of a few traces.
const planCacheSize = 8

var planCache struct {
	sync.Mutex
	seed  maphash.Seed
	plans map[planKey]*cachedPlan
	order []planKey // oldest first
}

func init() { planCache.seed = maphash.MakeSeed() }

// planKeyOf returns the key of p's plan of evs.
func (p *Offline) planKeyOf(evs []trace.Event) planKey {
	var h maphash.Hash
	h.SetSeed(planCache.seed)
	var b [26]byte
	for i := range evs {
		ev := &evs[i]
		b[0], b[1] = byte(ev.Op), byte(ev.Kind)
		binary.LittleEndian.PutUint64(b[2:], ev.Addr)
		binary.LittleEndian.PutUint64(b[10:], ev.Size)
		binary.LittleEndian.PutUint64(b[18:], uint64(i))
		h.Write(b[:])
	}
	names := make([]string, len(p.orders))
	for k, o := range p.orders {
		names[k] = o.name
	}
	return planKey{events: len(evs), sum: h.Sum64(), orders: strings.Join(names, ","), nodes: p.nodes, alignment: p.alignment}
}

// cachedPlanOf returns the plan kept for key, nil if none.
func cachedPlanOf(key planKey) *cachedPlan {
	planCache.Lock()
	defer planCache.Unlock()
	return planCache.plans[key]
}

// keepPlan keeps p's plan under key, dropping the oldest past
// planCacheSize.
func (p *Offline) keepPlan(key planKey) {
	planCache.Lock()
	defer planCache.Unlock()
	if planCache.plans == nil {
		planCache.plans = map[planKey]*cachedPlan{}
	}
	if _, ok := planCache.plans[key]; ok {
		return
	}
	planCache.plans[key] = &cachedPlan{mallocs: slices.Clone(p.mallocs), height: p.height, stats: p.stats}
	planCache.order = append(planCache.order, key)
	if len(planCache.order) > planCacheSize {
		delete(planCache.plans, planCache.order[0])
		planCache.order = planCache.order[1:]
	}
}

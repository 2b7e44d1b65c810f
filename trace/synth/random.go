package synth

import (
	"math/rand/v2"
)

var randomWorkload = Workload{
	Name: "random",
	Doc: "random allocations as in RMM's random_allocations benchmark (uniform_random_allocations): 2 x " +
		"`allocations` steps; each allocates, with probability `p`, a size uniform in [1, max-size] while fewer " +
		"than `allocations` were made and live bytes stay under `max-usage`, and otherwise frees a live " +
		"allocation chosen at random; the first step, and any step with nothing live, allocates; what is live " +
		"at the end is freed",
	Params: []Param{
		{"allocations", "10000", "allocations made"},
		{"max-size", "64MiB", "largest allocation"},
		{"max-usage", "16000MiB", "live bytes an allocation may not reach"},
		{"p", "0.73", "probability that a step allocates"},
		{"streams", "1", "streams, allocations spread at random (a free uses its allocation's stream)"},
	},
	build: newRandom,
}

type liveRand struct{ addr, size, stream uint64 }

type randomAllocs struct {
	rng                  *rand.Rand
	allocations, streams int
	maxSize, maxUsage    uint64
	p                    float64
	steps, made          int
	usage                uint64
	live                 []liveRand
}

func newRandom(p *params, rng *rand.Rand) (stepper, error) {
	return &randomAllocs{
		rng: rng, allocations: p.int("allocations", 0), streams: p.int("streams", 1),
		maxSize: p.size("max-size"), maxUsage: p.size("max-usage"), p: p.prob("p"),
	}, nil
}

// step runs up to 1024 of the benchmark's steps.
func (r *randomAllocs) step(e *emitter) bool {
	for range 1024 {
		if r.steps == 2*r.allocations {
			for _, l := range r.live {
				e.free(l.addr, l.stream)
			}
			r.live = nil
			return false
		}
		r.steps++
		size := 1 + r.rng.Uint64N(r.maxSize)
		alloc := true
		if len(r.live) > 0 {
			alloc = r.rng.Float64() < r.p && r.made < r.allocations && r.usage+size < r.maxUsage
		}
		if alloc {
			stream := uint64(r.rng.IntN(r.streams))
			r.live = append(r.live, liveRand{e.malloc(size, stream), size, stream})
			r.made++
			r.usage += size
			continue
		}
		i := r.rng.IntN(len(r.live))
		l := r.live[i]
		r.live[i] = r.live[len(r.live)-1]
		r.live = r.live[:len(r.live)-1]
		e.free(l.addr, l.stream)
		r.usage -= l.size
	}
	return true
}

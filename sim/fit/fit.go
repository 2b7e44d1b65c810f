// Package fit finds the smallest device capacity at which a policy replays
// a trace without running out of memory, and whether it fits common card
// sizes: replay fit.
package fit

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/sim/results"
	"github.com/gpualloc/allocsim/trace"
)

// DefaultContext is the memory in bytes the device's context holds before
// the first allocation (sim.ContextBytes).
const DefaultContext = sim.ContextBytes

// DefaultCards are the cards answered for by default: common ones by
// name, from 16 GB to the H200 (NamedCards).
const DefaultCards = "T4-16GB,L4-24GB,A100-40GB,L40S-48GB,H100-80GB,H200"

// KnownCard is a card whose memory is known by name: Measured is the total
// that CUDA reports for it (cudaMemGetInfo, deviceQuery's "Total amount of
// global memory"), as measured, with Source saying where; without a
// measurement the card's nominal size (10^9 bytes a GB, as it is sold)
// stands in, which is not what the driver reports (for the cards measured
// it reports more).
type KnownCard struct {
	Bytes    uint64
	Measured bool
	Source   string
}

// NamedCards are the cards known by name (any case). The H200 is this
// project's measurement (../shared/reference, CUDA_MEASURED.md); the
// A100-40GB is a public deviceQuery's (bottlerocket-os/bottlerocket pull
// request 3873: "40339 MBytes (42298834944 bytes)"); the others are
// nominal until someone measures one.
var NamedCards = map[string]KnownCard{
	"H200":      {150109880320, true, "measured on an H200 (cudaMemGetInfo total, CUDA 13.0)"},
	"A100-40GB": {42298834944, true, "deviceQuery on an A100-SXM4-40GB, bottlerocket-os/bottlerocket#3873"},
	"T4-16GB":   {16e9, false, "nominal"},
	"L4-24GB":   {24e9, false, "nominal"},
	"A10-24GB":  {24e9, false, "nominal"},
	"L40S-48GB": {48e9, false, "nominal"},
	"A100-80GB": {80e9, false, "nominal"},
	"H100-80GB": {80e9, false, "nominal"},
	"H100-94GB": {94e9, false, "nominal"},
}

// ParseCard parses one card: a name of NamedCards (any case: its measured
// memory, or its nominal size marked Nominal), a size (policies.ParseSize;
// GB are 10^9 bytes, as cards are sold: Nominal), or a name with its size
// after its last '-' ("H100-80GB": the nominal 80 GB, not what CUDA
// reports for that card). The card is named as given. It returns an error
// for anything else, or a size of 0.
func ParseCard(s string) (results.Card, error) {
	t := strings.TrimSpace(s)
	for name, k := range NamedCards {
		if strings.EqualFold(name, t) {
			return results.Card{Name: t, Capacity: k.Bytes, Nominal: !k.Measured}, nil
		}
	}
	size := t
	if i := strings.LastIndexByte(t, '-'); i >= 0 {
		size = t[i+1:]
	}
	b, err := policies.ParseSize(size)
	if err != nil || b == 0 {
		return results.Card{}, fmt.Errorf("%q: not a card (a size like 80GB, a name like H100-80GB, or one of %s)", s, strings.Join(namedCards(), ", "))
	}
	return results.Card{Name: t, Capacity: b, Nominal: true}, nil
}

func namedCards() []string {
	names := make([]string, 0, len(NamedCards))
	for n := range NamedCards {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// ParseCards parses a comma-separated list of cards (ParseCard). It
// returns an error naming the first item that is no card.
func ParseCards(list string) ([]results.Card, error) {
	var cards []results.Card
	for _, c := range policies.SplitList(list) {
		card, err := ParseCard(c)
		if err != nil {
			return nil, err
		}
		cards = append(cards, card)
	}
	return cards, nil
}

// Trace searches each of cfgs (one policy each) on the trace h, evs, with
// up to jobs searches at a time, for cards whose context holds context
// bytes (Search), and returns the answers in the order of
// cfgs. An error names the policy of the first search that failed.
func Trace(h trace.Header, evs []trace.Event, cfgs []sim.Config, cards []results.Card, context uint64, jobs int) ([]*results.Fit, error) {
	rs := make([]*results.Fit, len(cfgs))
	errs := make([]error, len(cfgs))
	sem := make(chan struct{}, max(jobs, 1))
	var wg sync.WaitGroup
	for k, cfg := range cfgs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			rs[k], errs[k] = Search(cfg, cards, context, Replayer(h, evs, cfg))
		}()
	}
	wg.Wait()
	for k, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("policy %s: %w", cfgs[k].Policy, err)
		}
	}
	return rs, nil
}

// ReplayFunc replays a trace at a capacity in bytes (0: unlimited), a
// card's when card is true (the device holds its footprint to the
// capacity: sim.Config.Card), else one that holds the reserved bytes; a
// replay that runs out of memory may stop at its first OOM.
type ReplayFunc func(capacity uint64, card bool) (*sim.Result, error)

// Replayer returns the ReplayFunc that replays h and evs against cfg's
// policy (cfg.Capacity, cfg.Card and cfg.Observer are its own), stopping a
// replay at its first OOM; but for a policy that plans from the whole
// trace (policies.Planner), whose replay reads every event before the
// first, and is given them in place.
func Replayer(h trace.Header, evs []trace.Event, cfg sim.Config) ReplayFunc {
	info, _ := policies.Lookup(cfg.Policy)
	return func(capacity uint64, card bool) (*sim.Result, error) {
		c := cfg
		c.Capacity, c.Card = capacity, card
		stop := &oomStop{}
		c.Observer = stop
		var src trace.Source = stopSource{trace.NewSliceSource(h, evs), stop}
		if info.Abilities.Planner {
			src = trace.NewSliceSource(h, evs)
		}
		rs, err := sim.Run(src, c)
		if err != nil {
			return nil, err
		}
		return rs[0], nil
	}
}

// Search returns the answer for cfg's policy (cfg.Trace, cfg.Policy and
// cfg.Settings name it) on the trace that replay replays: the smallest
// capacity at which the replay has no OOM, found by bisection, checked by
// probes above and below it, since results need not be monotone in
// capacity; the smallest card (minCard); and the answer for each card: the
// replay on the card, its capacity less the context held to the footprint,
// has no OOM. It returns the first error of a replay.
func Search(cfg sim.Config, cards []results.Card, context uint64, replay ReplayFunc) (*results.Fit, error) {
	f := &fitter{cfg: cfg, run: replay, probes: map[uint64]results.Probe{}, onCards: map[uint64]results.Probe{}, context: context}
	return f.fit(cards)
}

// fitter searches one policy's smallest capacity for one trace.
type fitter struct {
	cfg     sim.Config
	run     ReplayFunc
	probes  map[uint64]results.Probe // by capacity, held to the reserved bytes
	onCards map[uint64]results.Probe // by capacity, held to the footprint
	context uint64                   // bytes of a card its context holds
}

// oomStop is an Observer that stops the replay's source at the first OOM,
// since fit needs no more of a replay that ran out of memory.
type oomStop struct{ stopped bool }

func (o *oomStop) Observe(a sim.Action) {
	if a.Kind == sim.ActionOOM {
		o.stopped = true
	}
}

type stopSource struct {
	trace.Source
	stop *oomStop
}

func (s stopSource) Next() (trace.Event, error) {
	if s.stop.stopped {
		return trace.Event{}, io.EOF
	}
	return s.Source.Next()
}

// replay replays the trace at capacity (0 = unlimited) held to the
// reserved bytes, once per capacity.
func (f *fitter) replay(capacity uint64) (results.Probe, *sim.Result, error) {
	return f.probe(f.probes, capacity, false)
}

// onCard replays the trace on a card of capacity bytes less its context,
// held to the footprint, once per capacity.
func (f *fitter) onCard(capacity uint64) (results.Probe, *sim.Result, error) {
	return f.probe(f.onCards, capacity, true)
}

func (f *fitter) probe(done map[uint64]results.Probe, capacity uint64, card bool) (results.Probe, *sim.Result, error) {
	if p, ok := done[capacity]; ok {
		return p, nil, nil
	}
	r, err := f.run(capacity, card)
	if err != nil {
		return results.Probe{}, nil, err
	}
	p := results.Probe{Capacity: capacity, Card: card, OOM: r.OOMs > 0, FirstOOMEvent: r.FirstOOMEvent}
	if !p.OOM {
		p.PeakReserved, p.PeakFootprint = r.PeakReserved, r.PeakFootprint
	}
	done[capacity] = p
	return p, r, nil
}

// MaxCapacity bounds the search upwards: 1 PiB, in bytes.
const MaxCapacity = 1 << 50

func (f *fitter) fit(cards []results.Card) (*results.Fit, error) {
	res := &results.Fit{Trace: f.cfg.Trace, Policy: f.cfg.Policy, Settings: f.cfg.Settings, Monotone: true}
	p0, r0, err := f.replay(0)
	if err != nil {
		return nil, err
	}
	delete(f.probes, 0)        // capacity 0 means unlimited: not a probe
	res.Settings = r0.Settings // those used, the recorded ones included
	res.LowerBound = r0.PeakRequested
	res.UnlimitedPeakReserved = r0.PeakReserved
	res.Warnings = r0.Warnings
	res.Replays = 1
	if p0.OOM {
		// The policy runs out of memory on its own.
		return f.finish(res, cards)
	}
	if r0.PeakReserved == 0 {
		res.Fits = true // no device memory at all
		return f.finish(res, cards)
	}
	// hi fits; lo does not (0 stands for "below every capacity").
	hi := r0.PeakReserved
	for {
		p, _, err := f.replay(hi)
		if err != nil {
			return nil, err
		}
		if !p.OOM {
			break
		}
		if hi >= MaxCapacity {
			return f.finish(res, cards) // never fits
		}
		hi = min(2*hi, MaxCapacity)
	}
	var lo uint64
	if b := res.LowerBound; b > 1 && b-1 < hi {
		p, _, err := f.replay(b - 1)
		if err != nil {
			return nil, err
		}
		if p.OOM {
			lo = b - 1
		} else {
			hi = min(hi, max(p.PeakReserved, 1))
		}
	}
	for round := 0; ; round++ {
		if hi, err = f.bisect(lo, hi); err != nil {
			return nil, err
		}
		// Probes: the card sizes and points evenly above the answer,
		// up to the unlimited peak, and below it, down to the lower
		// bound.
		top := max(res.UnlimitedPeakReserved, hi)
		var probes []uint64
		for k := uint64(1); k < 8; k++ {
			probes = append(probes, hi+(top-hi)*k/8)
		}
		for k := uint64(0); k < 4; k++ {
			probes = append(probes, res.LowerBound+(hi-min(res.LowerBound, hi))*k/4)
		}
		for _, c := range cards {
			if c.Capacity > f.context {
				probes = append(probes, c.Capacity-f.context)
			}
		}
		below := uint64(0) // the smallest capacity below hi that fits
		for _, c := range probes {
			if c == 0 || c == hi {
				continue
			}
			p, _, err := f.replay(c)
			if err != nil {
				return nil, err
			}
			if !p.OOM && c < hi && (below == 0 || c < below) {
				below = c
			}
		}
		if below == 0 || round == 2 {
			break
		}
		// A smaller capacity fits after all: search below it.
		hi, lo = below, 0
		for c, p := range f.probes {
			if p.OOM && c < hi && c > lo {
				lo = c
			}
		}
	}
	res.Fits = true
	res.MinCapacity = hi
	return f.finish(res, cards)
}

// bisect returns the smallest capacity in (lo, hi] that fits, hi fitting
// and lo not (or 0), held to the reserved bytes.
func (f *fitter) bisect(lo, hi uint64) (uint64, error) {
	return bisectWith(lo, hi, f.replay, func(p results.Probe) uint64 { return p.PeakReserved })
}

// bisectWith returns the smallest capacity in (lo, hi] at which replay
// fits, hi fitting and lo not (or 0). A replay that fits at c with a
// smaller peak p (what peak reads: the bytes the capacity holds) is tried
// at p at once: a policy that reads no capacity behaves the same there,
// which ends most searches in a few replays.
func bisectWith(lo, hi uint64, replay func(uint64) (results.Probe, *sim.Result, error), peak func(results.Probe) uint64) (uint64, error) {
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		p, _, err := replay(mid)
		if err != nil {
			return 0, err
		}
		if p.OOM {
			lo = mid
			continue
		}
		hi = mid
		for peak(p) > lo && peak(p) < hi {
			q, _, err := replay(peak(p))
			if err != nil {
				return 0, err
			}
			if q.OOM {
				lo = peak(p)
				break
			}
			hi, p = peak(p), q
		}
	}
	return hi, nil
}

// minCard returns the smallest card found that the trace runs on: the
// context plus the smallest capacity at which the replay on a card (held
// to the footprint) has no OOM. The search starts at the peak footprint of
// the replay at minCap (held to the reserved bytes, which fits), steps up
// by 1/64 while the card runs out of memory, and bisects down to minCap
// (a card holds at least the reserved bytes); 0 if no card fits in 32
// steps.
func (f *fitter) minCard(minCap uint64) (uint64, error) {
	p, _, err := f.replay(minCap)
	if err != nil {
		return 0, err
	}
	hi := max(minCap, p.PeakFootprint)
	for k := 0; ; k++ {
		q, _, err := f.onCard(hi)
		if err != nil {
			return 0, err
		}
		if !q.OOM {
			break
		}
		if k == 31 || hi >= MaxCapacity {
			return 0, nil
		}
		hi = min(hi+max(hi/64, 1), MaxCapacity)
	}
	if hi > minCap {
		// The footprint is the usual answer: try just below it first.
		q, _, err := f.onCard(hi - 1)
		if err != nil {
			return 0, err
		}
		if !q.OOM {
			if hi, err = bisectWith(minCap-1, hi-1, f.onCard, func(p results.Probe) uint64 { return p.PeakFootprint }); err != nil {
				return 0, err
			}
		}
	}
	return f.context + hi, nil
}

// finish answers for the cards (a replay at each capacity) and lists the
// probes, and those that contradict monotonicity.
func (f *fitter) finish(res *results.Fit, cards []results.Card) (*results.Fit, error) {
	res.Context = f.context
	if res.Fits {
		c, err := f.minCard(res.MinCapacity)
		if err != nil {
			return nil, err
		}
		res.MinCard = c
	}
	for _, c := range cards {
		fits := false
		if c.Capacity > f.context {
			room := c.Capacity - f.context
			p, _, err := f.onCard(room)
			if err != nil {
				return nil, err
			}
			fits = !p.OOM
		}
		res.Cards = append(res.Cards, results.CardFit{Card: c, Fits: fits})
	}
	for _, p := range f.probes {
		res.Probes = append(res.Probes, p)
	}
	for _, p := range f.onCards {
		res.Probes = append(res.Probes, p)
	}
	sort.Slice(res.Probes, func(i, j int) bool {
		a, b := res.Probes[i], res.Probes[j]
		return a.Capacity < b.Capacity || a.Capacity == b.Capacity && !a.Card && b.Card
	})
	res.Replays += len(res.Probes)
	for _, p := range res.Probes {
		if res.Fits && !p.Card && p.OOM && p.Capacity > res.MinCapacity {
			res.Monotone = false
			res.NonMonotone = append(res.NonMonotone, p)
		}
	}
	return res, nil
}

// Package synth generates synthetic allocation traces for the scenarios
// people debug allocators with: a training loop, dynamic-batching
// inference, KV-cache decoding, a per-request malloc/free service, and
// random allocations as in RMM's random_allocations benchmark.
//
// A workload is seeded and parameterized; the same name, seed and
// parameters give the same events. Generators stream: they hold the live
// allocations and one step's events, never the trace, so a trace of a
// hundred million events costs no more memory than a small one.
package synth

import (
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"

	"github.com/gpualloc/allocsim/trace"
)

// Param is one parameter of a workload.
type Param struct {
	Name    string
	Default string
	Usage   string
}

// Workload is a named generator.
type Workload struct {
	Name   string
	Doc    string
	Params []Param
	build  func(p *params, rng *rand.Rand) (stepper, error)
}

// Workloads lists the generators by name.
var Workloads = []Workload{trainWorkload, inferenceWorkload, kvcacheWorkload, serviceWorkload, randomWorkload}

// Lookup returns the workload called name.
func Lookup(name string) (Workload, bool) {
	for _, w := range Workloads {
		if w.Name == name {
			return w, true
		}
	}
	return Workload{}, false
}

// Names returns the workload names.
func Names() []string {
	out := make([]string, len(Workloads))
	for i, w := range Workloads {
		out[i] = w.Name
	}
	return out
}

// New returns a source of the events of workload name with seed and the
// parameters in set (others at their defaults). It returns an error for an
// unknown workload, an unknown parameter or a bad value.
func New(name string, seed uint64, set map[string]string) (trace.Source, error) {
	w, ok := Lookup(name)
	if !ok {
		return nil, fmt.Errorf("unknown workload %q (known: %s)", name, strings.Join(Names(), ", "))
	}
	p := &params{workload: name, vals: map[string]string{}}
	for _, d := range w.Params {
		p.vals[d.Name] = d.Default
	}
	keys := make([]string, 0, len(set))
	for k := range set {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if _, ok := p.vals[k]; !ok {
			names := make([]string, len(w.Params))
			for i, d := range w.Params {
				names[i] = d.Name
			}
			return nil, fmt.Errorf("workload %s has no parameter %q (it has: %s)", name, k, strings.Join(names, ", "))
		}
		p.vals[k] = set[k]
	}
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	st, err := w.build(p, rng)
	if err != nil {
		return nil, err
	}
	if p.err != nil {
		return nil, p.err
	}
	h := trace.Header{Source: "synth", Metadata: map[string]string{"workload": name, "seed": strconv.FormatUint(seed, 10)}}
	for k, v := range p.vals {
		h.Metadata["param."+k] = v
	}
	return &source{h: h, st: st, em: &emitter{thread: 1}}, nil
}

// params holds a workload's parameter values; the first bad value is kept
// in err.
type params struct {
	workload string
	vals     map[string]string
	err      error
}

func (p *params) fail(name, msg string) {
	if p.err == nil {
		p.err = fmt.Errorf("%s: --%s=%s: %s", p.workload, name, p.vals[name], msg)
	}
}

// int returns parameter name as an integer of at least lo.
func (p *params) int(name string, lo int) int {
	v, err := strconv.Atoi(p.vals[name])
	if err != nil {
		p.fail(name, "not an integer")
		return lo
	}
	if v < lo {
		p.fail(name, fmt.Sprintf("must be at least %d", lo))
		return lo
	}
	return v
}

// size returns parameter name in bytes (a number, optionally with a KiB,
// MiB, GiB or TiB suffix), at least 1.
func (p *params) size(name string) uint64 {
	s := p.vals[name]
	mult := uint64(1)
	for _, sf := range []struct {
		s string
		m uint64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40}} {
		if strings.HasSuffix(s, sf.s) {
			s, mult = strings.TrimSuffix(s, sf.s), sf.m
			break
		}
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil || v == 0 || v > (1<<62)/mult {
		p.fail(name, "not a size in bytes (like 4096, 64KiB, 2MiB, 1GiB)")
		return 1
	}
	return v * mult
}

// prob returns parameter name as a probability in [0, 1].
func (p *params) prob(name string) float64 {
	v, err := strconv.ParseFloat(p.vals[name], 64)
	if err != nil || v < 0 || v > 1 {
		p.fail(name, "not a probability between 0 and 1")
		return 0
	}
	return v
}

// span checks lo <= hi for a pair of parameters.
func (p *params) span(loName string, lo int, hiName string, hi int) {
	if lo > hi {
		p.fail(loName, fmt.Sprintf("is above --%s=%d", hiName, hi))
	}
}

// stepper produces the events of a workload a step at a time: each call
// emits the next step's events and reports whether there are more steps.
type stepper interface {
	step(e *emitter) bool
}

// source is a trace.Source over a stepper.
type source struct {
	h    trace.Header
	st   stepper
	em   *emitter
	i    int
	done bool
}

func (s *source) Header() trace.Header { return s.h }

func (s *source) Next() (trace.Event, error) {
	for s.i >= len(s.em.q) {
		if s.done {
			return trace.Event{}, io.EOF
		}
		s.em.q, s.i = s.em.q[:0], 0
		s.done = !s.st.step(s.em)
	}
	s.i++
	return s.em.q[s.i-1], nil
}

// emitter queues the events of one step and keeps the clock, the address
// and CUDA event counters.
type emitter struct {
	q      []trace.Event
	now    int64 // ns
	addr   uint64
	event  uint64
	thread uint64
}

// callNs is the time an allocator call takes in the synthetic clock.
const callNs = 1000

func (e *emitter) emit(ev trace.Event) {
	e.now += callNs
	ev.Time, ev.Thread = e.now, e.thread
	e.q = append(e.q, ev)
}

// malloc emits a malloc of size bytes on stream and returns its address.
func (e *emitter) malloc(size, stream uint64) uint64 {
	e.addr += 0x100
	e.emit(trace.Event{Op: trace.OpMalloc, Addr: e.addr, Size: size, Stream: stream})
	return e.addr
}

func (e *emitter) free(addr, stream uint64) {
	e.emit(trace.Event{Op: trace.OpFree, Addr: addr, Stream: stream})
}

func (e *emitter) streamSync(stream uint64) {
	e.emit(trace.Event{Op: trace.OpStreamSync, Stream: stream})
}

// record emits an event record on stream and returns the CUDA event.
func (e *emitter) record(stream uint64) uint64 {
	e.event++
	e.emit(trace.Event{Op: trace.OpEventRecord, Addr: e.event, Stream: stream})
	return e.event
}

func (e *emitter) wait(stream, event uint64) {
	e.emit(trace.Event{Op: trace.OpStreamWaitEvent, Addr: event, Stream: stream})
}

func (e *emitter) marker(label string) {
	e.emit(trace.Event{Op: trace.OpMarker, Label: label})
}

// compute advances the clock by the time a kernel touching bytes takes
// (at 1 byte per picosecond: 1 TB/s), at least a microsecond.
func (e *emitter) compute(bytes uint64) {
	e.now += max(int64(bytes/1000), 1000)
}

// between returns a uniform integer in [lo, hi].
func between(rng *rand.Rand, lo, hi int) int { return lo + rng.IntN(hi-lo+1) }

// logUniform returns a size in [lo, hi] whose logarithm is uniform.
func logUniform(rng *rand.Rand, lo, hi uint64) uint64 {
	if lo >= hi {
		return lo
	}
	f := float64(lo) * math.Pow(float64(hi)/float64(lo), rng.Float64())
	return min(max(uint64(f), lo), hi)
}

package main

import (
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"

	"github.com/spf13/pflag"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/sim/results"
	"github.com/gpualloc/allocsim/trace"
	"github.com/gpualloc/allocsim/trace/tracefile"
)

const fitUsage = `usage: replay fit [--policy LIST|all] [--set NAME.key=value]... [--cards SIZE,...] [--json FILE] TRACE...

For each trace and policy, the smallest device capacity in bytes at which the
replay has no OOM (the malloc that failed in the source, if any, included),
found by bisection over capacities, and the answer for common card sizes,
each replayed at its capacity. Results need not be monotone in capacity (a
smaller device can make a caching policy release its cache earlier): probes
above and below the answer check it, and the table says where a capacity
above the smallest one runs out of memory.

Flags:
`

// defaultCards are the nominal card sizes fit answers for, in GB of 10^9
// bytes, as cards are sold: 16, 24, 40, 48, 80, 94 and 141 GB.
const defaultCards = "16GB,24GB,40GB,48GB,80GB,94GB,141GB"

type (
	fitResult = results.Fit
	fitProbe  = results.Probe
	cardFit   = results.CardFit
	card      = results.Card
)

func runFit(stdout, stderr io.Writer, args []string) error {
	fs := pflag.NewFlagSet("fit", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, fitUsage)
		fs.PrintDefaults()
	}
	policyList := fs.String("policy", "all", "policies: a comma-separated list of names, or all ("+strings.Join(policies.Names(), ", ")+")")
	sets := fs.StringArray("set", nil, "a policy setting NAME.key=value (repeatable)")
	cardList := fs.String("cards", defaultCards, "card sizes to answer for (GB are 10^9 bytes)")
	jsonOut := fs.String("json", "", "write the results as JSON to `FILE` (- for stdout)")
	jobs := fs.IntP("jobs", "j", runtime.NumCPU(), "policies searched in parallel")
	from := fs.String("from", "auto", "format of the traces: auto, "+strings.Join(tracefile.Formats, ", "))
	device := fs.Int("device", 0, "device index to replay from multi-device traces")
	asRecorded := fs.Bool("as-recorded", true, "replay a recording as recorded, as replay sim does: with the allocator settings it records (--set overrides them) and at its recorded addresses")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() == 0 {
		return fmt.Errorf("fit: no trace given")
	}
	names, err := policyNames(*policyList)
	if err != nil {
		return err
	}
	settings, err := parseSets(*sets, names)
	if err != nil {
		return err
	}
	var cards []card
	for _, c := range splitList(*cardList) {
		b, err := policies.ParseSize(c)
		if err != nil || b == 0 {
			return fmt.Errorf("--cards %q: not a size", c)
		}
		cards = append(cards, card{Name: c, Capacity: b})
	}
	var answers []*fitResult
	for _, path := range fs.Args() {
		h, evs, err := readTrace(path, tracefile.Options{From: *from, Device: *device})
		if err != nil {
			return err
		}
		rs := make([]*fitResult, len(names))
		errs := make([]error, len(names))
		sem := make(chan struct{}, max(*jobs, 1))
		var wg sync.WaitGroup
		for k, n := range names {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sem <- struct{}{}
				defer func() { <-sem }()
				f := newFitter(h, evs, sim.Config{Trace: path, Policy: n, Settings: settings[n], AsRecorded: *asRecorded})
				rs[k], errs[k] = f.fit(cards)
			}()
		}
		wg.Wait()
		for k, err := range errs {
			if err != nil {
				return fmt.Errorf("%s: policy %s: %w", path, names[k], err)
			}
		}
		answers = append(answers, rs...)
	}
	if *jsonOut != "" {
		if err := writeOutput(stdout, *jsonOut, func(w io.Writer) error { return results.WriteFit(w, answers) }); err != nil {
			return fmt.Errorf("--json: %w", err)
		}
	}
	if *jsonOut != "-" {
		writeFitTable(stdout, answers, cards)
	}
	return nil
}

// readTrace reads a whole trace into memory, for the many replays of fit.
func readTrace(path string, opts tracefile.Options) (trace.Header, []trace.Event, error) {
	f, err := tracefile.Open(path, opts)
	if err != nil {
		return trace.Header{}, nil, err
	}
	defer f.Close()
	var evs []trace.Event
	for {
		ev, err := f.Next()
		if err == io.EOF {
			return f.Header(), evs, nil
		}
		if err != nil {
			return trace.Header{}, nil, err
		}
		evs = append(evs, ev)
	}
}

// fitter searches one policy's smallest capacity for one trace.
type fitter struct {
	cfg sim.Config
	// run replays the trace at a capacity (0 = unlimited); a replay that
	// runs out of memory may stop at its first OOM.
	run    func(capacity uint64) (*sim.Result, error)
	probes map[uint64]fitProbe
}

// newFitter returns a fitter that replays evs against cfg's policy.
func newFitter(h trace.Header, evs []trace.Event, cfg sim.Config) *fitter {
	f := &fitter{cfg: cfg, probes: map[uint64]fitProbe{}}
	f.run = func(capacity uint64) (*sim.Result, error) {
		c := cfg
		c.Capacity = capacity
		stop := &oomStop{}
		c.Observer = stop
		rs, err := sim.Run(stopSource{trace.NewSliceSource(h, evs), stop}, c)
		if err != nil {
			return nil, err
		}
		return rs[0], nil
	}
	return f
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

// replay replays the trace at capacity (0 = unlimited), once per capacity.
func (f *fitter) replay(capacity uint64) (fitProbe, *sim.Result, error) {
	if p, ok := f.probes[capacity]; ok {
		return p, nil, nil
	}
	r, err := f.run(capacity)
	if err != nil {
		return fitProbe{}, nil, err
	}
	p := fitProbe{Capacity: capacity, OOM: r.OOMs > 0, FirstOOMEvent: r.FirstOOMEvent}
	if !p.OOM {
		p.PeakReserved = r.PeakReserved
	}
	f.probes[capacity] = p
	return p, r, nil
}

// maxCapacity bounds the search upwards: 1 PiB.
const maxCapacity = 1 << 50

func (f *fitter) fit(cards []card) (*fitResult, error) {
	res := &fitResult{Trace: f.cfg.Trace, Policy: f.cfg.Policy, Settings: f.cfg.Settings, Monotone: true}
	p0, r0, err := f.replay(0)
	if err != nil {
		return nil, err
	}
	delete(f.probes, 0)        // capacity 0 means unlimited: not a probe
	res.Settings = r0.Settings // those used, the recorded ones included
	res.LowerBound = r0.PeakRequested
	res.UnlimitedPeakReserved = r0.PeakReserved
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
		if hi >= maxCapacity {
			return f.finish(res, cards) // never fits
		}
		hi = min(2*hi, maxCapacity)
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
			probes = append(probes, c.Capacity)
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
// and lo not (or 0). A replay that fits at c with a smaller peak reserved
// p is tried at p at once: a policy that reads no capacity behaves the
// same there, which ends most searches in a few replays.
func (f *fitter) bisect(lo, hi uint64) (uint64, error) {
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		p, _, err := f.replay(mid)
		if err != nil {
			return 0, err
		}
		if p.OOM {
			lo = mid
			continue
		}
		hi = mid
		for p.PeakReserved > lo && p.PeakReserved < hi {
			q, _, err := f.replay(p.PeakReserved)
			if err != nil {
				return 0, err
			}
			if q.OOM {
				lo = p.PeakReserved
				break
			}
			hi, p = p.PeakReserved, q
		}
	}
	return hi, nil
}

// finish answers for the cards (a replay at each capacity) and lists the
// probes, and those that contradict monotonicity.
func (f *fitter) finish(res *fitResult, cards []card) (*fitResult, error) {
	for _, c := range cards {
		p, _, err := f.replay(c.Capacity)
		if err != nil {
			return nil, err
		}
		res.Cards = append(res.Cards, cardFit{Card: c, Fits: !p.OOM})
	}
	for _, p := range f.probes {
		res.Probes = append(res.Probes, p)
	}
	sort.Slice(res.Probes, func(i, j int) bool { return res.Probes[i].Capacity < res.Probes[j].Capacity })
	res.Replays += len(res.Probes)
	for _, p := range res.Probes {
		if res.Fits && p.OOM && p.Capacity > res.MinCapacity {
			res.Monotone = false
			res.NonMonotone = append(res.NonMonotone, p)
		}
	}
	return res, nil
}

func writeFitTable(w io.Writer, results []*fitResult, cards []card) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := "trace\tpolicy\tlower bound MiB\tmin capacity MiB\tmin capacity bytes\tover bound\t"
	for _, c := range cards {
		head += c.Name + "\t"
	}
	fmt.Fprintln(tw, head+"replays\t")
	for _, r := range results {
		minCap, bytes, over := "never", "-", "-"
		if r.Fits {
			minCap, bytes = mib(r.MinCapacity), strconv.FormatUint(r.MinCapacity, 10)
			if r.LowerBound > 0 {
				over = fmt.Sprintf("%+.1f%%", 100*(float64(r.MinCapacity)/float64(r.LowerBound)-1))
			}
			if !r.Monotone {
				minCap += " *"
			}
		}
		line := fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s\t", filepath.Base(r.Trace), r.Policy, mib(r.LowerBound), minCap, bytes, over)
		for _, c := range r.Cards {
			if c.Fits {
				line += "yes\t"
			} else {
				line += "no\t"
			}
		}
		fmt.Fprintln(tw, line+strconv.Itoa(r.Replays)+"\t")
	}
	tw.Flush()
	for _, r := range results {
		if !r.Monotone {
			var caps []string
			for _, p := range r.NonMonotone[:min(len(r.NonMonotone), 4)] {
				caps = append(caps, mib(p.Capacity)+" MiB")
			}
			fmt.Fprintf(w, "* %s: %s: not monotone in capacity: runs out of memory at %s although %s MiB fits\n",
				filepath.Base(r.Trace), r.Policy, strings.Join(caps, ", "), mib(r.MinCapacity))
		}
		if !r.Fits {
			fmt.Fprintf(w, "%s: %s: runs out of memory at every capacity tried, unlimited included\n", filepath.Base(r.Trace), r.Policy)
		}
	}
}

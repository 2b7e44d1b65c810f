// Package sites says where in the code the memory a policy reserved at its
// peak went: the live allocations at the peak of reserved bytes, grouped
// by the site of their malloc, and the reserved bytes they leave unused,
// shared out among the sites of each segment (replay sim --sites).
//
// The site of a malloc is, for a trace with call stacks (a PyTorch
// snapshot recorded with stack frames), its innermost frame of user code,
// FILE:LINE:FUNCTION: frames are skipped that are PyTorch's own (a file
// under a torch/ directory), Python's (a file under lib/pythonX.Y/ but not
// under site-packages/ or dist-packages/, and <frozen ...> modules) or the
// allocator's and other C and C++ code (a .c, .cc, .cpp, .cxx, .h, .hpp,
// .cu or .cuh file, or no file: "??"); other libraries (transformers, ...)
// count as user code. A stack with no such frame takes its innermost
// Python frame, and one of C and C++ frames only (the mallocs of autograd's
// backward pass, as PyTorch records them) is "(C++ frames only)". With a depth N above 1 the site is that frame and the N-1 frames
// of user code that called it, joined by " < ". For a `record run` trace
// the site is the malloc's call site (trace.Event.Label, such as
// "cudaMalloc@libc10_cuda.so+0x2f4cb"); a malloc with neither is "(no
// stack)".
//
// A segment's unused bytes are its size less the requested bytes of its
// live allocations (the policy's rounding, its free blocks, and blocks the
// program freed that wait on another stream). They are split among the
// sites of the segment's live allocations in proportion to each site's
// requested bytes in it (rounded down, the remainder to the site with the
// most bytes there); a segment with no live allocation counts in the row
// "(cached: no live block)". So the rows' live and unused bytes sum to the
// reserved bytes at the peak.
package sites

import (
	"fmt"
	"io"
	"math/bits"
	"sort"
	"strings"

	"github.com/gpualloc/allocsim/trace/tracefile"

	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/sim/viz"
	"github.com/gpualloc/allocsim/trace"
)

// Options say how sites are named and how many rows are kept.
type Options struct {
	// Depth is the number of frames of a site, at least 1.
	Depth int
	// Top is the number of rows kept, the rest summed in one row "(N
	// other sites)"; 0 keeps every row.
	Top int
}

// Rows with no site of code.
const (
	NoStack = "(no stack)"
	// CppOnly is the site of a malloc whose stack holds C and C++ frames
	// only: no Python frame names the code (autograd's backward pass).
	CppOnly = "(C++ frames only)"
	Cached  = "(cached: no live block)"
	// FailedMalloc is the block, and the memory the policy took for it,
	// of a malloc that failed in the recording and that the replay served
	// for an instant at the peak.
	FailedMalloc = "(failed in the recording, served for an instant)"
)

// AtPeak replays src, the trace that res is the result of, against cfg,
// the config that gave res, up to the end of its peak event
// (res.PeakReservedEvent) and returns the memory at that moment by site:
// AtPeaks of one.
func AtPeak(src trace.Source, cfg sim.Config, res *sim.Result, opt Options) (*sim.SitesAtPeak, error) {
	out, err := AtPeaks(src, []sim.Config{cfg}, []*sim.Result{res}, opt)
	if err != nil {
		return nil, err
	}
	return out[0], nil
}

// AtPeaks replays src, the trace that each of rs is the result of, against
// each of cfgs, the configs that gave rs, in one pass (one decoding of
// the trace), each up to the end of its peak event
// (sim.Result.PeakReservedEvent), and returns the memory at each peak by
// site, in the order of cfgs. The configs' Observers are replaced. It
// returns an error when the trace ends before a peak, when a replay fails,
// or when a second replay does not reach the first's peak (a replay that
// is not deterministic).
func AtPeaks(src trace.Source, cfgs []sim.Config, rs []*sim.Result, opt Options) ([]*sim.SitesAtPeak, error) {
	opt.Depth = max(opt.Depth, 1)
	out := make([]*sim.SitesAtPeak, len(cfgs))
	type pending struct {
		k   int // the index in cfgs
		rec *viz.Recorder
		rep *sim.Replay
	}
	var todo []pending
	var run []sim.Config
	last := int64(-1)
	for k, res := range rs {
		out[k] = &sim.SitesAtPeak{Event: res.PeakReservedEvent, Reserved: res.PeakReserved, Depth: opt.Depth, Sites: []sim.SiteBytes{}}
		if res.PeakReserved == 0 {
			out[k].Event = -1
			continue
		}
		cfg := cfgs[k]
		rec := viz.NewRecorder(nil, nil)
		cfg.Observer = rec
		todo, run = append(todo, pending{k: k, rec: rec}), append(run, cfg)
		last = max(last, res.PeakReservedEvent)
	}
	if len(todo) == 0 {
		return out, nil
	}
	reps, src, err := sim.Prepare(src, run...)
	if err != nil {
		return nil, err
	}
	for n := range todo {
		todo[n].rep = reps[n]
	}
	for i := int64(0); i <= last; i++ {
		ev, err := src.Next()
		if err == io.EOF {
			return nil, fmt.Errorf("sites: the trace ends at event %d, before a peak at event %d", i, last)
		}
		if err != nil {
			return nil, err
		}
		for _, p := range todo {
			res := rs[p.k]
			if i > res.PeakReservedEvent {
				continue
			}
			if err := p.rep.Step(i, ev); err != nil {
				return nil, fmt.Errorf("policy %s: %w", cfgs[p.k].Policy, err)
			}
			if i == res.PeakReservedEvent {
				out[p.k].Time = ev.Time
				if err := atPeak(out[p.k], p.rec, trace.StacksOf(src), ev, cfgs[p.k].Policy, res, opt); err != nil {
					return nil, err
				}
			}
		}
	}
	return out, nil
}

// atPeak fills out with the memory by site that rec holds at the end of
// ev, the peak event of res (policy's), the sites named from st.
func atPeak(out *sim.SitesAtPeak, rec *viz.Recorder, st *trace.Stacks, ev trace.Event, policy string, res *sim.Result, opt Options) error {
	live, err := rec.Live()
	if err != nil {
		return err
	}
	var inSegs uint64
	for _, s := range live {
		inSegs += s.Size
	}
	var instant uint64
	switch {
	case inSegs == res.PeakReserved:
	case ev.Op == trace.OpMallocFailed && inSegs < res.PeakReserved:
		// The peak was an instant within the event: a malloc that failed
		// in the recording, which the policy served and gave back at once
		// (sim.Result.SourceOOMsServed), with the segment it took.
		instant = res.PeakReserved - inSegs
	default:
		return fmt.Errorf("sites: policy %s: the segments at event %d hold %d bytes, the replay reserved %d at its peak", policy, res.PeakReservedEvent, inSegs, res.PeakReserved)
	}
	out.Sites = Rows(live, st, opt)
	if instant > 0 {
		row := sim.SiteBytes{Site: FailedMalloc, LiveBytes: min(ev.Size, instant), Count: 1}
		row.UnusedBytes = instant - row.LiveBytes
		out.Sites = append(out.Sites, row)
	}
	return nil
}

// Rows returns the memory of the live segments segs by site (see the
// package doc), the sites' names from st at opt.Depth, most bytes first.
func Rows(segs []viz.LiveSegment, st *trace.Stacks, opt Options) []sim.SiteBytes {
	opt.Depth = max(opt.Depth, 1)
	type key struct {
		stack uint32
		label string
	}
	names := map[key]string{}
	nameOf := func(b viz.LiveBlock) string {
		k := key{b.Stack, b.Label}
		n, ok := names[k]
		if !ok {
			n = Name(st.Frames(b.Stack), b.Label, opt.Depth)
			names[k] = n
		}
		return n
	}
	rows := map[string]*sim.SiteBytes{}
	row := func(site string) *sim.SiteBytes {
		r := rows[site]
		if r == nil {
			r = &sim.SiteBytes{Site: site}
			rows[site] = r
		}
		return r
	}
	type share struct {
		site string
		live uint64
	}
	for _, s := range segs {
		var shares []share
		var liveBytes uint64
		for _, b := range s.Blocks {
			if b.Pending {
				continue
			}
			site := nameOf(b)
			r := row(site)
			r.LiveBytes += b.Requested
			r.Count++
			liveBytes += b.Requested
			found := false
			for k := range shares {
				if shares[k].site == site {
					shares[k].live += b.Requested
					found = true
				}
			}
			if !found {
				shares = append(shares, share{site, b.Requested})
			}
		}
		if liveBytes == 0 || liveBytes > s.Size {
			// No live block (or, never from a policy, more requested
			// than the segment holds): the segment is cached memory.
			if liveBytes == 0 {
				row(Cached).UnusedBytes += s.Size
			}
			continue
		}
		unused := s.Size - liveBytes
		var given uint64
		most := 0
		for k, sh := range shares {
			// unused * live / liveBytes without overflow.
			hi, lo := bits.Mul64(unused, sh.live)
			q, _ := bits.Div64(hi, lo, liveBytes)
			row(sh.site).UnusedBytes += q
			given += q
			if sh.live > shares[most].live || sh.live == shares[most].live && sh.site < shares[most].site {
				most = k
			}
		}
		row(shares[most].site).UnusedBytes += unused - given
	}
	out := make([]sim.SiteBytes, 0, len(rows))
	for _, r := range rows {
		out = append(out, *r)
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i].LiveBytes+out[i].UnusedBytes, out[j].LiveBytes+out[j].UnusedBytes
		if a != b {
			return a > b
		}
		return out[i].Site < out[j].Site
	})
	if opt.Top > 0 && len(out) > opt.Top+1 {
		rest := sim.SiteBytes{Site: fmt.Sprintf("(%d other sites)", len(out)-opt.Top)}
		for _, r := range out[opt.Top:] {
			rest.LiveBytes += r.LiveBytes
			rest.Count += r.Count
			rest.UnusedBytes += r.UnusedBytes
		}
		out = append(out[:opt.Top], rest)
	}
	return out
}

// Name returns the site of a malloc with call stack frames (innermost
// first) and call site label, depth frames of it (see the package doc).
func Name(frames []trace.Frame, label string, depth int) string {
	if len(frames) == 0 {
		if label != "" {
			return label
		}
		return NoStack
	}
	var picked []string
	for _, f := range frames {
		if !User(f) {
			continue
		}
		picked = append(picked, f.String())
		if len(picked) == depth {
			break
		}
	}
	if len(picked) == 0 {
		// No user code: the innermost Python frame (PyTorch's, Python's),
		// else none that names code a reader would look for (the innermost
		// of a C++-only stack is the unwinder, torch::unwind::unwind()).
		for _, f := range frames {
			if f.File != "" && f.File != "??" && !cFile(f.File) {
				return f.String()
			}
		}
		return CppOnly
	}
	return strings.Join(picked, " < ")
}

// User reports whether frame f is of user code by the package doc's rule:
// not PyTorch's, Python's, or C and C++ code.
func User(f trace.Frame) bool {
	file := f.File
	switch {
	case file == "" || file == "??":
		return false
	case strings.HasPrefix(file, "torch/") || strings.Contains(file, "/torch/"):
		return false
	case strings.HasPrefix(file, "<frozen"):
		return false
	case (strings.HasPrefix(file, "lib/python") || strings.Contains(file, "/lib/python")) &&
		!strings.Contains(file, "site-packages/") && !strings.Contains(file, "dist-packages/"):
		return false
	}
	return !cFile(file)
}

// cFile reports whether file is C or C++ (or CUDA) source by its extension.
func cFile(file string) bool {
	for _, ext := range []string{".c", ".cc", ".cpp", ".cxx", ".h", ".hpp", ".cu", ".cuh"} {
		if strings.HasSuffix(file, ext) {
			return true
		}
	}
	return false
}

// AddFile gives each of rs, the results of cfgs on the trace at path,
// its memory at the peak by allocation site (AtPeaks): a second replay
// of each up to its peak event, all in one pass over the trace.
func AddFile(path string, opts tracefile.Options, cfgs []sim.Config, rs []*sim.Result, opt Options) error {
	f, err := tracefile.Open(path, opts)
	if err != nil {
		return err
	}
	defer f.Close()
	ss, err := AtPeaks(f, cfgs, rs, opt)
	if err != nil {
		return tracefile.NameError(path, fmt.Errorf("--sites: %w", err))
	}
	for k, r := range rs {
		r.Sites = ss[k]
	}
	return nil
}

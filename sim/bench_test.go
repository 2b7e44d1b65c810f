package sim_test

import (
	"compress/gzip"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpualloc/allocsim/internal/benchline"
	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/trace"
	"github.com/gpualloc/allocsim/trace/pytorch"
	"github.com/gpualloc/allocsim/trace/synth"
)

// The benchmarks of `make bench`. Besides Go's benchmark output they print,
// after the run, one line per measurement in the form
//
//	BENCH trace=NAME stage=import seconds=S
//	BENCH trace=NAME stage=decode seconds=S events=N
//	BENCH trace=NAME stage=replay policy=P seconds=S events=N
//	BENCH trace=NAME stage=file bytes=B events=N
//
// where seconds are per run of the stage over the whole trace (the last
// b.N round's average). The traces: kv_decode (the largest real snapshot,
// imported once to the native format) and synth10M, a synthetic trace of
// 10 million events (RMM's random_allocations pattern).

var synthEvents = flag.Int("bench.synth", 10_000_000, "events in the synthetic benchmark trace")

// benchReport keeps a BENCH line, printed by TestMain after the run.
func benchReport(key, line string) { benchline.Report(key, line) }

func TestMain(m *testing.M) {
	code := m.Run()
	for _, bt := range benchOnce {
		os.RemoveAll(filepath.Dir(bt.file)) // the native trace files, ~150 MB for synth10M
	}
	benchline.Print(os.Stdout)
	os.Exit(code)
}

// benchTrace is a trace held as a native file and as decoded events.
type benchTrace struct {
	name string
	file string
	evs  []trace.Event
	h    trace.Header
}

var (
	benchOnce   = map[string]*benchTrace{}
	benchOnceMu sync.Mutex
)

// loadBenchTrace writes src to a native file in a temporary directory and
// decodes it into memory, once per name.
func loadBenchTrace(b *testing.B, name string, open func() (trace.Source, error)) *benchTrace {
	benchOnceMu.Lock()
	defer benchOnceMu.Unlock()
	if bt, ok := benchOnce[name]; ok {
		return bt
	}
	src, err := open()
	if err != nil {
		b.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "allocsim-bench")
	if err != nil {
		b.Fatal(err)
	}
	bt := &benchTrace{name: name, file: filepath.Join(dir, name+".trace"), h: src.Header()}
	f, err := os.Create(bt.file)
	if err != nil {
		b.Fatal(err)
	}
	w, err := trace.NewWriter(f, src.Header())
	if err != nil {
		b.Fatal(err)
	}
	for {
		ev, err := src.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			b.Fatal(err)
		}
		if err := w.Write(ev); err != nil {
			b.Fatal(err)
		}
		bt.evs = append(bt.evs, ev)
	}
	if err := w.Close(); err != nil {
		b.Fatal(err)
	}
	if err := f.Close(); err != nil {
		b.Fatal(err)
	}
	st, _ := os.Stat(bt.file)
	benchReport(name+" 0file", fmt.Sprintf("BENCH trace=%s stage=file bytes=%d events=%d", name, st.Size(), len(bt.evs)))
	benchOnce[name] = bt
	return bt
}

func kvDecodePath(b *testing.B) string {
	p, _ := ptFind("pytorch/kv_decode")
	if p == "" {
		b.Skip("kv_decode.pickle.gz not found (set ALLOCSIM_TRACES to the trace collection)")
	}
	return p
}

// benchTraces returns kv_decode, when the trace collection is found, and
// the synthetic trace.
func benchTraces(b *testing.B) []*benchTrace {
	var out []*benchTrace
	if kv, _ := ptFind("pytorch/kv_decode"); kv != "" {
		out = append(out, kvDecodeTrace(b, kv))
	}
	return append(out, loadBenchTrace(b, synthName(), func() (trace.Source, error) {
		return synth.New("random", 1, map[string]string{
			"allocations": fmt.Sprint(*synthEvents / 2), "max-size": "8MiB", "streams": "2",
		})
	}))
}

// synthName names the synthetic trace by its events: synth10M by default.
func synthName() string {
	if n := *synthEvents; n%1_000_000 == 0 {
		return fmt.Sprintf("synth%dM", n/1_000_000)
	}
	return fmt.Sprintf("synth%d", *synthEvents)
}

func kvDecodeTrace(b *testing.B, kv string) *benchTrace {
	return loadBenchTrace(b, "kv_decode", func() (trace.Source, error) {
		f, err := os.Open(kv) // left to the end of the test binary: Import reads it as it goes
		if err != nil {
			return nil, err
		}
		return pytorch.Import(f, kv, pytorch.Options{})
	})
}

// BenchmarkImport measures importing the kv_decode snapshot, pickle to
// events, without writing them, and then (compareImport) the same import
// and CPython's pickle.load side by side, each in a process of its own:
// of the gzip file (both gunzip it: input=gz) and of its pickle
// decompressed beforehand (input=pickle).
func BenchmarkImport(b *testing.B) {
	kv := kvDecodePath(b)
	b.ReportAllocs()
	var n int
	for i := 0; i < b.N; i++ {
		f, err := os.Open(kv)
		if err != nil {
			b.Fatal(err)
		}
		src, err := pytorch.Import(f, kv, pytorch.Options{})
		if err != nil {
			b.Fatal(err)
		}
		n = drain(b, src)
		f.Close()
	}
	sec := b.Elapsed().Seconds() / float64(b.N)
	benchReport("kv_decode 1import", fmt.Sprintf("BENCH trace=kv_decode stage=import seconds=%.4f", sec))
	b.ReportMetric(float64(n)/sec, "events/s")
	kvOnce.Do(func() {
		// Like with like: both gunzip the file, then both read the
		// same pickle decompressed beforehand.
		compareImport(b, "kv_decode", kv, true)
		plain := filepath.Join(b.TempDir(), "kv_decode.pickle")
		if err := gunzipTo(plain, kv); err != nil {
			b.Fatal(err)
		}
		compareImport(b, "kv_decode", plain, false)
	})
}

var kvOnce sync.Once

// gunzipTo writes the decompressed content of the gzip file src to dst.
func gunzipTo(dst, src string) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return err
	}
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, zr); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func drain(b *testing.B, src trace.Source) int {
	n := 0
	for {
		_, err := src.Next()
		if err == io.EOF {
			return n
		}
		if err != nil {
			b.Fatal(err)
		}
		n++
	}
}

// BenchmarkDecode measures reading the native trace file, no replay.
func BenchmarkDecode(b *testing.B) {
	for _, bt := range benchTraces(b) {
		b.Run(bt.name, func(b *testing.B) {
			var n int
			for i := 0; i < b.N; i++ {
				f, err := os.Open(bt.file)
				if err != nil {
					b.Fatal(err)
				}
				r, err := trace.NewReader(f, bt.file)
				if err != nil {
					b.Fatal(err)
				}
				n = drain(b, r)
				f.Close()
			}
			sec := b.Elapsed().Seconds() / float64(b.N)
			benchReport(bt.name+" 2decode", fmt.Sprintf("BENCH trace=%s stage=decode seconds=%.4f events=%d", bt.name, sec, n))
			b.ReportMetric(float64(n)/sec, "events/s")
		})
	}
}

// BenchmarkReplay measures the replay loop alone over events already
// decoded in memory, for every policy.
func BenchmarkReplay(b *testing.B) {
	for _, bt := range benchTraces(b) {
		for _, p := range policies.Names() {
			if bt.name != "kv_decode" && isPlanner(p) {
				// A clairvoyant placement holds the whole trace and searches
				// over it: not a replay loop to time on 10M events.
				continue
			}
			b.Run(bt.name+"/"+p, func(b *testing.B) {
				b.ReportAllocs()
				for i := 0; i < b.N; i++ {
					if _, err := sim.Run(trace.NewSliceSource(bt.h, bt.evs), sim.Config{Trace: bt.name, Policy: p}); err != nil {
						b.Fatal(err)
					}
				}
				sec := b.Elapsed().Seconds() / float64(b.N)
				benchReport(bt.name+" 3replay "+p, fmt.Sprintf("BENCH trace=%s stage=replay policy=%s seconds=%.4f events=%d", bt.name, p, sec, len(bt.evs)))
				b.ReportMetric(float64(len(bt.evs))/sec, "events/s")
			})
		}
	}
}

// isPlanner reports whether the policy called name must see the whole
// trace first (policies.Planner).
func isPlanner(name string) bool {
	in, ok := policies.Lookup(name)
	return ok && in.Abilities.Planner
}

// BenchmarkReplayMallocFree replays only the malloc and free events of
// kv_decode against the pytorch policy: the 482006 events that a port
// of the allocator replaying a list of malloc/free calls loops over, for a
// comparison loop against loop (trace=kv_decode-mallocfree).
func BenchmarkReplayMallocFree(b *testing.B) {
	bt := kvDecodeTrace(b, kvDecodePath(b))
	evs := mallocsAndFrees(bt.evs)
	b.ReportAllocs()
	b.ResetTimer() // the filtering above is not the loop
	for i := 0; i < b.N; i++ {
		if _, err := sim.Run(trace.NewSliceSource(bt.h, evs), sim.Config{Trace: bt.name, Policy: "pytorch"}); err != nil {
			b.Fatal(err)
		}
	}
	sec := b.Elapsed().Seconds() / float64(b.N)
	benchReport("kv_decode-mallocfree 3replay pytorch", fmt.Sprintf("BENCH trace=kv_decode-mallocfree stage=replay policy=pytorch seconds=%.4f events=%d", sec, len(evs)))
	b.ReportMetric(float64(len(evs))/sec, "events/s")
	dynaPipeOnce.Do(func() {
		want := pytorchReplay(b, bt.h, evs)
		theirs := dynaPipeLoop(b, evs, want)
		if theirs == nil {
			return
		}
		loop := policyLoop(b, evs, want, loopAddrs)
		handleLoop := policyLoop(b, evs, want, loopHandles)
		liveLoop := policyLoop(b, evs, want, loopLive)
		replay := func() {
			if _, err := sim.Run(trace.NewSliceSource(bt.h, evs), sim.Config{Trace: bt.name, Policy: "pytorch"}); err != nil {
				b.Fatal(err)
			}
		}
		// Rounds of one pass of theirs, then ours for a second or more
		// (the loop, the loop through handles, with the live table, then
		// the whole replay): this machine's speed drifts by a third within
		// minutes, for Python and Go alike, so a ratio is of figures taken
		// seconds apart, and the median of the rounds' is reported with
		// the least and the most. The loop through handles is the policy's
		// part of the replay: its ratio is the most the whole replay could
		// reach with an engine that cost nothing; the live table's loop
		// adds the engine's lookup by address.
		const rounds = 5
		var ns, loopNs, handleNs, liveNs, replayNs, ratio, handleRatio, replayRatio []float64
		for range rounds {
			t := theirs()
			l := timeLoop(len(evs), loop)
			h := timeLoop(len(evs), handleLoop)
			lv := timeLoop(len(evs), liveLoop)
			r := timeLoop(len(evs), replay)
			ns, loopNs, handleNs, liveNs, replayNs = append(ns, t), append(loopNs, l), append(handleNs, h), append(liveNs, lv), append(replayNs, r)
			ratio, handleRatio, replayRatio = append(ratio, t/l), append(handleRatio, t/h), append(replayRatio, t/r)
		}
		benchReport("kv_decode-mallocfree 4dynapipe", fmt.Sprintf("BENCH trace=kv_decode-mallocfree stage=loop impl=dynapipe rounds=%d ns_per_op=%.0f policy_loop_ns_per_op=%.1f ratio=%.1f ratio_min=%.1f ratio_max=%.1f handle_loop_ns_per_op=%.1f handle_ratio=%.1f live_loop_ns_per_op=%.1f replay_ns_per_op=%.1f replay_ratio=%.1f replay_ratio_min=%.1f replay_ratio_max=%.1f",
			rounds, median(ns), median(loopNs), median(ratio), slices.Min(ratio), slices.Max(ratio), median(handleNs), median(handleRatio), median(liveNs), median(replayNs), median(replayRatio), slices.Min(replayRatio), slices.Max(replayRatio)))
	})
}

// median returns the middle of xs, of odd length.
func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// The loops of policyLoop, from the policy's calls alone to the part of
// the replay that is the policy and its live table.
const (
	loopAddrs   = iota // Malloc and Free, the free given its malloc's block by index
	loopHandles        // MallocHandle and FreeHandle, the calls the replay makes
	loopLive           // loopHandles with each handle kept in a live table by address
)

// policyLoop returns the loop that loop.py times, in Go (loopAddrs): the
// pytorch policy's Malloc and Free called straight on the same mallocs and
// frees (a free given the block of its malloc by the malloc's index, as
// loop.py gives DynaPipe's free its block), on a simulated device, one
// pass a call. The replay (sim.Run) does more per event than that loop:
// the live table by address, the peaks, series and fragmentation, the
// cost model's clock and the trace's checks. loopHandles calls
// MallocHandle and FreeHandle instead, the calls the replay makes (the
// policy's own table of blocks by address left out): what the policy
// costs inside the whole replay, the least the replay can take. loopLive
// finds each free's handle as the replay does on one core, in a
// trace.AddrMap by the event's address whose values are the size of the
// replay's (32 bytes): the policy and the live table, without the rest of
// the engine. (On more cores, sim.Run on events in memory makes those
// lookups on a goroutine of their own, ahead of the replay: sim's
// live.go.) A pass
// fails the benchmark if its peak reserved bytes or device allocations
// differ from want's, the replay's (pytorchReplay).
func policyLoop(b *testing.B, evs []trace.Event, want *sim.Result, mode int) func() {
	type op struct {
		size uint64
		of   int // the malloc freed, -1 for a malloc
	}
	ops := make([]op, len(evs))
	slot := map[uint64]int{}
	for k, ev := range evs {
		if ev.Op == trace.OpMalloc {
			slot[ev.Addr] = k
			ops[k] = op{ev.Size, -1}
		} else {
			ops[k] = op{0, slot[ev.Addr]}
		}
	}
	blocks := make([]policies.Block, len(ops))
	hs := make([]uint64, len(ops))
	type live struct{ h, size, requested, event uint64 } // as the replay's liveAlloc
	return func() {
		dev := sim.NewDevice(0)
		p, err := policies.NewPyTorch(dev, nil)
		if err != nil {
			b.Fatal(err)
		}
		switch mode {
		case loopAddrs:
			for k, o := range ops {
				if o.of < 0 {
					blocks[k], err = p.Malloc(o.size, 0)
				} else {
					err = p.Free(blocks[o.of].Addr, 0)
				}
				if err != nil {
					b.Fatalf("op %d: %v", k, err)
				}
			}
		case loopHandles:
			for k, o := range ops {
				if o.of < 0 {
					_, hs[k], err = p.MallocHandle(o.size, 0)
				} else {
					err = p.FreeHandle(hs[o.of], 0, false)
				}
				if err != nil {
					b.Fatalf("op %d: %v", k, err)
				}
			}
		case loopLive:
			var table trace.AddrMap[live]
			for k := range evs {
				ev := &evs[k]
				if ev.Op == trace.OpMalloc {
					a, dup := table.Ref(ev.Addr)
					if dup {
						b.Fatalf("op %d: malloc of live %#x", k, ev.Addr)
					}
					var blk policies.Block
					blk, a.h, err = p.MallocHandle(ev.Size, ev.Stream)
					a.size, a.requested, a.event = blk.Size, ev.Size, uint64(k)
				} else {
					a, ok := table.Take(ev.Addr)
					if !ok {
						b.Fatalf("op %d: free of %#x, not live", k, ev.Addr)
					}
					err = p.FreeHandle(a.h, ev.Stream, false)
				}
				if err != nil {
					b.Fatalf("op %d: %v", k, err)
				}
			}
		}
		if dev.PeakReserved() != want.PeakReserved || dev.Allocs() != want.DeviceAllocs {
			b.Fatalf("policy loop (mode %d): peak reserved %d, %d device allocations; replay %d, %d", mode, dev.PeakReserved(), dev.Allocs(), want.PeakReserved, want.DeviceAllocs)
		}
	}
}

// timeLoop times loop, a pass over ops operations, in nanoseconds per
// op: the pass repeated for at least a second (one pass of loop.py takes
// seconds, one of ours tens of milliseconds: a run as long as theirs, not
// the luckiest few milliseconds), after a collection, so that garbage of
// what ran before is not collected during it.
func timeLoop(ops int, loop func()) float64 {
	runtime.GC()
	start := time.Now()
	n := 0
	for n == 0 || time.Since(start) < time.Second {
		loop()
		n++
	}
	return float64(time.Since(start).Nanoseconds()) / float64(n*ops)
}

// bestOf3 is the least of 3 timeLoops.
func bestOf3(ops int, loop func()) float64 {
	return min(timeLoop(ops, loop), timeLoop(ops, loop), timeLoop(ops, loop))
}

// pytorchReplay replays evs with the pytorch policy, for the figures the
// loops must reach.
func pytorchReplay(b *testing.B, h trace.Header, evs []trace.Event) *sim.Result {
	rs, err := sim.Run(trace.NewSliceSource(h, evs), sim.Config{Policy: "pytorch"})
	if err != nil {
		b.Fatal(err)
	}
	return rs[0]
}

// mallocsAndFrees returns the malloc and free events of evs, in order:
// what a port of the allocator replaying a list of calls loops over.
func mallocsAndFrees(evs []trace.Event) []trace.Event {
	var out []trace.Event
	for _, ev := range evs {
		if ev.Op == trace.OpMalloc || ev.Op == trace.OpFree {
			out = append(out, ev)
		}
	}
	return out
}

// BenchmarkPolicyLoop times policyLoop, the pytorch policy's calls alone on
// kv_decode's mallocs and frees (trace=kv_decode-mallocfree
// stage=policy-loop).
func BenchmarkPolicyLoop(b *testing.B) {
	bt := kvDecodeTrace(b, kvDecodePath(b))
	evs := mallocsAndFrees(bt.evs)
	loop := policyLoop(b, evs, pytorchReplay(b, bt.h, evs), loopAddrs)
	b.ResetTimer()
	var ns float64
	for i := 0; i < b.N; i++ {
		ns = bestOf3(len(evs), loop)
	}
	benchReport("kv_decode-mallocfree 3policy-loop", fmt.Sprintf("BENCH trace=kv_decode-mallocfree stage=policy-loop policy=pytorch ns_per_op=%.1f events=%d", ns, len(evs)))
}

var dynaPipeOnce sync.Once

// dynaPipeLoop returns a function that times one pass of DynaPipe's
// Python port of PyTorch's caching allocator (TorchCachingAllocatorSimulator
// in its dynapipe/memory_opt/allocation_simulator.py) over the same
// mallocs and frees, with testdata/dynapipe/loop.py, from the checkout
// that $DYNAPIPE names, in nanoseconds per op, for
// BenchmarkReplayMallocFree's loop-against-loop ratio:
//
//	BENCH trace=kv_decode-mallocfree stage=loop impl=dynapipe rounds=5 ns_per_op=N policy_loop_ns_per_op=M ratio=R ratio_min=R0 ratio_max=R1 handle_loop_ns_per_op=H handle_ratio=HR live_loop_ns_per_op=L replay_ns_per_op=P replay_ratio=Q replay_ratio_min=Q0 replay_ratio_max=Q1
//
// ratio is loop against loop: loop.py's against policyLoop's, the same
// calls in Go; handle_ratio is loop.py's against policyLoop's through
// handles (the policy's part of the replay, so the most replay_ratio could
// be); live_loop_ns_per_op is that loop's with the replay's lookup of each
// free's handle by address (the engine's live table) added; replay_ratio
// is loop.py's against the whole replay's; each the median of 5 rounds,
// a pass of theirs and then a second or more of ours, with the least and
// the most.
//
// A pass fails the benchmark if the port's peak reserved bytes or device
// mallocs differ from the pytorch policy's (they agree on kv_decode). It
// says so in a BENCH line and returns nil when $DYNAPIPE is not set.
func dynaPipeLoop(b *testing.B, evs []trace.Event, want *sim.Result) func() float64 {
	root := os.Getenv("DYNAPIPE")
	if root == "" {
		benchReport("kv_decode-mallocfree 4dynapipe", "BENCH trace=kv_decode-mallocfree stage=loop impl=dynapipe skipped=\"set DYNAPIPE to a checkout of github.com/awslabs/optimizing-multitask-training-through-dynamic-pipelines\"")
		return nil
	}
	var ops strings.Builder
	slot := map[uint64]int{}
	for k, ev := range evs {
		switch {
		case ev.Op == trace.OpMalloc && ev.Stream == 0:
			slot[ev.Addr] = k
			fmt.Fprintf(&ops, "m %d\n", ev.Size)
		case ev.Op == trace.OpFree && ev.Stream == 0:
			fmt.Fprintf(&ops, "f %d\n", slot[ev.Addr])
		default:
			b.Fatalf("event %d: %v on stream %d: loop.py replays mallocs and frees on the default stream", k, ev.Op, ev.Stream)
		}
	}
	opsFile := filepath.Join(b.TempDir(), "ops.txt")
	if err := os.WriteFile(opsFile, []byte(ops.String()), 0o644); err != nil {
		b.Fatal(err)
	}
	return func() float64 {
		out, err := exec.Command("python3", filepath.Join("testdata", "dynapipe", "loop.py"),
			filepath.Join(root, "dynapipe", "memory_opt", "allocation_simulator.py"), opsFile, "1").Output()
		if err != nil {
			b.Fatalf("DynaPipe loop: %v", err)
		}
		var got struct {
			Ops           int     `json:"ops"`
			NsPerOp       float64 `json:"ns_per_op"`
			PeakReserved  uint64  `json:"peak_reserved"`
			DeviceMallocs int64   `json:"device_mallocs"`
		}
		if err := json.Unmarshal(out, &got); err != nil {
			b.Fatalf("DynaPipe loop printed %q: %v", out, err)
		}
		if got.Ops != len(evs) || got.PeakReserved != want.PeakReserved || got.DeviceMallocs != want.DeviceAllocs {
			b.Fatalf("DynaPipe's port: %d ops, peak reserved %d, %d device mallocs; pytorch policy: %d, %d, %d", got.Ops, got.PeakReserved, got.DeviceMallocs, len(evs), want.PeakReserved, want.DeviceAllocs)
		}
		return got.NsPerOp
	}
}

package sim

import (
	"bufio"
	_ "embed"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/gpualloc/allocsim/trace"
)

// defaultCostCSV is a copy of shared/reference/h200_cuda_latency.csv: the
// CUDA runtime's call latencies measured on an NVIDIA H200 (CUDA 13.0).
//
//go:embed h200_cuda_latency.csv
var defaultCostCSV string

// defaultWakeCSV holds the wake-up curves of the embedded model (the
// CostWake rows), which the reference measurement lacks: measured by
// `replay calibrate` on an NVIDIA H200 (CUDA 13.0, driver 580.159), 7
// rounds at each idle time, on 2026-11-29.
//
//go:embed h200_wake.csv
var defaultWakeCSV string

// DefaultCostModelName names the embedded cost model in results and errors.
const DefaultCostModelName = "h200 (embedded)"

// Cost model rows, by the api column of the CSV.
const (
	// CostMalloc and CostFree are a cudaMalloc that maps memory of its own
	// and a cudaFree that unmaps it, by size (the device synchronization
	// of cudaFree on an idle device included).
	CostMalloc = "cudaMalloc"
	CostFree   = "cudaFree"
	// CostMallocSuballoc and CostFreeSuballoc are a small cudaMalloc that
	// the driver places in a 2 MiB page already mapped, and a cudaFree
	// that leaves its page mapped. When a model lacks them they are taken
	// from the CostMallocBatch and CostFreeBatch rows up to 64 KiB, where
	// the whole batch shares a page.
	CostMallocSuballoc = "cudaMalloc_suballoc"
	CostFreeSuballoc   = "cudaFree_suballoc"
	// CostMallocNewPage and CostFreeLastInPage are a small cudaMalloc that
	// maps a new 2 MiB page, and the cudaFree that empties and unmaps it.
	// When a model lacks them, CostMalloc and CostFree are charged.
	CostMallocNewPage  = "cudaMalloc_newpage"
	CostFreeLastInPage = "cudaFree_lastinpage"
	// CostMallocBatch and CostFreeBatch are cudaMalloc and cudaFree with
	// 64 allocations of the size live at once: a cudaMalloc of fresh
	// memory, measured (by replay calibrate) with the CPU's caches cold, as
	// in a job, where other work runs between two such calls. A model
	// without them charges CostMalloc instead.
	CostMallocBatch = "cudaMalloc_batch"
	CostFreeBatch   = "cudaFree_batch"
	// CostWake and CostWakeSuballoc are the wake-up curves: the latency a
	// call adds when the driver has been idle, by the idle time. Their
	// size column holds the time since the previous cudaMalloc or cudaFree
	// returned, in nanoseconds, and the latency is the extra over a call
	// made back to back (measured on an H200: a 20 MiB cudaMalloc took
	// 55 us back to back and 280 us after 50 ms idle; a small one 3 us and
	// 48 us). CostWake is charged to calls that map or unmap memory,
	// CostWakeSuballoc to sub-allocations. CostWakeNext and
	// CostWakeSuballocNext are the extra of the call right after a woken
	// one, by the woken call's idle time: the driver is still slow (a
	// cudaFree right after a woken 20 MiB cudaMalloc: 120 us against 50).
	// A model without them charges no wake-up.
	CostWake             = "wake"
	CostWakeNext         = "wake_next"
	CostWakeSuballoc     = "wake_suballoc"
	CostWakeSuballocNext = "wake_suballoc_next"
)

// WakeGaps are the idle times in nanoseconds at which a calibration
// measures the wake-up curves: 0.1 ms to 200 ms. The curves are flat from
// about 50 ms on.
var WakeGaps = []int64{100e3, 200e3, 500e3, 1e6, 2e6, 5e6, 10e6, 20e6, 50e6, 100e6, 200e6}

// SubAllocMax is the largest request in bytes that the CUDA driver places
// inside a shared 2 MiB page (measured on an H200: a 1 MiB cudaMalloc came
// back 7680 bytes into a page holding smaller ones, a 2 MiB + 1 B one on a
// fresh 2 MiB boundary). SubAllocGranularity is the step of those
// placements in bytes.
const (
	SubAllocMax         = 1 << 20
	SubAllocGranularity = 512
	driverPageSize      = 2 << 20
)

// CostModel gives the latency in nanoseconds of the CUDA runtime's calls by
// call and size, from the median latencies of a table measured on one GPU
// (the format of shared/reference/h200_cuda_latency.csv, which is also what
// `replay calibrate` writes). Between measured sizes the latency is
// interpolated linearly in log(size) and log(latency); beyond them it
// follows the slope of the nearest two points, and never drops below the
// nearest point's latency. A CostModel is immutable and safe to share.
type CostModel struct {
	// Source names where the model came from: a file name or
	// DefaultCostModelName.
	Source string
	// Made says where and when the model was measured, from the comment
	// line ("# ...") replay calibrate writes first; "" for none.
	Made   string
	curves map[string][]costPoint
	// wake holds the wake-up curves (the CostWake rows) by row, each
	// sorted by idle time.
	wake map[string][]wakePoint
}

// Describe names the model for a table or a results file: its Source,
// and in parentheses where and when it was made, where it says so.
func (m *CostModel) Describe() string {
	if m.Made == "" {
		return m.Source
	}
	return m.Source + " (" + m.Made + ")"
}

// wakePoint is one point of a wake-up curve: after gap nanoseconds idle, a
// call takes ns nanoseconds more than back to back.
type wakePoint struct {
	gap float64 // idle nanoseconds
	ns  float64 // extra latency in nanoseconds, 0 or more
}

// isWakeRow reports whether api names a wake-up curve.
func isWakeRow(api string) bool {
	switch api {
	case CostWake, CostWakeNext, CostWakeSuballoc, CostWakeSuballocNext:
		return true
	}
	return false
}

// wakeExtra returns the extra latency in nanoseconds on the wake-up curve
// pts after gap nanoseconds idle, and whether the gap wakes the driver at
// all: 0 and false below the curve's smallest idle time, then linear in
// log(gap) between points, flat beyond the last.
func wakeExtra(pts []wakePoint, gap int64) (int64, bool) {
	if len(pts) == 0 || float64(gap) < pts[0].gap {
		return 0, false
	}
	x := float64(gap)
	i := sort.Search(len(pts), func(i int) bool { return pts[i].gap >= x })
	var ns float64
	switch {
	case i == len(pts):
		ns = pts[len(pts)-1].ns
	case pts[i].gap == x:
		ns = pts[i].ns
	default:
		a, b := pts[i-1], pts[i]
		t := math.Log(x/a.gap) / math.Log(b.gap/a.gap)
		ns = a.ns + t*(b.ns-a.ns)
	}
	return int64(math.Round(ns)), true
}

// Wake returns the extra latency in nanoseconds that the wake-up curve row
// (CostWake, CostWakeNext, CostWakeSuballoc or CostWakeSuballocNext)
// gives after gap nanoseconds idle, and false when the model lacks the row
// or the gap is below its smallest idle time.
func (m *CostModel) Wake(row string, gap int64) (int64, bool) {
	return wakeExtra(m.wake[row], gap)
}

// WithoutWake returns a copy of m that charges no wake-up: the model of
// calls made back to back, whatever the idle time between them.
func (m *CostModel) WithoutWake() *CostModel {
	return &CostModel{Source: m.Source, Made: m.Made, curves: m.curves}
}

type costPoint struct {
	size float64 // bytes
	ns   float64 // median latency
	// logSize and logNS are the natural logarithms of size and ns, kept
	// so that an interpolation takes one Log and one Exp.
	logSize, logNS float64
}

// newCostPoint returns the point of size bytes and ns nanoseconds.
func newCostPoint(size, ns float64) costPoint {
	return costPoint{size: size, ns: ns, logSize: math.Log(size), logNS: math.Log(ns)}
}

// CostError is an error in a cost model file, with its line (from 1).
type CostError struct {
	File string
	Line int
	Msg  string
}

func (e *CostError) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Msg)
	}
	return e.File + ": " + e.Msg
}

// ErrNoCostRow is wrapped by cost model errors that name a missing row.
var ErrNoCostRow = errors.New("cost model lacks a row")

// DefaultCostModel returns the cost model embedded in the binary, measured
// on an NVIDIA H200 with CUDA 13.0: the reference latencies and the
// wake-up curves.
func DefaultCostModel() *CostModel {
	_, wake, _ := strings.Cut(defaultWakeCSV, "\n") // the rows, after the same header
	m, err := ParseCostModel(strings.NewReader(defaultCostCSV+wake), DefaultCostModelName)
	if err != nil {
		panic("sim: embedded cost model: " + err.Error())
	}
	return m
}

// defaultCostModel is DefaultCostModel parsed once; the model is immutable.
var defaultCostModel = sync.OnceValue(DefaultCostModel)

// LoadCostModel reads the cost model in the file at path.
func LoadCostModel(path string) (*CostModel, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ParseCostModel(bufio.NewReader(f), path)
}

// ParseCostModel reads a cost model in CSV form, after an optional first
// line "# TEXT" that says where and when it was made (CostModel.Made): a
// header naming at least
// the columns api, size_bytes and median_us, then one row per call and size
// (other columns, such as n, first_us, p90_us and min_us, are ignored; a
// row whose median is empty is skipped). Where the file has a mean_us
// column (replay calibrate writes one) a row's mean, when given, is its
// latency instead of its median: the model sums latencies, and the mean
// is what a sum of calls takes per call. In the wake-up rows (CostWake and
// the like) size_bytes is an idle time in nanoseconds and the median the
// extra latency, which may be 0. name names the source in errors.
// It returns a *CostError for a malformed file, and one wrapping
// ErrNoCostRow when cudaMalloc or cudaFree rows are missing.
func ParseCostModel(r io.Reader, name string) (*CostModel, error) {
	// A first line "# TEXT" (replay calibrate's) says where and when the
	// model was made.
	br := bufio.NewReader(r)
	made := ""
	if b, err := br.Peek(1); err == nil && b[0] == '#' {
		line, err := br.ReadString('\n')
		if err != nil && err != io.EOF {
			return nil, &CostError{File: name, Line: 1, Msg: err.Error()}
		}
		made = strings.TrimSpace(strings.TrimPrefix(line, "#"))
	}
	hl := 1 // the header's line
	if made != "" {
		hl = 2
	}
	cr := csv.NewReader(br)
	cr.FieldsPerRecord = -1
	cr.TrimLeadingSpace = true
	head, err := cr.Read()
	if err != nil {
		return nil, &CostError{File: name, Line: hl, Msg: fmt.Sprintf("reading the header: %v", err)}
	}
	col := map[string]int{}
	for i, h := range head {
		col[strings.TrimSpace(h)] = i
	}
	for _, c := range []string{"api", "size_bytes", "median_us"} {
		if _, ok := col[c]; !ok {
			return nil, &CostError{File: name, Line: hl, Msg: fmt.Sprintf("no column %q in the header %q", c, strings.Join(head, ","))}
		}
	}
	m := &CostModel{Source: name, Made: made, curves: map[string][]costPoint{}, wake: map[string][]wakePoint{}}
	for line := hl + 1; ; line++ {
		rec, err := cr.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, &CostError{File: name, Line: line, Msg: err.Error()}
		}
		get := func(c string) string {
			if i := col[c]; i < len(rec) {
				return strings.TrimSpace(rec[i])
			}
			return ""
		}
		api, med := get("api"), get("median_us")
		if api == "" || med == "" {
			continue
		}
		which := "median_us"
		if _, has := col["mean_us"]; has && get("mean_us") != "" {
			mean := get("mean_us")
			med, which = mean, "mean_us"
		}
		size, err := strconv.ParseUint(get("size_bytes"), 10, 64)
		if err != nil {
			return nil, &CostError{File: name, Line: line, Msg: fmt.Sprintf("size_bytes %q: not an unsigned integer", get("size_bytes"))}
		}
		us, err := strconv.ParseFloat(med, 64)
		if err != nil || us < 0 || math.IsInf(us, 0) || math.IsNaN(us) {
			return nil, &CostError{File: name, Line: line, Msg: fmt.Sprintf("%s %q: not a latency", which, med)}
		}
		if us*1000 > maxCallNS {
			return nil, &CostError{File: name, Line: line, Msg: fmt.Sprintf("%s %q: more than an hour, not a call's latency", which, med)}
		}
		if isWakeRow(api) {
			if size == 0 {
				return nil, &CostError{File: name, Line: line, Msg: fmt.Sprintf("%s: idle time 0 (size_bytes holds the idle nanoseconds before the call)", api)}
			}
			m.wake[api] = append(m.wake[api], wakePoint{gap: float64(size), ns: us * 1000})
			continue
		}
		m.curves[api] = append(m.curves[api], newCostPoint(float64(max(size, 1)), max(us*1000, 1)))
	}
	for api, pts := range m.wake {
		m.wake[api] = lastPerKey(pts, func(p wakePoint) float64 { return p.gap })
	}
	for api, pts := range m.curves {
		m.curves[api] = lastPerKey(pts, func(p costPoint) float64 { return p.size })
	}
	for _, api := range []string{CostMalloc, CostFree} {
		if len(m.curves[api]) == 0 {
			return nil, &CostError{File: name, Msg: fmt.Sprintf("%v: %s", ErrNoCostRow, api)}
		}
	}
	for _, s := range [][2]string{{CostMallocSuballoc, CostMallocBatch}, {CostFreeSuballoc, CostFreeBatch}} {
		if len(m.curves[s[0]]) > 0 {
			continue
		}
		var pts []costPoint
		for _, p := range m.curves[s[1]] {
			if p.size <= 64<<10 {
				pts = append(pts, p)
			}
		}
		if len(pts) == 0 {
			return nil, &CostError{File: name, Msg: fmt.Sprintf("%v: %s (or %s up to 64 KiB)", ErrNoCostRow, s[0], s[1])}
		}
		m.curves[s[0]] = pts
	}
	return m, nil
}

// lastPerKey sorts pts by key, stably, and keeps one point per key: the
// last given.
func lastPerKey[P any](pts []P, key func(P) float64) []P {
	sort.SliceStable(pts, func(i, j int) bool { return key(pts[i]) < key(pts[j]) })
	out := pts[:0]
	for _, p := range pts {
		if len(out) > 0 && key(out[len(out)-1]) == key(p) {
			out[len(out)-1] = p
			continue
		}
		out = append(out, p)
	}
	return out
}

// Calls returns the names of the calls the model has rows for, sorted; the
// wake-up curves among them.
func (m *CostModel) Calls() []string {
	out := make([]string, 0, len(m.curves)+len(m.wake))
	for k := range m.curves {
		out = append(out, k)
	}
	for k := range m.wake {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Latency returns the modelled latency in nanoseconds of call on size
// bytes, and false when the model has no row for call.
func (m *CostModel) Latency(call string, size uint64) (int64, bool) {
	pts := m.curves[call]
	if len(pts) == 0 {
		return 0, false
	}
	return pointLatency(pts, size), true
}

// maxCallNS bounds one call's modelled latency: an hour, in nanoseconds.
const maxCallNS = 3600e9

// pointLatency returns the latency in nanoseconds of size bytes on the
// curve pts, which must not be empty: at most maxCallNS.
func pointLatency(pts []costPoint, size uint64) int64 {
	return int64(math.Round(min(interpolate(pts, float64(max(size, 1))), maxCallNS)))
}

// addNS returns a + b, nanoseconds that saturate instead of wrapping.
func addNS(a, b int64) int64 {
	if b > 0 && a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

func interpolate(pts []costPoint, x float64) float64 {
	if len(pts) == 1 {
		return pts[0].ns
	}
	i := sort.Search(len(pts), func(i int) bool { return pts[i].size >= x })
	switch {
	case i < len(pts) && pts[i].size == x:
		return pts[i].ns
	case i == 0:
		return pts[0].ns // below the smallest size: flat
	case i == len(pts):
		// Above the largest: the last slope, never falling and never
		// faster than linear in the size (a steep last segment would
		// make a large request cost years).
		i = len(pts) - 1
		a, b := pts[i-1], pts[i]
		slope := min((b.logNS-a.logNS)/(b.logSize-a.logSize), 1)
		return max(b.ns, math.Exp(b.logNS+slope*(math.Log(x)-b.logSize)))
	}
	return loglog(pts[i-1], pts[i], x)
}

func loglog(a, b costPoint, x float64) float64 {
	t := (math.Log(x) - a.logSize) / (b.logSize - a.logSize)
	return math.Exp(a.logNS + t*(b.logNS-a.logNS))
}

// costMeter charges the device calls of a simulated device to a cost
// model, following what the CUDA driver does (measured on an H200 by
// replaying PyTorch traces through cudaMalloc/cudaFree and reading back the
// addresses):
//
//   - Requests of up to SubAllocMax bytes are placed in 2 MiB pages, in
//     steps of SubAllocGranularity bytes, best fit: in the smallest free
//     hole of any mapped page that holds them, the lowest address first
//     (this placement predicted 89-99% of the driver's addresses). One
//     placed in a mapped page costs a sub-allocation (CostMallocSuballoc);
//     one that needs a new page maps it (CostMallocNewPage, else
//     CostMalloc). A free that leaves its page with live allocations costs
//     CostFreeSuballoc; the one that empties it unmaps the page
//     (CostFreeLastInPage, else CostFree).
//   - Larger requests map memory of their own: a cudaMalloc of a size that
//     was freed before and not yet taken again reuses that mapping, as the
//     driver hands the same address back (CostMalloc, measured by
//     cudaMalloc/cudaFree pairs); any other maps fresh memory
//     (CostMallocBatch, measured with many live, when the model has it).
//     Every free unmaps (CostFree).
//   - When the model has wake-up curves, a call made after the driver was
//     idle pays the extra latency of its idle time: the trace time since
//     the event of the previous call (CostWake for calls that map or
//     unmap, CostWakeSuballoc for sub-allocations). The call after a woken
//     one, when it is not woken itself, pays the _next curve of the woken
//     call's idle time. The first call of a replay pays none.
type costMeter struct {
	m     *CostModel
	lat   Latencies
	total int64
	woke  int64 // of total, the nanoseconds of wake-ups

	// The wake-up state: the trace time in nanoseconds of the current
	// event and of the previous call's, and the idle time of the previous
	// call when it was woken (-1 if not).
	now, last, wokenGap int64
	called              bool
	wakeCurves          [4][]wakePoint // wake, wake_next, suballoc, suballoc_next; all nil: no wake-ups
	waking              bool           // whether any curve is set

	pages  int                      // mapped pages of small allocations
	large  uint64                   // bytes the large allocations take: whole driver pages
	seq    uint64                   // pages mapped so far, the next page's seq
	holes  *holeIndex               // the pages' holes by length; nil until a small allocation
	placed trace.AddrMap[placement] // small segment address -> its place
	freed  freedSizes               // large sizes freed and not taken again

	// untimed makes charge charge nothing: the pages of a direct
	// allocation (Device.DirectAlloc) count, its call not.
	untimed bool

	kinds [numCharges]chargeKind        // how each kind of call is charged
	cache [costCacheSize]costCacheEntry // recent latencies of sizes the memos do not hold
}

// The kinds of call a costMeter charges: the call it is recorded as, and
// the model's row it is charged from (the call's own row when the model
// lacks that one).
const (
	chargeMallocReuse    = iota // a large cudaMalloc of a size freed before: CostMalloc
	chargeMallocFresh           // a large cudaMalloc of fresh memory: CostMallocBatch
	chargeMallocSuballoc        // a small cudaMalloc in a mapped page: CostMallocSuballoc
	chargeMallocNewPage         // a small cudaMalloc that maps a page: CostMallocNewPage
	chargeFree                  // a large cudaFree: CostFree
	chargeFreeSuballoc          // a small cudaFree that leaves its page mapped: CostFreeSuballoc
	chargeFreeLastInPage        // the small cudaFree that unmaps its page: CostFreeLastInPage
	numCharges
)

// chargeRows are the call and the row of each kind of charge.
var chargeRows = [numCharges]struct{ call, row string }{
	chargeMallocReuse:    {CostMalloc, CostMalloc},
	chargeMallocFresh:    {CostMalloc, CostMallocBatch},
	chargeMallocSuballoc: {CostMalloc, CostMallocSuballoc},
	chargeMallocNewPage:  {CostMalloc, CostMallocNewPage},
	chargeFree:           {CostFree, CostFree},
	chargeFreeSuballoc:   {CostFree, CostFreeSuballoc},
	chargeFreeLastInPage: {CostFree, CostFreeLastInPage},
}

// chargeKind is one kind of charge of a costMeter: the curve it is charged
// from and the latencies found on it so far, exact values of the model
// kept so that a size seen again is not interpolated again.
type chargeKind struct {
	call string
	pts  []costPoint // the row's curve, else the call's; nil: charged 0 ns
	// memo holds at k the latency in nanoseconds of (k+1) *
	// SubAllocGranularity bytes, 0 when not yet known: the sizes that
	// policies round to the driver's step, up to memoMaxSize bytes. It
	// grows as larger sizes come.
	memo []int64
	// hists are the meter's histograms of call by size class (noSize
	// last), once looked up.
	hists [numSizeClasses + 1]*histogram
}

// memoMaxSize is the largest size in bytes whose latency a chargeKind's
// memo holds: 16 MiB, 256 KiB of memo per kind at most.
const memoMaxSize = 16 << 20

// costCacheSize is the number of latencies a costMeter keeps of sizes not
// in the memos, so that the sizes a trace repeats are not interpolated
// again at every call.
const costCacheSize = 256

type costCacheEntry struct {
	size uint64
	ns   int64
	kind uint8
	used bool
}

// maxFreedSizes bounds the freed sizes a costMeter remembers for the
// driver's reuse of a mapping, so that its memory does not grow with the
// trace (a trace of random sizes rarely takes a size again).
const maxFreedSizes = 1 << 14

// freedSizes counts the frees of each large size not yet taken again by a
// malloc of that size, remembering at most maxFreedSizes sizes: the sizes
// that policies round to the driver's step, up to memoMaxSize bytes, in an
// array, others in a table.
type freedSizes struct {
	steps []int32 // at k: the count of (k+1) * SubAllocGranularity bytes; grows as needed
	other trace.AddrMap[int]
	sizes int // sizes with a count
}

// counter returns the count of size, nil when size has none and grow is
// false. With grow, an absent size gets a counter at 0 in the array.
func (f *freedSizes) counter(size uint64, grow bool) *int32 {
	k := int(size/SubAllocGranularity) - 1
	if k >= len(f.steps) {
		if !grow {
			return nil
		}
		n := min(max(2*len(f.steps), k+1, 1024), memoMaxSize/SubAllocGranularity)
		f.steps = append(f.steps, make([]int32, n-len(f.steps))...)
	}
	return &f.steps[k]
}

// inSteps reports whether size is counted in the array.
func inSteps(size uint64) bool {
	return size%SubAllocGranularity == 0 && size > 0 && size <= memoMaxSize
}

// add counts a free of size bytes, unless size has no count and
// maxFreedSizes sizes have one.
func (f *freedSizes) add(size uint64) {
	if inSteps(size) {
		if n := f.counter(size, false); n != nil && *n > 0 {
			*n++
		} else if f.sizes < maxFreedSizes {
			*f.counter(size, true) = 1
			f.sizes++
		}
		return
	}
	if n := f.other.Ptr(size); n != nil {
		*n++
	} else if f.sizes < maxFreedSizes {
		f.other.Put(size, 1)
		f.sizes++
	}
}

// take takes one free of size bytes, and reports whether there was one.
func (f *freedSizes) take(size uint64) bool {
	if inSteps(size) {
		n := f.counter(size, false)
		if n == nil || *n == 0 {
			return false
		}
		if *n--; *n == 0 {
			f.sizes--
		}
		return true
	}
	n := f.other.Ptr(size)
	if n == nil {
		return false
	}
	if *n--; *n == 0 {
		f.other.Delete(size)
		f.sizes--
	}
	return true
}

// driverPage is a 2 MiB page of the driver's sub-allocator: its free holes
// by offset, and its live allocations.
type driverPage struct {
	holes []hole
	live  int
	seq   uint64 // the page's rank in mapping order, older first
}

type hole struct{ off, len uint64 }

// holeIndex holds the holes of a costMeter's pages by length, so that the
// best fit is found without a pass over the pages: the shortest hole that
// holds the request, among those the one of the oldest page, then the one
// of lowest offset. Hole lengths and offsets are multiples of
// SubAllocGranularity.
type holeIndex struct {
	// buckets holds at k the holes of k * SubAllocGranularity bytes,
	// sorted by page seq and then offset.
	buckets [holeBuckets][]holeRef
	// nonEmpty has bit k set when buckets[k] holds a hole.
	nonEmpty [(holeBuckets + 63) / 64]uint64
}

// holeBuckets is the number of hole lengths: 0 to a whole page.
const holeBuckets = driverPageSize/SubAllocGranularity + 1

// holeRef is a hole of page, at offset off.
type holeRef struct {
	seq, off uint64 // page.seq, and the hole's offset in bytes
	page     *driverPage
}

func (a holeRef) less(b holeRef) bool { return a.seq < b.seq || a.seq == b.seq && a.off < b.off }

// add adds the hole at off of n bytes of page p.
func (x *holeIndex) add(p *driverPage, off, n uint64) {
	k := n / SubAllocGranularity
	ref := holeRef{p.seq, off, p}
	b := x.buckets[k]
	i := sort.Search(len(b), func(i int) bool { return ref.less(b[i]) })
	b = append(b, holeRef{})
	copy(b[i+1:], b[i:])
	b[i] = ref
	x.buckets[k] = b
	x.nonEmpty[k/64] |= 1 << (k % 64)
}

// remove removes the hole at off of n bytes of page p.
func (x *holeIndex) remove(p *driverPage, off, n uint64) {
	k := n / SubAllocGranularity
	ref := holeRef{p.seq, off, p}
	b := x.buckets[k]
	i := sort.Search(len(b), func(i int) bool { return !b[i].less(ref) })
	if i == len(b) || b[i] != ref {
		panic(fmt.Sprintf("sim: cost meter: no hole of %d bytes at %d of page %d", n, off, p.seq))
	}
	b = append(b[:i], b[i+1:]...)
	x.buckets[k] = b
	if len(b) == 0 {
		x.nonEmpty[k/64] &^= 1 << (k % 64)
	}
}

// best returns the best-fit hole for n bytes, and false when no hole holds
// them.
func (x *holeIndex) best(n uint64) (holeRef, bool) {
	k := (n + SubAllocGranularity - 1) / SubAllocGranularity
	if k >= holeBuckets {
		return holeRef{}, false
	}
	w := k / 64
	bitsLeft := x.nonEmpty[w] &^ (1<<(k%64) - 1)
	for bitsLeft == 0 {
		if w++; w == uint64(len(x.nonEmpty)) {
			return holeRef{}, false
		}
		bitsLeft = x.nonEmpty[w]
	}
	return x.buckets[w*64+uint64(bits.TrailingZeros64(bitsLeft))][0], true
}

type placement struct {
	page     *driverPage
	off, len uint64
}

func newCostMeter(m *CostModel) *costMeter {
	c := &costMeter{m: m, wokenGap: -1}
	for i, row := range [4]string{CostWake, CostWakeNext, CostWakeSuballoc, CostWakeSuballocNext} {
		c.wakeCurves[i] = m.wake[row]
		c.waking = c.waking || len(m.wake[row]) > 0
	}
	for k, cr := range chargeRows {
		pts := m.curves[cr.row]
		if len(pts) == 0 {
			pts = m.curves[cr.call]
		}
		c.kinds[k] = chargeKind{call: cr.call, pts: pts}
	}
	return c
}

// charge charges one call of kind k on size bytes (nothing while untimed).
func (c *costMeter) charge(k int, size uint64) {
	if c.untimed {
		return
	}
	ck := &c.kinds[k]
	ns := c.latency(k, ck, size)
	if c.waking {
		w := c.wake(k == chargeMallocSuballoc || k == chargeFreeSuballoc)
		c.woke = addNS(c.woke, w)
		ns = addNS(ns, w)
	}
	c.total = addNS(c.total, ns)
	class := sizeClass(size)
	if class == noSize {
		class = numSizeClasses
	}
	h := ck.hists[class]
	if h == nil {
		h = c.lat.hist(ck.call, class)
		ck.hists[class] = h
	}
	h.add(ns)
}

// wake returns the wake-up latency in nanoseconds of a call made at c.now,
// a sub-allocation or not, and notes the call.
func (c *costMeter) wake(suballoc bool) int64 {
	gap, first := c.now-c.last, !c.called
	c.called, c.last = true, c.now
	woken := c.wokenGap
	c.wokenGap = -1
	if first {
		return 0
	}
	curves := c.wakeCurves[0:2]
	if suballoc {
		curves = c.wakeCurves[2:4]
	}
	if ns, ok := wakeExtra(curves[0], gap); ok {
		c.wokenGap = gap
		return ns
	}
	if woken >= 0 {
		ns, _ := wakeExtra(curves[1], woken)
		return ns
	}
	return 0
}

// latency returns the model's latency in nanoseconds of a call of kind k
// (ck) on size bytes: the value CostModel.Latency gives on its curve, kept
// in the kind's memo or the meter's cache.
func (c *costMeter) latency(k int, ck *chargeKind, size uint64) int64 {
	if len(ck.pts) == 0 {
		return 0
	}
	if size%SubAllocGranularity == 0 && size > 0 && size <= memoMaxSize {
		i := int(size/SubAllocGranularity) - 1
		if i < len(ck.memo) {
			if ns := ck.memo[i]; ns != 0 {
				return ns
			}
		} else {
			n := min(max(2*len(ck.memo), i+1, 1024), memoMaxSize/SubAllocGranularity)
			ck.memo = append(ck.memo, make([]int64, n-len(ck.memo))...)
		}
		ns := pointLatency(ck.pts, size)
		ck.memo[i] = ns
		return ns
	}
	e := &c.cache[(size*0x9e3779b97f4a7c15+uint64(k))>>56]
	if e.used && e.size == size && int(e.kind) == k {
		return e.ns
	}
	ns := pointLatency(ck.pts, size)
	*e = costCacheEntry{size: size, ns: ns, kind: uint8(k), used: true}
	return ns
}

// alloc charges a cudaMalloc of size bytes that returned addr.
func (c *costMeter) alloc(addr, size uint64) {
	if c == nil {
		return
	}
	if size > SubAllocMax {
		c.large += pageCeil(size)
		if c.freed.take(size) {
			c.charge(chargeMallocReuse, size)
			return
		}
		c.charge(chargeMallocFresh, size)
		return
	}
	n := (size + SubAllocGranularity - 1) / SubAllocGranularity * SubAllocGranularity
	if c.holes == nil {
		c.holes = &holeIndex{}
	}
	if ref, ok := c.holes.best(n); ok {
		p := ref.page
		i := sort.Search(len(p.holes), func(i int) bool { return p.holes[i].off >= ref.off })
		h := &p.holes[i]
		c.holes.remove(p, h.off, h.len)
		c.placed.Put(addr, placement{p, h.off, n})
		h.off += n
		h.len -= n
		if h.len == 0 {
			p.holes = append(p.holes[:i], p.holes[i+1:]...)
		} else {
			c.holes.add(p, h.off, h.len)
		}
		p.live++
		c.charge(chargeMallocSuballoc, size)
		return
	}
	p := &driverPage{live: 1, seq: c.seq}
	c.seq++
	if n < driverPageSize {
		p.holes = []hole{{n, driverPageSize - n}}
		c.holes.add(p, n, driverPageSize-n)
	}
	c.pages++
	c.placed.Put(addr, placement{p, 0, n})
	c.charge(chargeMallocNewPage, size)
}

// free charges a cudaFree of the size-byte segment at addr.
func (c *costMeter) free(addr, size uint64) {
	if c == nil {
		return
	}
	pl, ok := c.placed.Take(addr)
	if !ok {
		c.large -= pageCeil(size)
		c.freed.add(size)
		c.charge(chargeFree, size)
		return
	}
	p := pl.page
	p.live--
	if p.live > 0 {
		c.release(p, pl.off, pl.len)
		c.charge(chargeFreeSuballoc, size)
		return
	}
	for _, h := range p.holes {
		c.holes.remove(p, h.off, h.len)
	}
	c.pages--
	c.charge(chargeFreeLastInPage, size)
}

// pageCeil returns size rounded up to whole driver pages (2 MiB).
func pageCeil(size uint64) uint64 {
	return (size + driverPageSize - 1) / driverPageSize * driverPageSize
}

// footprint returns the bytes of device memory the live allocations take
// from the card, as the driver takes them (measured on an H200, CUDA 13.0:
// ../shared/reference/CUDA_MEASURED.md, "Footprint"): an allocation over
// SubAllocMax takes whole 2 MiB pages of its own; smaller ones, rounded up
// to SubAllocGranularity, share 2 MiB pages, each page taken while any of
// them lives.
func (c *costMeter) footprint() uint64 { return c.large + uint64(c.pages)*driverPageSize }

// footprintWith returns what footprint would return once one more
// cudaMalloc of size bytes is placed.
func (c *costMeter) footprintWith(size uint64) uint64 {
	f := c.footprint()
	if size > SubAllocMax {
		return f + pageCeil(size)
	}
	n := (size + SubAllocGranularity - 1) / SubAllocGranularity * SubAllocGranularity
	if c.holes != nil {
		if _, ok := c.holes.best(n); ok {
			return f
		}
	}
	return f + driverPageSize
}

// release returns [off, off+n) to the holes of page p, merged with its
// neighbours.
func (c *costMeter) release(p *driverPage, off, n uint64) {
	i := sort.Search(len(p.holes), func(i int) bool { return p.holes[i].off > off })
	if i > 0 && p.holes[i-1].off+p.holes[i-1].len == off {
		prev := &p.holes[i-1]
		c.holes.remove(p, prev.off, prev.len)
		prev.len += n
		if i < len(p.holes) && off+n == p.holes[i].off {
			c.holes.remove(p, p.holes[i].off, p.holes[i].len)
			prev.len += p.holes[i].len
			p.holes = append(p.holes[:i], p.holes[i+1:]...)
		}
		c.holes.add(p, prev.off, prev.len)
		return
	}
	if i < len(p.holes) && off+n == p.holes[i].off {
		next := &p.holes[i]
		c.holes.remove(p, next.off, next.len)
		next.off = off
		next.len += n
		c.holes.add(p, next.off, next.len)
		return
	}
	p.holes = append(p.holes, hole{})
	copy(p.holes[i+1:], p.holes[i:])
	p.holes[i] = hole{off, n}
	c.holes.add(p, off, n)
}

// SetCostModel charges the device's calls from now on to m, the embedded
// H200 model being the default; nil stops the charging. The time and
// latencies charged so far are dropped.
func (d *Device) SetCostModel(m *CostModel) {
	d.changes++ // the footprint starts again
	if m == nil {
		d.cost = nil
		return
	}
	d.cost = newCostMeter(m)
}

// CostModel returns the cost model the device's calls are charged to, nil
// if none.
func (d *Device) CostModel() *CostModel {
	if d.cost == nil {
		return nil
	}
	return d.cost.m
}

// SetTime tells the device the trace time in nanoseconds of the event being
// replayed, from which the cost model's wake-up curves find the driver's
// idle time before a call. A trace without times charges no wake-ups.
func (d *Device) SetTime(ns int64) { d.now = ns }

// meter returns the device's cost meter, nil if none, told the time of
// the call about to be charged.
func (d *Device) meter() *costMeter {
	if d.cost != nil {
		d.cost.now = d.now
	}
	return d.cost
}

// Footprint returns the bytes of the card's memory the live segments take,
// as the driver takes them (whole 2 MiB pages above 1 MiB, small ones
// packed into shared 2 MiB pages; costMeter.footprint), the device's
// context left out; 0 when no cost model is set, as the driver pages are
// the cost model's.
func (d *Device) Footprint() uint64 {
	if d.cost == nil {
		return 0
	}
	return d.cost.footprint()
}

// WakeTime returns the part of AllocTime that is wake-up latency: the
// nanoseconds the calls made after the driver was idle paid over the same
// calls back to back.
func (d *Device) WakeTime() int64 {
	if d.cost == nil {
		return 0
	}
	return d.cost.woke
}

// AllocTime returns the simulated nanoseconds spent in the device's
// cudaMalloc and cudaFree calls so far, wake-ups included.
func (d *Device) AllocTime() int64 {
	if d.cost == nil {
		return 0
	}
	return d.cost.total
}

// Latencies returns the simulated latencies of the device's calls so far,
// nil when no cost model is set. They are the device's own and valid until
// the next call.
func (d *Device) Latencies() *Latencies {
	if d.cost == nil {
		return nil
	}
	return &d.cost.lat
}

// FillCost sets res's simulated allocator time and latency summary from the
// device's cost model.
func (d *Device) FillCost(res *Result) {
	res.SimAllocTimeNS = d.AllocTime()
	res.SimWakeTimeNS = d.WakeTime()
	res.Latency = nil
	if l := d.Latencies(); l != nil {
		res.Latency = l.Rows()
	}
}

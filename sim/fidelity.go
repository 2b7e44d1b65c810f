package sim

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/trace"
)

// Divergence is where a replay as recorded first parts from the recording
// (see Fidelity): what the real allocator did there and what the
// simulation did.
type Divergence struct {
	// Event is the index of the trace event (from 0) where it shows.
	Event int64
	// Real and Sim say what the recording shows and what the simulation
	// did, in words.
	Real, Sim string
}

func (d *Divergence) String() string {
	return fmt.Sprintf("event %d: real allocator: %s; simulation: %s", d.Event, d.Real, d.Sim)
}

// FidelityReport is the outcome of Fidelity.
type FidelityReport struct {
	// Result is the replay's result, as Run gives it.
	Result *Result
	// Calls is the number of device calls the recording shows; Mallocs the
	// number of mallocs (and failed mallocs) compared.
	Calls, Mallocs int64
	// Divergence is the first divergence, nil if the replay is identical
	// to the recording.
	Divergence *Divergence
	// RetryEvents are the indices of the events at which the simulated
	// allocator retried a malloc after releasing its cache (a
	// policies.Counter's retries).
	RetryEvents []int64
}

// recordedCall is a device call of the recording, at its event.
type recordedCall struct {
	call  DeviceCall
	event int64
}

// Fidelity replays src as recorded (cfg with AsRecorded) and compares it
// with the recording, event by event: every device call of the simulation
// (segment allocation, free, map, unmap) must be the recorded one (same
// call, address and size, in the same order), made while replaying the
// first event the simulated allocator acts on (a malloc, a failed malloc,
// a free, an empty_cache) after the recorded call; every malloc must be
// placed at its recorded address, and fail (an OOM) exactly where the
// source's failed. A trace that records no device call
// (trace.UnrecordedSegments: an XSpace's) is held to its mallocs' successes
// and failures only, and to the figures it records (RecordedMeasured). It
// stops at the first divergence. The device frees of
// a source that does not record them (trace.UnrecordedSegmentFrees) are
// not compared. Errors are those of Run.
func Fidelity(src trace.Source, cfg Config) (*FidelityReport, error) {
	cfg.AsRecorded = true
	if cfg.CardMemory == 0 {
		cfg.CardMemory = src.Header().DeviceMemory
	}
	cfg, err := cfg.withRecorded(src.Header())
	if err != nil {
		return nil, err
	}
	cfg.watch = true // whatever the policy and settings: the question asked
	if cfg.Backend != nil {
		return nil, fmt.Errorf("policy %s: fidelity needs the simulated device", cfg.Policy)
	}
	rep, err := NewReplay(cfg)
	if err != nil {
		return nil, err
	}
	rep.res.TraceSource = src.Header().Source
	rep.SetPoolNames(src.Header())
	out := &FidelityReport{}
	counter, _ := rep.policy.(policies.Counter) // its retries, asked once per event
	w := rep.watch
	for i := int64(0); w.parted == nil; i++ {
		ev, err := src.Next()
		if err == io.EOF {
			if err := rep.End(); err != nil {
				return nil, err
			}
			break
		}
		if err != nil {
			return nil, err
		}
		if err := rep.Step(i, ev); err != nil {
			return nil, fmt.Errorf("policy %s: %w", rep.policy.Name(), err)
		}
		if counter != nil {
			for n := counter.Retries(); int64(len(out.RetryEvents)) < n; {
				out.RetryEvents = append(out.RetryEvents, i)
			}
		}
	}
	out.Calls, out.Mallocs, out.Divergence = w.calls, w.mallocs, w.parted
	out.Result = rep.Finish()
	return out, nil
}

// Measured is what the real allocator reported for a recording: a
// NAME.stats.json beside a snapshot, in the shape of the shared trace
// collection (torch.cuda.max_memory_reserved, max_memory_allocated,
// memory_stats and the per-process cap the job ran under).
type Measured struct {
	Cap         uint64  `json:"mem_cap_bytes"`        // bytes; 0 for none
	Reserved    *uint64 `json:"max_memory_reserved"`  // bytes
	Allocated   *uint64 `json:"max_memory_allocated"` // bytes
	MemoryStats struct {
		DeviceAllocs *int64 `json:"num_device_alloc"`  // cudaMalloc calls (or maps)
		DeviceFrees  *int64 `json:"num_device_free"`   // cudaFree calls (or unmaps)
		Retries      *int64 `json:"num_alloc_retries"` // mallocs retried after freeing the cache
		OOMs         *int64 `json:"num_ooms"`          // mallocs that failed
	} `json:"memory_stats"`
	// Mallocs is the number of mallocs the allocator made, from JAXStats
	// or a trace's header (RecordedMeasured).
	Mallocs *int64 `json:"-"`
	// JAXStats is JAX's memory_stats() of the device at the end of the
	// job (XLA's BFC), as testdata/jax/record.py writes it in NAME.json
	// under "stats"; ReadMeasured also takes it from under "memory_stats",
	// the other shape such files have. ReadMeasured takes its
	// peak_bytes_in_use for Allocated, peak_pool_bytes for Reserved and
	// num_allocs for Mallocs.
	JAXStats *JAXStats `json:"stats"`
	// CuPy's pool, as testdata/cupy/record.py measures it: ReadMeasured
	// takes them for Cap, Reserved, MemoryStats.DeviceAllocs and OOMs.
	CuPyLimit        uint64  `json:"limit_bytes"`      // set_limit, bytes; 0 for none
	CuPyPeakTotal    *uint64 `json:"peak_total_bytes"` // the peak of total_bytes(), bytes
	CuPyDeviceAllocs *int64  `json:"device_allocs"`    // alloc hook calls
	CuPyOOMs         *int64  `json:"ooms_caught"`      // OutOfMemoryError raised and caught
}

// JAXStats is JAX's Device.memory_stats() (XLA's BFC allocator) at the
// end of a job: the figures of it that Measured uses, nil where absent.
type JAXStats struct {
	PeakInUse  *uint64 `json:"peak_bytes_in_use"` // the peak of the bytes in use, bytes
	PeakPool   *uint64 `json:"peak_pool_bytes"`   // the peak of the pool's bytes, bytes
	NumAllocs  *int64  `json:"num_allocs"`        // mallocs
	BytesLimit *uint64 `json:"bytes_limit"`       // XLA's memory limit, bytes
}

// empty reports whether s holds none of the figures Measured uses.
func (s *JAXStats) empty() bool {
	return s.PeakInUse == nil && s.PeakPool == nil && s.NumAllocs == nil && s.BytesLimit == nil
}

// ErrNoFigures is the error of ReadMeasured for a file that holds none
// of the figures CompareMeasured compares.
var ErrNoFigures = errors.New("no figure to compare")

// RecordedSettings returns the settings of policy that the measured
// figures imply the job ran its allocator with, nil if none: for bfc,
// from JAX's memory_stats(), XLA's memory limit (bytes_limit) and whether
// it preallocated (allow_growth=false when the pool peaked at the whole
// limit, as a preallocated pool does from the start; a pool grown to the
// very limit reads as preallocated too).
func (m *Measured) RecordedSettings(policy string) policies.Settings {
	s := m.JAXStats
	if policy != "bfc" || s == nil || s.BytesLimit == nil || *s.BytesLimit == 0 {
		return nil
	}
	prealloc := s.PeakPool != nil && *s.PeakPool == *s.BytesLimit
	return policies.Settings{
		"memory_limit": strconv.FormatUint(*s.BytesLimit, 10),
		"allow_growth": strconv.FormatBool(!prealloc),
	}
}

// ReadMeasured reads the measured figures at path: PyTorch's, JAX's
// memory_stats() under "stats" or under "memory_stats" (Measured.JAXStats),
// or CuPy's pool's. Errors name the file: a JSON error with its byte
// offset, the key that holds JAX's figures under both "stats" and
// "memory_stats" with two values, or ErrNoFigures (wrapped, saying what
// the file lacks) for a file that holds no figure CompareMeasured
// compares.
func ReadMeasured(path string) (*Measured, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var m Measured
	// JAX's memory_stats() under "memory_stats" shares the key with
	// PyTorch's: its figures are read apart.
	var other struct {
		JAX JAXStats `json:"memory_stats"`
	}
	err = json.Unmarshal(raw, &m)
	if err == nil {
		err = json.Unmarshal(raw, &other)
	}
	if err != nil {
		var syn *json.SyntaxError
		var typ *json.UnmarshalTypeError
		switch {
		case errors.As(err, &syn):
			return nil, fmt.Errorf("%s: byte offset %d: %v", path, syn.Offset, err)
		case errors.As(err, &typ):
			return nil, fmt.Errorf("%s: byte offset %d: %v", path, typ.Offset, err)
		}
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	if !other.JAX.empty() {
		if m.JAXStats == nil {
			m.JAXStats = &other.JAX
		} else if err := mergeJAXStats(m.JAXStats, &other.JAX); err != nil {
			return nil, fmt.Errorf("%s: %v", path, err)
		}
	}
	if s := m.JAXStats; s != nil {
		m.Allocated = cmp.Or(m.Allocated, s.PeakInUse)
		m.Reserved = cmp.Or(m.Reserved, s.PeakPool)
		m.Mallocs = cmp.Or(m.Mallocs, s.NumAllocs)
	}
	if m.CuPyPeakTotal != nil || m.CuPyDeviceAllocs != nil {
		m.Cap = cmp.Or(m.Cap, m.CuPyLimit)
		m.Reserved = cmp.Or(m.Reserved, m.CuPyPeakTotal)
		m.MemoryStats.DeviceAllocs = cmp.Or(m.MemoryStats.DeviceAllocs, m.CuPyDeviceAllocs)
		m.MemoryStats.OOMs = cmp.Or(m.MemoryStats.OOMs, m.CuPyOOMs)
	}
	if !m.hasFigures() {
		return nil, fmt.Errorf("%s: %w: it has none of max_memory_reserved, max_memory_allocated, "+
			"memory_stats' num_device_alloc, num_device_free, num_alloc_retries or num_ooms (PyTorch), "+
			"peak_bytes_in_use, peak_pool_bytes or num_allocs under stats or memory_stats (JAX), "+
			"peak_total_bytes or device_allocs (CuPy)", path, ErrNoFigures)
	}
	return &m, nil
}

// mergeJAXStats fills the figures s lacks (from under "stats") with
// those of o (from under "memory_stats"); a figure both hold must agree
// (the first that does not is the error).
func mergeJAXStats(s, o *JAXStats) error {
	return cmp.Or(mergeFigure("peak_bytes_in_use", &s.PeakInUse, o.PeakInUse),
		mergeFigure("peak_pool_bytes", &s.PeakPool, o.PeakPool),
		mergeFigure("num_allocs", &s.NumAllocs, o.NumAllocs),
		mergeFigure("bytes_limit", &s.BytesLimit, o.BytesLimit))
}

// mergeFigure sets *a to b where *a is nil; both set, they must agree.
func mergeFigure[T comparable](key string, a **T, b *T) error {
	if *a != nil && b != nil && **a != *b {
		return fmt.Errorf("stats.%s %v and memory_stats.%s %v differ", key, **a, key, *b)
	}
	*a = cmp.Or(*a, b)
	return nil
}

// hasFigures reports whether m holds a figure CompareMeasured compares.
func (m *Measured) hasFigures() bool {
	ms := m.MemoryStats
	return m.Reserved != nil || m.Allocated != nil || m.Mallocs != nil ||
		ms.DeviceAllocs != nil || ms.DeviceFrees != nil || ms.Retries != nil || ms.OOMs != nil
}

// CompareMeasured returns, one line each, the figures of a replay as
// recorded that differ from the real allocator's: peak reserved and
// allocated bytes, device allocations (cudaMalloc, or maps of expandable
// segments) and frees (or unmaps), retries and OOMs, each with the events
// where the simulation made them when known. A counter m lacks is not
// compared. It returns nil when all agree.
func CompareMeasured(rep *FidelityReport, m *Measured) []string {
	r := rep.Result
	var out []string
	differ := func(name string, real, sim any, where string) {
		if real != sim {
			out = append(out, fmt.Sprintf("%s: real allocator %v, simulation %v%s", name, real, sim, where))
		}
	}
	if m.Reserved != nil {
		differ("peak reserved bytes", *m.Reserved, r.PeakReserved, "")
	}
	if m.Allocated != nil {
		differ("peak allocated bytes", *m.Allocated, r.PeakAllocated, "")
	}
	if m.Mallocs != nil {
		differ("mallocs", *m.Mallocs, rep.Mallocs, "")
	}
	ms := m.MemoryStats
	if ms.DeviceAllocs != nil {
		differ("device allocations", *ms.DeviceAllocs, r.DeviceAllocs, "")
	}
	if ms.DeviceFrees != nil {
		differ("device frees", *ms.DeviceFrees, r.DeviceFrees, "")
	}
	if ms.Retries != nil {
		where := ""
		if len(rep.RetryEvents) > 0 {
			where = fmt.Sprintf(" (at events %s)", joinEvents(rep.RetryEvents))
		} else if *ms.Retries > 0 {
			where = " (none made)"
		}
		differ("retries", *ms.Retries, r.AllocRetries, where)
	}
	if ms.OOMs != nil {
		where := ""
		if r.FirstOOMEvent >= 0 {
			where = fmt.Sprintf(" (the first at event %d)", r.FirstOOMEvent)
		}
		differ("OOMs", *ms.OOMs, r.OOMs, where)
	}
	return out
}

func joinEvents(evs []int64) string {
	s := ""
	for k, e := range evs {
		if k == 8 {
			return s + fmt.Sprintf(" and %d more", len(evs)-k)
		}
		if k > 0 {
			s += ", "
		}
		s += fmt.Sprint(e)
	}
	return s
}

// RecordedMeasured returns the real allocator's figures that the header h
// of a trace records, as an importer writes them in its Metadata
// ("recorded_peak_allocated_bytes", "recorded_mallocs": the XSpace's BFC
// events give them), or nil when it records none.
func RecordedMeasured(h trace.Header) *Measured {
	var m Measured
	if v, err := strconv.ParseUint(h.Metadata["recorded_peak_allocated_bytes"], 10, 64); err == nil {
		m.Allocated = &v
	}
	if v, err := strconv.ParseInt(h.Metadata["recorded_mallocs"], 10, 64); err == nil {
		m.Mallocs = &v
	}
	if m.Allocated == nil && m.Mallocs == nil {
		return nil
	}
	return &m
}

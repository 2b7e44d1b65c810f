package kineto

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/gpualloc/allocsim/trace"
)

// maxValue bounds Bytes and Total Reserved: 2^62 bytes, far above any
// device, so that their differences never overflow.
const maxValue = 1 << 62

// decoder reads the JSON of a trace with a reader of its own (scan.go),
// which holds no value whole but those it keeps, and keeps the memory
// events of one device.
type decoder struct {
	name       string
	opts       Options
	compressed bool

	// The reader: buf[pos:end] is the input not read yet, base the byte
	// offset of buf[0], rerr the input's error once met (io.EOF at its
	// end); stack the arrays ('[') and objects ('{') the reader is in.
	r        io.Reader
	buf      []byte
	pos, end int
	base     int64
	rerr     error
	stack    []byte
	keyBuf   capture
	ev       eventFields // the fields of the event being read
	recs     []record
	devices  map[int64]int64 // memory events by CUDA Device Id
	host     int64           // Device Type 0 events skipped
	other    int64           // events of other device types skipped
	events   int64           // traceEvents elements
	list     bool            // traceEvents seen
	base0    int64           // baseTimeNanoseconds
	props    []deviceProps
	meta     map[string]string
}

type deviceProps struct {
	ID             *int64 `json:"id"`
	Name           string `json:"name"`
	TotalGlobalMem uint64 `json:"totalGlobalMem"`
}

// argKeys are the args of a memory event that Import reads.
var argKeys = [...]string{"Device Type", "Device Id", "Bytes", "Total Reserved", "Addr"}

// eventFields are the fields of a traceEvents element that Import reads,
// their raw JSON kept up to maxKept bytes, as encoding/json would set
// them in a struct of json.RawMessage fields "name", "tid", "ts" and
// "args" (keys matched without regard to case, the last of a key
// winning), and in a map of the args (keys matched exactly).
type eventFields struct {
	name, tid, ts  capture
	hasName, hasTs bool
	hasArgs        bool
	argsObject     bool
	args           capture // the args when they are not an object, for the message
	arg            [len(argKeys)]capture
	hasArg         [len(argKeys)]bool
}

func newDecoder(r io.Reader, name string, opts Options, compressed bool) *decoder {
	return &decoder{r: r, buf: make([]byte, 64<<10), name: name, opts: opts, compressed: compressed, devices: map[int64]int64{}, meta: map[string]string{}}
}

// where names a byte offset of the JSON.
func (d *decoder) where(off int64) string {
	if d.compressed {
		return fmt.Sprintf("byte %d (of the decompressed JSON)", off)
	}
	return fmt.Sprintf("byte %d", off)
}

func gzipError(name string, off int64, err error) error {
	if err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%s: truncated gzip stream at byte %d of the decompressed JSON: %w", name, off, io.ErrUnexpectedEOF)
	}
	return fmt.Errorf("%s: bad gzip at byte %d of the decompressed JSON: %v", name, off, err)
}

// run reads the whole trace.
func (d *decoder) run() error {
	b, ok := d.space(nil)
	if !ok {
		if d.rerr != io.EOF {
			return d.inputError()
		}
		return fmt.Errorf("%s: %w (an empty file)", d.name, ErrNotTrace)
	}
	switch kind := kindAt(b); kind {
	case "array":
		// The bare array form of the Chrome trace format.
		d.list = true
		if err := d.elements(d.element); err != nil {
			return err
		}
	case "object":
		if err := d.members(d.member); err != nil {
			return err
		}
	case "":
		return fmt.Errorf("%s: %w (not JSON at %s: invalid character %s looking for beginning of value)", d.name, ErrNotTrace, d.where(d.off()), quoteChar(b))
	default:
		return fmt.Errorf("%s: %w (a JSON %s at %s, not an object)", d.name, ErrNotTrace, kind, d.where(d.off()))
	}
	// Nothing but white space may follow.
	off := d.off()
	if b, ok := d.space(nil); ok {
		if kind := kindAt(b); kind != "" {
			return fmt.Errorf("%s: a JSON %s follows the trace's end at %s: appended data is refused", d.name, kind, d.where(off))
		}
		return d.syntax(b, "after top-level value")
	}
	if d.rerr != io.EOF {
		return d.inputError()
	}
	return nil
}

// member reads the value of the top-level object's member key.
func (d *decoder) member(key []byte) error {
	switch k := string(key); k {
	case "traceEvents":
		b, err := d.next(nil)
		if err != nil {
			return err
		}
		if b != '[' {
			kind := kindAt(b)
			if kind == "" {
				return d.syntax(b, "looking for beginning of value")
			}
			return fmt.Errorf("%s: traceEvents at %s is a JSON %s, not an array", d.name, d.where(d.off()), kind)
		}
		d.list = true
		return d.elements(d.element)
	case "deviceProperties":
		// Informative only: a deviceProperties of another shape, or
		// longer than maxProps, is left out.
		raw := capture{limit: maxProps}
		if err := d.value(&raw); err != nil {
			return err
		}
		var props []deviceProps
		if !raw.cut && json.Unmarshal(raw.b, &props) == nil {
			d.props = props
		}
	case "baseTimeNanoseconds":
		if _, err := d.next(nil); err != nil {
			return err
		}
		off := d.off()
		raw := capture{limit: maxKept}
		if err := d.value(&raw); err != nil {
			return err
		}
		n, err := strconv.ParseInt(string(raw.b), 10, 64)
		if raw.cut || err != nil || n < 0 {
			return fmt.Errorf("%s: baseTimeNanoseconds at %s is %s, not a count of nanoseconds", d.name, d.where(off), abbreviate(raw.b))
		}
		d.base0 = n
	case "schemaVersion", "cuda_driver_version", "cuda_runtime_version", "cupti_version", "displayTimeUnit", "trace_id":
		raw := capture{limit: maxMeta}
		if err := d.value(&raw); err != nil {
			return err
		}
		if v, ok := scalar(raw.b); ok && !raw.cut {
			d.meta[metaKey(k)] = v
		}
	default:
		return d.value(nil)
	}
	return nil
}

// metaKey is the Metadata key of a top-level member: schemaVersion is
// schema_version, the others keep their names.
func metaKey(key string) string {
	if key == "schemaVersion" {
		return "schema_version"
	}
	if key == "displayTimeUnit" {
		return "display_time_unit"
	}
	return key
}

// scalar returns a JSON string or number as text.
func scalar(raw json.RawMessage) (string, bool) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, !strings.ContainsAny(s, "\n\r")
	}
	var n json.Number
	if json.Unmarshal(raw, &n) == nil {
		return n.String(), true
	}
	return "", false
}

// element reads an element of traceEvents.
func (d *decoder) element() error {
	off := d.off()
	k := d.events
	d.events++
	if d.buf[d.pos] != '{' {
		return d.value(nil) // not an event object; one that is not ours is left alone
	}
	e := &d.ev
	e.hasName, e.hasTs, e.hasArgs = false, false, false
	e.tid.reset(maxKept)
	err := d.members(func(key []byte) error {
		switch {
		case foldIs(key, "name"):
			e.hasName = true
			e.name.reset(maxKept)
			return d.value(&e.name)
		case foldIs(key, "tid"):
			e.tid.reset(maxKept)
			return d.value(&e.tid)
		case foldIs(key, "ts"):
			e.hasTs = true
			e.ts.reset(maxKept)
			return d.value(&e.ts)
		case foldIs(key, "args"):
			return d.eventArgs(e)
		}
		return d.value(nil)
	})
	if err != nil {
		return err
	}
	return d.event(k, off, e)
}

// foldIs reports whether key is name regardless of case, as encoding/json
// matches a struct field's name.
func foldIs(key []byte, name string) bool {
	return len(key) >= len(name) && strings.EqualFold(string(key), name)
}

// eventArgs reads an event's args into e.
func (d *decoder) eventArgs(e *eventFields) error {
	e.hasArgs = true
	e.hasArg = [len(argKeys)]bool{}
	b, err := d.next(nil)
	if err != nil {
		return err
	}
	if e.argsObject = b == '{'; !e.argsObject {
		e.args.reset(41) // abbreviate shows 40 bytes
		return d.value(&e.args)
	}
	return d.members(func(key []byte) error {
		for i, k := range argKeys {
			if string(key) == k {
				e.hasArg[i] = true
				e.arg[i].reset(maxKept)
				return d.value(&e.arg[i])
			}
		}
		return d.value(nil)
	})
}

// event keeps traceEvents[k], which starts at byte off, when it is a
// memory event of a CUDA device.
func (d *decoder) event(k, off int64, e *eventFields) error {
	var name string
	if !e.hasName || e.name.cut || json.Unmarshal(e.name.b, &name) != nil || (name != "[memory]" && name != "[OutOfMemory]") {
		return nil
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%s: traceEvents[%d] (a %s event at %s): %s", d.name, k, name, d.where(off), fmt.Sprintf(format, args...))
	}
	if !e.hasArgs {
		return bad("no args")
	}
	if !e.argsObject {
		return bad("its args %s are not an object", abbreviate(e.args.b))
	}
	field := func(i int) ([]byte, error) {
		if !e.hasArg[i] {
			return nil, bad("no %q in its args", argKeys[i])
		}
		if e.arg[i].cut {
			return nil, bad("%q is %s: longer than %d bytes", argKeys[i], abbreviate(e.arg[i].b), maxKept)
		}
		return e.arg[i].b, nil
	}
	integer := func(i int, lo, hi int64) (int64, error) {
		v, err := field(i)
		if err != nil {
			return 0, err
		}
		n, err := strconv.ParseInt(string(v), 10, 64)
		if err != nil || n < lo || n > hi {
			return 0, bad("%q is %s, want an integer from %d to %d", argKeys[i], abbreviate(v), lo, hi)
		}
		return n, nil
	}
	typ, err := integer(0, math.MinInt64, math.MaxInt64)
	if err != nil {
		return err
	}
	if typ != 1 {
		if typ == 0 {
			d.host++
		} else {
			d.other++
		}
		return nil
	}
	dev, err := integer(1, 0, math.MaxInt32)
	if err != nil {
		return err
	}
	var r record
	r.offset = off
	n, err := integer(2, -maxValue, maxValue)
	if err != nil {
		return err
	}
	reserved, err := integer(3, 0, maxValue)
	if err != nil {
		return err
	}
	r.reserved = uint64(reserved)
	switch {
	case name == "[OutOfMemory]":
		if n <= 0 {
			return bad("\"Bytes\" is %d, want the positive size of the failed request", n)
		}
		r.op, r.size = trace.OpMallocFailed, uint64(n)
	case n == 0:
		return bad("\"Bytes\" is 0: neither a malloc nor a free")
	default:
		r.op, r.size = trace.OpMalloc, uint64(n)
		if n < 0 {
			r.op, r.size = trace.OpFree, uint64(-n)
		}
		v, err := field(4)
		if err != nil {
			return err
		}
		if r.addr, err = address(v); err != nil {
			return bad("\"Addr\" is %s: %v", abbreviate(v), err)
		}
	}
	if !e.hasTs {
		return bad("no \"ts\"")
	}
	if e.ts.cut {
		return bad("\"ts\" is %s: longer than %d bytes", abbreviate(e.ts.b), maxKept)
	}
	if r.time, err = micros(string(e.ts.b)); err != nil {
		return bad("\"ts\" is %s: %v", abbreviate(e.ts.b), err)
	}
	if !e.tid.cut {
		r.thread = thread(e.tid.b)
	}
	d.devices[dev]++
	if dev == int64(d.opts.Device) {
		d.recs = append(d.recs, r)
	}
	return nil
}

// address reads an Addr: a decimal integer, a negative one being a
// pointer above 2^63 printed as a signed integer.
func address(v json.RawMessage) (uint64, error) {
	s := string(v)
	if n, err := strconv.ParseUint(s, 10, 64); err == nil {
		return n, nil
	}
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		return uint64(n), nil
	}
	return 0, errors.New("want an integer address")
}

// thread reads a tid: a non-negative integer, or a string holding one;
// anything else is 0 (unknown).
func thread(v json.RawMessage) uint64 {
	s := string(v)
	if len(s) > 1 && s[0] == '"' {
		if json.Unmarshal(v, &s) != nil {
			return 0
		}
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0
	}
	return n
}

// micros reads ts, microseconds as a JSON number, as nanoseconds: exactly
// from its digits (three after the point count; more are cut), or through
// a float for a number with an exponent.
func micros(s string) (int64, error) {
	errRange := errors.New("out of range")
	if strings.ContainsAny(s, "eE") {
		f, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return 0, errors.New("not a number of microseconds")
		}
		ns := math.Round(f * 1000)
		if math.IsNaN(ns) || ns > math.MaxInt64/2 || ns < -math.MaxInt64/2 {
			return 0, errRange
		}
		return int64(ns), nil
	}
	neg := strings.HasPrefix(s, "-")
	whole, frac, _ := strings.Cut(strings.TrimPrefix(s, "-"), ".")
	if whole == "" || strings.HasPrefix(whole, "+") {
		return 0, errors.New("not a number of microseconds")
	}
	us, err := strconv.ParseInt(whole, 10, 64)
	if err != nil {
		if errors.Is(err, strconv.ErrRange) {
			return 0, errRange
		}
		return 0, errors.New("not a number of microseconds")
	}
	if us > math.MaxInt64/2/1000 {
		return 0, errRange
	}
	ns := us * 1000
	for i, scale := 0, int64(100); i < len(frac); i++ {
		c := frac[i]
		if c < '0' || c > '9' {
			return 0, errors.New("not a number of microseconds")
		}
		if i < 3 {
			ns += int64(c-'0') * scale
			scale /= 10
		}
	}
	if neg {
		ns = -ns
	}
	return ns, nil
}

// abbreviate quotes a raw JSON value for a message, cut to 40 bytes.
func abbreviate(v []byte) string {
	if len(v) > 40 {
		return strconv.Quote(string(v[:40])) + "..."
	}
	return strconv.Quote(string(v))
}

// source builds the Source of the device's memory events: sorted, the
// kind of segments chosen, the header filled.
func (d *decoder) source() (*Source, error) {
	if !d.list {
		return nil, fmt.Errorf("%s: %w (an object without traceEvents)", d.name, ErrNotTrace)
	}
	if len(d.recs) == 0 {
		if len(d.devices) > 0 {
			ids := make([]string, 0, len(d.devices))
			for id := range d.devices {
				ids = append(ids, strconv.FormatInt(id, 10))
			}
			sort.Strings(ids)
			return nil, fmt.Errorf("%s: %w of CUDA device %d (the trace has memory events of device %s: --device picks one)", d.name, ErrNoMemoryEvents, d.opts.Device, strings.Join(ids, ", "))
		}
		hint := "was it profiled with torch.profiler.profile(profile_memory=True)?"
		if d.host > 0 {
			hint = fmt.Sprintf("%d of host memory only", d.host)
		}
		return nil, fmt.Errorf("%s: %w of a CUDA device among its %d events (%s)", d.name, ErrNoMemoryEvents, d.events, hint)
	}
	slices.SortStableFunc(d.recs, func(a, b record) int {
		switch {
		case a.time < b.time:
			return -1
		case a.time > b.time:
			return 1
		}
		return 0
	})
	first, last := d.recs[0].time, d.recs[len(d.recs)-1].time
	if d.base0 > 0 && (last > math.MaxInt64-d.base0 || first < math.MinInt64+d.base0) {
		return nil, fmt.Errorf("%s: baseTimeNanoseconds %d plus ts %d ns overflows", d.name, d.base0, last)
	}
	s := &Source{recs: d.recs, base: d.base0}
	h := trace.Header{Source: "kineto", Metadata: d.meta}
	h.Metadata["format"] = "torch.profiler (Kineto) Chrome trace JSON"
	h.Metadata["device"] = strconv.Itoa(d.opts.Device)
	h.Metadata["memory_events"] = strconv.Itoa(len(d.recs))
	h.Metadata["trace_events"] = strconv.FormatInt(d.events, 10)
	if d.host > 0 {
		h.Metadata["host_events_skipped"] = strconv.FormatInt(d.host, 10)
	}
	if d.other > 0 {
		h.Metadata["other_device_events_skipped"] = strconv.FormatInt(d.other, 10)
	}
	if len(d.devices) > 1 {
		var ids []string
		for id, n := range d.devices {
			ids = append(ids, fmt.Sprintf("%d:%d", id, n))
		}
		sort.Strings(ids)
		h.Metadata["devices"] = strings.Join(ids, " ")
	}
	for _, p := range d.props {
		if p.ID != nil && *p.ID == int64(d.opts.Device) {
			h.Device = p.Name
			if p.TotalGlobalMem > 0 {
				h.Metadata["device_memory"] = strconv.FormatUint(p.TotalGlobalMem, 10)
			}
		}
	}
	if d.base0 > 0 {
		h.Metadata["base_time_ns"] = strconv.FormatInt(d.base0, 10)
	}
	h.Metadata["unrecorded"] = unrecorded
	s.h = h
	s.kind, h.Metadata["device_calls"], h.Metadata["unknown_frees"] = choose(d.recs, s.deviceMemory())
	if h.Metadata["unknown_frees"] == "0" {
		delete(h.Metadata, "unknown_frees")
	}
	return s, nil
}

// unrecorded is Metadata "unrecorded" (trace.Header.Unrecorded): what a
// torch.profiler trace lacks (the package doc says more), comma-separated.
// The device calls are inferred, and so is an explicit empty_cache.
const unrecorded = "streams, requested sizes, free completions, allocator settings, memory cap"

package kineto

import (
	"bytes"
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

// decoder walks the JSON of a trace with a json.Decoder's tokens and keeps
// the memory events of one device.
type decoder struct {
	dec        *json.Decoder
	name       string
	opts       Options
	compressed bool

	recs    []record
	devices map[int64]int64 // memory events by CUDA Device Id
	host    int64           // Device Type 0 events skipped
	other   int64           // events of other device types skipped
	events  int64           // traceEvents elements
	list    bool            // traceEvents seen
	base    int64
	props   []deviceProps
	meta    map[string]string
}

type deviceProps struct {
	ID             *int64 `json:"id"`
	Name           string `json:"name"`
	TotalGlobalMem uint64 `json:"totalGlobalMem"`
}

// memoryEvent is a [memory] or [OutOfMemory] event, its fields still raw.
type memoryEvent struct {
	Name    json.RawMessage            `json:"name"`
	Tid     json.RawMessage            `json:"tid"`
	Ts      json.RawMessage            `json:"ts"`
	RawArgs json.RawMessage            `json:"args"`
	Args    map[string]json.RawMessage `json:"-"`
}

func newDecoder(r io.Reader, name string, opts Options, compressed bool) *decoder {
	dec := json.NewDecoder(r)
	dec.UseNumber()
	return &decoder{dec: dec, name: name, opts: opts, compressed: compressed, devices: map[int64]int64{}, meta: map[string]string{}}
}

// where names a byte offset of the JSON.
func (d *decoder) where(off int64) string {
	if d.compressed {
		return fmt.Sprintf("byte %d (of the decompressed JSON)", off)
	}
	return fmt.Sprintf("byte %d", off)
}

// readError is the error for err, returned by the json.Decoder's Token
// or, with value, its Decode.
func (d *decoder) readError(err error, value bool) error {
	var se *json.SyntaxError
	switch {
	case errors.As(err, &se):
		return fmt.Errorf("%s: bad JSON at %s: %v", d.name, d.where(d.syntaxAt(value)), se)
	case err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF):
		rest, _ := io.ReadAll(d.dec.Buffered())
		return fmt.Errorf("%s: truncated trace at %s: %w", d.name, d.where(d.dec.InputOffset()+int64(len(rest))), io.ErrUnexpectedEOF)
	case d.compressed:
		return gzipError(d.name, d.dec.InputOffset(), err)
	}
	return fmt.Errorf("%s: at %s: %v", d.name, d.where(d.dec.InputOffset()), err)
}

// valueAt returns the byte offset of the value the decoder reads next,
// past white space, a comma or a colon.
func (d *decoder) valueAt() int64 {
	rest, _ := io.ReadAll(d.dec.Buffered())
	i := 0
	for i < len(rest) && strings.IndexByte(" \t\r\n,:", rest[i]) >= 0 {
		i++
	}
	return d.dec.InputOffset() + int64(i)
}

// syntaxAt returns the byte offset of the fault of a syntax error: a
// json.Decoder's own offsets count from the value it read, and its input
// offset stops before the comma and white space ahead of the value (with
// value; Token stops just before the fault), so the fault is found again
// in what the decoder holds from there.
func (d *decoder) syntaxAt(value bool) int64 {
	off := d.dec.InputOffset()
	rest, _ := io.ReadAll(d.dec.Buffered())
	space := func(i int) int {
		for i < len(rest) && (rest[i] == ' ' || rest[i] == '\t' || rest[i] == '\n' || rest[i] == '\r') {
			i++
		}
		return i
	}
	i := space(0)
	if value {
		if i < len(rest) && (rest[i] == ',' || rest[i] == ':') {
			i = space(i + 1)
		}
		var raw json.RawMessage
		var se *json.SyntaxError
		if err := json.Unmarshal(rest[i:], &raw); errors.As(err, &se) && se.Offset > 0 {
			return off + int64(i) + se.Offset - 1
		}
	}
	return off + int64(i)
}

func gzipError(name string, off int64, err error) error {
	if err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%s: truncated gzip stream at byte %d of the decompressed JSON: %w", name, off, io.ErrUnexpectedEOF)
	}
	return fmt.Errorf("%s: bad gzip at byte %d of the decompressed JSON: %v", name, off, err)
}

func (d *decoder) token() (json.Token, error) {
	t, err := d.dec.Token()
	if err != nil {
		return nil, d.readError(err, false)
	}
	return t, nil
}

// run reads the whole trace.
func (d *decoder) run() error {
	t, err := d.dec.Token()
	if err == io.EOF {
		return fmt.Errorf("%s: %w (an empty file)", d.name, ErrNotTrace)
	}
	if err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return fmt.Errorf("%s: %w (not JSON at %s: %v)", d.name, ErrNotTrace, d.where(d.syntaxAt(false)), se)
		}
		return d.readError(err, false)
	}
	switch t {
	case json.Delim('['):
		// The bare array form of the Chrome trace format.
		if err := d.eventList(); err != nil {
			return err
		}
	case json.Delim('{'):
		if err := d.object(); err != nil {
			return err
		}
	default:
		return fmt.Errorf("%s: %w (a JSON %s at byte 0, not an object)", d.name, ErrNotTrace, kindOf(t))
	}
	// Nothing but white space may follow.
	off := d.dec.InputOffset()
	if t, err := d.dec.Token(); err != io.EOF {
		if err != nil {
			return d.readError(err, false)
		}
		return fmt.Errorf("%s: a JSON %s follows the trace's end at %s: appended data is refused", d.name, kindOf(t), d.where(off))
	}
	return nil
}

func kindOf(t json.Token) string {
	switch t.(type) {
	case json.Delim:
		if t == json.Delim('[') {
			return "array"
		}
		return "object"
	case string:
		return "string"
	case json.Number, float64:
		return "number"
	case bool:
		return "boolean"
	}
	return "null"
}

// object reads the members of the top-level object, after its '{'.
func (d *decoder) object() error {
	for d.dec.More() {
		t, err := d.token()
		if err != nil {
			return err
		}
		key, _ := t.(string)
		switch key {
		case "traceEvents":
			off := d.valueAt()
			t, err := d.token()
			if err != nil {
				return err
			}
			if t != json.Delim('[') {
				return fmt.Errorf("%s: traceEvents at %s is a JSON %s, not an array", d.name, d.where(off), kindOf(t))
			}
			if err := d.eventList(); err != nil {
				return err
			}
		case "deviceProperties":
			var raw json.RawMessage
			if err := d.dec.Decode(&raw); err != nil {
				return d.readError(err, true)
			}
			// Informative only: a deviceProperties of another shape is
			// left out.
			var props []deviceProps
			if json.Unmarshal(raw, &props) == nil {
				d.props = props
			}
		case "baseTimeNanoseconds":
			off := d.valueAt()
			var raw json.RawMessage
			if err := d.dec.Decode(&raw); err != nil {
				return d.readError(err, true)
			}
			n, err := strconv.ParseInt(string(raw), 10, 64)
			if err != nil || n < 0 {
				return fmt.Errorf("%s: baseTimeNanoseconds at %s is %s, not a count of nanoseconds", d.name, d.where(off), abbreviate(raw))
			}
			d.base = n
		case "schemaVersion", "cuda_driver_version", "cuda_runtime_version", "cupti_version", "displayTimeUnit", "trace_id":
			var raw json.RawMessage
			if err := d.dec.Decode(&raw); err != nil {
				return d.readError(err, true)
			}
			if v, ok := scalar(raw); ok {
				d.meta[metaKey(key)] = v
			}
		default:
			if err := d.skip(); err != nil {
				return err
			}
		}
	}
	_, err := d.token() // '}'
	return err
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

// skip reads one value of any size by its tokens, holding none whole.
func (d *decoder) skip() error {
	depth := 0
	for {
		t, err := d.token()
		if err != nil {
			return err
		}
		switch t {
		case json.Delim('['), json.Delim('{'):
			depth++
		case json.Delim(']'), json.Delim('}'):
			depth--
		}
		if depth == 0 {
			return nil
		}
	}
}

var (
	memoryName = []byte(`"[memory]"`)
	oomName    = []byte(`"[OutOfMemory]"`)
)

// eventList reads the elements of traceEvents, after its '['.
func (d *decoder) eventList() error {
	d.list = true
	var raw json.RawMessage
	for d.dec.More() {
		raw = raw[:0]
		if err := d.dec.Decode(&raw); err != nil {
			return d.readError(err, true)
		}
		off := d.dec.InputOffset() - int64(len(raw))
		k := d.events
		d.events++
		// Only an event that names a memory event is decoded further.
		if !bytes.Contains(raw, memoryName) && !bytes.Contains(raw, oomName) {
			continue
		}
		if err := d.event(k, off, raw); err != nil {
			return err
		}
	}
	_, err := d.token() // ']'
	return err
}

// event reads traceEvents[k], which starts at byte off.
func (d *decoder) event(k, off int64, raw json.RawMessage) error {
	var ev memoryEvent
	if raw[0] != '{' || json.Unmarshal(raw, &ev) != nil {
		return nil // not an event object; one that is not ours is left alone
	}
	var name string
	if json.Unmarshal(ev.Name, &name) != nil || (name != "[memory]" && name != "[OutOfMemory]") {
		return nil
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%s: traceEvents[%d] (a %s event at %s): %s", d.name, k, name, d.where(off), fmt.Sprintf(format, args...))
	}
	if len(ev.RawArgs) == 0 {
		return bad("no args")
	}
	if json.Unmarshal(ev.RawArgs, &ev.Args) != nil || ev.Args == nil {
		return bad("its args %s are not an object", abbreviate(ev.RawArgs))
	}
	field := func(key string) (json.RawMessage, error) {
		v, ok := ev.Args[key]
		if !ok {
			return nil, bad("no %q in its args", key)
		}
		return v, nil
	}
	integer := func(key string, lo, hi int64) (int64, error) {
		v, err := field(key)
		if err != nil {
			return 0, err
		}
		n, err := strconv.ParseInt(string(v), 10, 64)
		if err != nil || n < lo || n > hi {
			return 0, bad("%q is %s, want an integer from %d to %d", key, abbreviate(v), lo, hi)
		}
		return n, nil
	}
	typ, err := integer("Device Type", math.MinInt64, math.MaxInt64)
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
	dev, err := integer("Device Id", 0, math.MaxInt32)
	if err != nil {
		return err
	}
	var r record
	r.offset = off
	n, err := integer("Bytes", -maxValue, maxValue)
	if err != nil {
		return err
	}
	reserved, err := integer("Total Reserved", 0, maxValue)
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
		v, err := field("Addr")
		if err != nil {
			return err
		}
		if r.addr, err = address(v); err != nil {
			return bad("\"Addr\" is %s: %v", abbreviate(v), err)
		}
	}
	if len(ev.Ts) == 0 {
		return bad("no \"ts\"")
	}
	if r.time, err = micros(string(ev.Ts)); err != nil {
		return bad("\"ts\" is %s: %v", abbreviate(ev.Ts), err)
	}
	r.thread = thread(ev.Tid)
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
	if d.base > 0 && (last > math.MaxInt64-d.base || first < math.MinInt64+d.base) {
		return nil, fmt.Errorf("%s: baseTimeNanoseconds %d plus ts %d ns overflows", d.name, d.base, last)
	}
	s := &Source{recs: d.recs, base: d.base}
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
	if d.base > 0 {
		h.Metadata["base_time_ns"] = strconv.FormatInt(d.base, 10)
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

package pytorch

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/big"
	"math/rand"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/trace"
)

// tracesDir holds the real snapshots, outside the module.
const tracesDir = "../../../shared/traces"

func importFile(t testing.TB, path string, opts Options) (trace.Header, []trace.Event, error) {
	t.Helper()
	h, evs, _, err := importStacks(t, path, opts)
	return h, evs, err
}

// importStacks is importFile that also returns the source's stack table.
func importStacks(t testing.TB, path string, opts Options) (trace.Header, []trace.Event, *trace.Stacks, error) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	src, err := Import(f, filepath.Base(path), opts)
	if err != nil {
		return trace.Header{}, nil, nil, err
	}
	h, evs, err := drain(t, src)
	return h, evs, trace.StacksOf(src), err
}

func drain(t testing.TB, src trace.Source) (trace.Header, []trace.Event, error) {
	t.Helper()
	var evs []trace.Event
	for {
		ev, err := src.Next()
		if err == io.EOF {
			return src.Header(), evs, nil
		}
		if err != nil {
			t.Fatalf("Next after a successful Import: %v", err)
		}
		evs = append(evs, ev)
	}
}

// The events of testdata/tiny_*: see gen.py.
const (
	seg = 0x7f0000000000
	t0  = 1795945664154792 * 1000
)

var tinyEvents = []trace.Event{
	{Op: trace.OpSegmentAlloc, Addr: seg, Size: 2 << 20, Time: t0},
	{Op: trace.OpMalloc, Addr: seg, Size: 1000, Time: t0 + 1000, Stack: 1}, // model.py:42:forward
	{Op: trace.OpMalloc, Addr: 1<<63 + 0x200, Size: 512, Stream: 7, Time: t0 + 2000},
	{Op: trace.OpFreeRequested, Addr: seg, Size: 1000, Time: t0 + 3000},
	{Op: trace.OpFree, Addr: seg, Size: 1000, Time: t0 + 4000},
	{Op: trace.OpMallocFailed, Size: 1 << 40, Time: t0 + 5000},
	{Op: trace.OpMarker, Label: "snapshot", Time: t0 + 6000},
	{Op: trace.OpSegmentMap, Addr: seg + 2<<20, Size: 2 << 20, Time: t0 + 7000},
	{Op: trace.OpSegmentUnmap, Addr: seg + 2<<20, Size: 2 << 20, Time: t0 + 8000},
	{Op: trace.OpSegmentFree, Addr: seg, Size: 2 << 20, Time: t0 + 9000},
	{Op: trace.OpMalloc, Addr: math.MaxUint64, Size: 1, Stream: math.MaxUint64, Time: t0 + 10000},
}

var tinySettings = map[string]string{
	"PYTORCH_CUDA_ALLOC_CONF":      "expandable_segments:True,max_split_size_mb:128",
	"max_split_size":               "134217728",
	"garbage_collection_threshold": "0.6",
	"expandable_segments":          "true",
	"release_lock_on_cudamalloc":   "false",
	"roundup_power2_divisions":     "1:0,2:0,4:1,16:2,32768:8",
}

func TestImportTiny(t *testing.T) {
	for _, file := range []string{"tiny_proto2.pickle", "tiny_proto5.pickle", "tiny_proto4.pickle.gz"} {
		t.Run(file, func(t *testing.T) {
			path := filepath.Join("testdata", file)
			h, evs, st, err := importStacks(t, path, Options{})
			if err != nil {
				t.Fatal(err)
			}
			// The first alloc's frames, the only ones (gen.py).
			wantStack := []trace.Frame{{Name: "forward", File: "model.py", Line: 42}}
			if got := st.Frames(1); st.Len() != 1 || !reflect.DeepEqual(got, wantStack) {
				t.Errorf("%d stacks, stack 1 = %v, want 1 stack: %v", st.Len(), got, wantStack)
			}
			want := trace.Header{
				Version:  trace.Version,
				Source:   "pytorch",
				Settings: tinySettings,
				Metadata: map[string]string{"device": "0", "devices": "2", "entries": "11", "segments": "1"},
			}
			if !reflect.DeepEqual(h, want) {
				t.Errorf("header:\n got %+v\nwant %+v", h, want)
			}
			compareEvents(t, evs, tinyEvents)

			h, evs, err = importFile(t, path, Options{Device: 1})
			if err != nil {
				t.Fatal(err)
			}
			compareEvents(t, evs, []trace.Event{{Op: trace.OpMalloc, Addr: 0x1000, Size: 4096, Time: t0}})
			if h.Metadata["device"] != "1" || h.Metadata["entries"] != "1" {
				t.Errorf("device 1 metadata = %v", h.Metadata)
			}

			_, _, err = importFile(t, path, Options{Device: 2})
			wantErr := file + ": snapshot has 2 device trace(s), --device 2 asked for"
			if err == nil || err.Error() != wantErr {
				t.Errorf("device 2: error %v, want %q", err, wantErr)
			}
		})
	}
}

func compareEvents(t *testing.T, got, want []trace.Event) {
	t.Helper()
	if reflect.DeepEqual(got, want) {
		return
	}
	var g, w strings.Builder
	for _, ev := range got {
		g.WriteString(trace.FormatText(ev) + "\n")
	}
	for _, ev := range want {
		w.WriteString(trace.FormatText(ev) + "\n")
	}
	t.Errorf("events:\n got:\n%s want:\n%s", g.String(), w.String())
}

// opCounts are the counts of each action in device_traces[0] of the real
// snapshots, computed with python3's pickle.
var opCounts = map[string]map[trace.Op]int{
	"pytorch/train_gpt": {
		trace.OpSegmentAlloc: 125, trace.OpMalloc: 8834, trace.OpFreeRequested: 8831, trace.OpFree: 8831},
	"pytorch/infer_dynbatch": {
		trace.OpSegmentAlloc: 30, trace.OpMalloc: 16956, trace.OpFreeRequested: 16954, trace.OpFree: 16954},
	"pytorch/infer_dynbatch_expandable": {
		trace.OpSegmentMap: 31, trace.OpMalloc: 16956, trace.OpFreeRequested: 16954, trace.OpFree: 16954},
	"pytorch/kv_decode": {
		trace.OpSegmentAlloc: 29, trace.OpMalloc: 241004, trace.OpFreeRequested: 241002, trace.OpFree: 241002},
	"pytorch/hf_llama_train": {
		trace.OpSegmentAlloc: 153, trace.OpMalloc: 16401, trace.OpFreeRequested: 16399, trace.OpFree: 16399},
	"pytorch/hf_generate": {
		trace.OpSegmentAlloc: 44, trace.OpMalloc: 257041, trace.OpFreeRequested: 257040, trace.OpFree: 257040},
	"pytorch_stacks/readme_job": {
		trace.OpSegmentAlloc: 146, trace.OpMalloc: 3158, trace.OpFreeRequested: 3155, trace.OpFree: 3155},
	"pytorch/multistream": {
		trace.OpSegmentAlloc: 23, trace.OpMalloc: 1403, trace.OpFreeRequested: 1401, trace.OpFree: 1376},
	"pytorch_cases/conv_forward": {
		trace.OpSegmentAlloc: 7, trace.OpMalloc: 46, trace.OpFreeRequested: 44, trace.OpFree: 44},
	"pytorch_cases/growing_batch": {
		trace.OpSegmentAlloc: 24, trace.OpMalloc: 60, trace.OpFreeRequested: 60, trace.OpFree: 60},
	"pytorch_cases/split_frag_oom": {
		trace.OpSegmentAlloc: 30, trace.OpMalloc: 45, trace.OpFreeRequested: 45, trace.OpFree: 45, trace.OpMallocFailed: 1},
	"pytorch_cases/token_lengths": {
		trace.OpSegmentAlloc: 18, trace.OpMalloc: 180, trace.OpFreeRequested: 180, trace.OpFree: 180},
}

// bigTraces have about 750k entries each; -short skips them.
var bigTraces = map[string]bool{"pytorch/kv_decode": true, "pytorch/hf_generate": true}

func realSnapshots(t *testing.T) []string {
	t.Helper()
	if _, err := os.Stat(tracesDir); err != nil {
		t.Skipf("no real traces: %v", err)
	}
	paths, err := filepath.Glob(filepath.Join(tracesDir, "*", "*.pickle.gz"))
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) == 0 {
		t.Skipf("no *.pickle.gz under %s", tracesDir)
	}
	return paths
}

// TestImportReal imports each real snapshot once and checks it against its
// stats.json and the action counts in opCounts.
func TestImportReal(t *testing.T) {
	for _, path := range realSnapshots(t) {
		key := filepath.Base(filepath.Dir(path)) + "/" + strings.TrimSuffix(filepath.Base(path), ".pickle.gz")
		t.Run(key, func(t *testing.T) {
			if testing.Short() && bigTraces[key] {
				t.Skip("large trace; skipped under -short")
			}
			var stats struct {
				TraceEntries *int    `json:"trace_entries"`
				AllocConf    *string `json:"alloc_conf"`
			}
			raw, err := os.ReadFile(strings.TrimSuffix(path, ".pickle.gz") + ".stats.json")
			if err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(raw, &stats); err != nil {
				t.Fatal(err)
			}
			if stats.AllocConf == nil {
				t.Fatal("stats.json lacks alloc_conf")
			}
			if stats.TraceEntries == nil {
				// The README recipe's recording has the real figures
				// only; its entries are counted in opCounts.
				want, ok := opCounts[key]
				if !ok {
					t.Fatal("stats.json lacks trace_entries and opCounts has no counts")
				}
				n := 0
				for _, c := range want {
					n += c
				}
				stats.TraceEntries = &n
			}
			h, evs, err := importFile(t, path, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if len(evs) != *stats.TraceEntries {
				t.Errorf("%d events, stats.json trace_entries = %d", len(evs), *stats.TraceEntries)
			}
			if h.Source != "pytorch" || h.Version != trace.Version {
				t.Errorf("header source %q version %d", h.Source, h.Version)
			}
			if conf, ok := h.Settings["PYTORCH_CUDA_ALLOC_CONF"]; !ok || conf != *stats.AllocConf {
				t.Errorf("PYTORCH_CUDA_ALLOC_CONF = %q (present %v), stats.json alloc_conf = %q", conf, ok, *stats.AllocConf)
			}
			if got := h.Metadata["entries"]; got != strconv.Itoa(*stats.TraceEntries) {
				t.Errorf("metadata entries = %q", got)
			}
			counts := map[trace.Op]int{}
			for _, ev := range evs {
				counts[ev.Op]++
			}
			if want, ok := opCounts[key]; ok {
				if !reflect.DeepEqual(counts, want) {
					t.Errorf("op counts\n got %v\nwant %v", counts, want)
				}
			} else {
				t.Logf("no expected op counts for %s; got %v", key, counts)
			}
			if key == "pytorch_cases/split_frag_oom" {
				want := trace.Event{Op: trace.OpMallocFailed, Size: 1572864000, Time: 1795945664154792000}
				found := false
				for _, ev := range evs {
					if ev.Op == trace.OpMallocFailed {
						found = true
						if ev != want {
							t.Errorf("oom event %s, want %s", trace.FormatText(ev), trace.FormatText(want))
						}
					}
				}
				if !found {
					t.Error("no malloc_failed event")
				}
			}
		})
	}
}

// pk writes protocol-2 pickles of plain values for the bad-input tests:
// dict (as []kv, keeping order), list ([]any), str, int, int64, *big.Int,
// bool, nil, float64.
type kv struct {
	k string
	v any
}

// tuple is a Python tuple for pickleValue.
type tuple []any

func pickleOf(v any) []byte {
	var b bytes.Buffer
	b.Write([]byte{0x80, 2})
	pickleValue(&b, v)
	b.WriteByte('.')
	return b.Bytes()
}

func pickleValue(b *bytes.Buffer, v any) {
	switch x := v.(type) {
	case nil:
		b.WriteByte('N')
	case bool:
		if x {
			b.WriteByte(0x88)
		} else {
			b.WriteByte(0x89)
		}
	case string:
		b.WriteByte('X')
		binary.Write(b, binary.LittleEndian, uint32(len(x)))
		b.WriteString(x)
	case int:
		pickleValue(b, int64(x))
	case int64:
		if x >= math.MinInt32 && x <= math.MaxInt32 {
			b.WriteByte('J')
			binary.Write(b, binary.LittleEndian, int32(x))
		} else {
			b.Write([]byte{0x8a, 8})
			binary.Write(b, binary.LittleEndian, x)
		}
	case *big.Int: // non-negative only
		le := x.Bytes()
		for i, j := 0, len(le)-1; i < j; i, j = i+1, j-1 {
			le[i], le[j] = le[j], le[i]
		}
		if len(le) == 0 || le[len(le)-1]&0x80 != 0 {
			le = append(le, 0)
		}
		b.Write([]byte{0x8a, byte(len(le))})
		b.Write(le)
	case float64:
		b.WriteByte('G')
		binary.Write(b, binary.BigEndian, math.Float64bits(x))
	case []kv:
		b.WriteString("}(")
		for _, e := range x {
			pickleValue(b, e.k)
			pickleValue(b, e.v)
		}
		b.WriteByte('u')
	case []any:
		b.WriteString("](")
		for _, e := range x {
			pickleValue(b, e)
		}
		b.WriteByte('e')
	case tuple:
		b.WriteByte('(')
		for _, e := range x {
			pickleValue(b, e)
		}
		b.WriteByte('t')
	default:
		panic("pickleValue: unsupported type")
	}
}

// snap returns a pickled snapshot whose only device trace is entries.
func snap(entries ...any) []byte {
	return pickleOf([]kv{{"segments", []any{}}, {"device_traces", []any{entries}}})
}

func alloc(fields ...kv) []kv {
	e := []kv{{"action", "alloc"}, {"addr", 4096}, {"size", 512}, {"stream", 0}, {"time_us", 1}}
	for _, f := range fields {
		for i := range e {
			if e[i].k == f.k {
				e[i].v = f.v
			}
		}
	}
	return e
}

func gz(b []byte) []byte {
	var out bytes.Buffer
	w := gzip.NewWriter(&out)
	w.Write(b)
	w.Close()
	return out.Bytes()
}

func TestImportBad(t *testing.T) {
	rnd := rand.New(rand.NewSource(1))
	random := make([]byte, 4096)
	rnd.Read(random)
	random[0] = 'r' // neither gzip nor PROTO, whatever the seed
	pickleGarbage := append([]byte{0x80, 4}, random...)

	tiny5, err := os.ReadFile("testdata/tiny_proto5.pickle")
	if err != nil {
		t.Fatal(err)
	}
	tinyGz, err := os.ReadFile("testdata/tiny_proto4.pickle.gz")
	if err != nil {
		t.Fatal(err)
	}
	two64 := new(big.Int).Lsh(big.NewInt(1), 64)

	for _, tc := range []struct {
		name  string
		data  []byte
		want  string // the whole message, or with a leading "~" a substring
		is    error  // if non-nil, errors.Is must hold
		isNot bool
	}{
		{name: "empty.pickle", data: nil,
			want: "empty.pickle: not a PyTorch snapshot (empty file)", is: ErrNotSnapshot},
		{name: "one.pickle", data: []byte{0x80},
			want: "one.pickle: not a PyTorch snapshot (a file of 1 byte)", is: ErrNotSnapshot},
		{name: "random.bin", data: random,
			want: "~random.bin: not a PyTorch snapshot (file starts with 72 ", is: ErrNotSnapshot},
		{name: "proto6.pickle", data: []byte{0x80, 6, 'N', '.'},
			want: "proto6.pickle: not a PyTorch snapshot (file is a pickle of protocol 6, want 2..5)", is: ErrNotSnapshot},
		{name: "proto1.pickle.gz", data: gz([]byte{0x80, 1, 'N', '.'}),
			want: "proto1.pickle.gz: not a PyTorch snapshot (gzip content is a pickle of protocol 1, want 2..5)", is: ErrNotSnapshot},
		{name: "empty.gz", data: gz(nil),
			want: "empty.gz: not a PyTorch snapshot (gzip content is empty)", is: ErrNotSnapshot},
		{name: "text.gz", data: gz([]byte("hello")),
			want: "text.gz: not a PyTorch snapshot (gzip content starts with 68 65 6c 6c at byte 0, not a pickle of protocol 2..5)", is: ErrNotSnapshot},
		{name: "garbage.pickle", data: pickleGarbage, want: "~garbage.pickle: "},
		{name: "badgzip.gz", data: []byte{0x1f, 0x8b, 0, 0, 0, 0, 0, 0, 0, 0},
			want: "badgzip.gz: bad gzip at pickle byte 0: gzip: invalid header"},
		{name: "half.pickle", data: tiny5[:len(tiny5)/2],
			want: "~half.pickle: truncated snapshot at pickle byte ", is: io.ErrUnexpectedEOF},
		{name: "nostop.pickle", data: tiny5[:len(tiny5)-1],
			want: "nostop.pickle: truncated snapshot at pickle byte 1318: unexpected EOF", is: io.ErrUnexpectedEOF},
		{name: "half.pickle.gz", data: tinyGz[:len(tinyGz)/2],
			want: "~half.pickle.gz: truncated snapshot at pickle byte ", is: io.ErrUnexpectedEOF},
		{name: "list.pickle", data: []byte("\x80\x02]q\x00."),
			want: "list.pickle: not a PyTorch snapshot (the pickle holds a list, want a dict)", is: ErrNotSnapshot},
		{name: "dict.pickle", data: pickleOf([]kv{{"a", 1}}),
			want: "dict.pickle: not a PyTorch snapshot (a dict without device_traces or segments, from pickle byte 0)", is: ErrNotSnapshot},
		{name: "no_device_traces.pickle", data: mustRead(t, "testdata/no_device_traces.pickle"),
			want: "no_device_traces.pickle: snapshot has no device_traces (recorded without _record_memory_history?): no such key in the top-level dict, from pickle byte 0"},
		{name: "unknown_action.pickle", data: mustRead(t, "testdata/unknown_action.pickle"),
			want: `unknown_action.pickle: device_traces[0] entry 1: unknown action "resize"`, is: ErrUnknownAction},
		{name: "traces_dict.pickle", data: pickleOf([]kv{{"device_traces", []kv{}}}),
			want: "traces_dict.pickle: device_traces is a dict, want a list"},
		{name: "no_devices.pickle", data: pickleOf([]kv{{"device_traces", []any{}}}),
			want: "no_devices.pickle: snapshot has 0 device trace(s), --device 0 asked for"},
		{name: "entry_list.pickle", data: snap(alloc(), []any{1}),
			want: "entry_list.pickle: device_traces[0] entry 1: is a list, want a dict"},
		{name: "no_action.pickle", data: snap([]kv{{"addr", 1}}),
			want: "no_action.pickle: device_traces[0] entry 0: no action"},
		{name: "int_action.pickle", data: snap(alloc(kv{"action", 3})),
			want: "int_action.pickle: device_traces[0] entry 0: action is a int, want a str"},
		{name: "addr2^64.pickle", data: snap(alloc(), alloc(kv{"addr", two64})),
			want: "addr2^64.pickle: device_traces[0] entry 1: addr 18446744073709551616 does not fit in 64 bits unsigned"},
		{name: "negsize.pickle", data: snap(alloc(kv{"size", -5})),
			want: "negsize.pickle: device_traces[0] entry 0: size -5 is negative"},
		{name: "straddr.pickle", data: snap(alloc(kv{"addr", "0x10"})),
			want: "straddr.pickle: device_traces[0] entry 0: addr is a str, want an int"},
		{name: "nosize.pickle", data: snap([]kv{{"action", "free_completed"}, {"addr", 1}}),
			want: "nosize.pickle: device_traces[0] entry 0: free_completed without size"},
		{name: "noaddr.pickle", data: snap([]kv{{"action", "segment_alloc"}, {"size", 1}}),
			want: "noaddr.pickle: device_traces[0] entry 0: segment_alloc without addr"},
		{name: "time.pickle", data: snap(alloc(kv{"time_us", int64(math.MaxInt64 / 100)})),
			want: "time.pickle: device_traces[0] entry 0: time_us 92233720368547758 overflows int64 nanoseconds"},
		{name: "bigtime.pickle", data: snap(alloc(kv{"time_us", two64})),
			want: "bigtime.pickle: device_traces[0] entry 0: time_us 18446744073709551616 does not fit in 64 bits signed"},
		{name: "settings.pickle", data: pickleOf([]kv{{"device_traces", []any{[]any{}}}, {"allocator_settings", []any{}}}),
			want: "settings.pickle: allocator_settings is a list, want a dict"},
		{name: "hugeframe.pickle", data: []byte("\x80\x04\x95\xff\xff\xff\xff\xff\x00\x00\x00N."),
			want: "hugeframe.pickle: truncated snapshot at pickle byte 13: unexpected EOF", is: io.ErrUnexpectedEOF},
		{name: "opcode.pickle", data: []byte("\x80\x04\xffN."),
			want: "opcode.pickle: bad pickle at byte 2: opcode 0xff: unknown opcode"},
		// A LONG1 of 0 bytes is Python's 0 (which Python itself writes as
		// BININT1); gopickle, the decoder once used here, panicked on it.
		{name: "long0.pickle", data: []byte("\x80\x02\x8a\x00."),
			want: "long0.pickle: not a PyTorch snapshot (the pickle holds a int, want a dict)", is: ErrNotSnapshot},
		{name: "stack.pickle", data: []byte("\x80\x04s."), want: "stack.pickle: bad pickle at byte 2: opcode 0x73: stack underflow"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src, err := Import(bytes.NewReader(tc.data), tc.name, Options{})
			if err == nil {
				t.Fatalf("no error; header %+v", src.Header())
			}
			msg := err.Error()
			if sub, ok := strings.CutPrefix(tc.want, "~"); ok {
				if !strings.HasPrefix(msg, sub) {
					t.Errorf("error %q, want it to start with %q", msg, sub)
				}
			} else if msg != tc.want {
				t.Errorf("error\n got %q\nwant %q", msg, tc.want)
			}
			if strings.ContainsAny(msg, "\n\r") {
				t.Errorf("error spans lines: %q", msg)
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Errorf("errors.Is(%q, %v) = false", msg, tc.is)
			}
		})
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestImportTruncatedReal cuts a real .pickle.gz in the middle.
func TestImportTruncatedReal(t *testing.T) {
	src := filepath.Join(tracesDir, "pytorch", "train_gpt.pickle.gz")
	data, err := os.ReadFile(src)
	if err != nil {
		t.Skipf("no real trace: %v", err)
	}
	path := filepath.Join(t.TempDir(), "x.pickle.gz")
	if err := os.WriteFile(path, data[:len(data)/2], 0o644); err != nil {
		t.Fatal(err)
	}
	_, _, err = importFile(t, path, Options{})
	if err == nil {
		t.Fatal("no error")
	}
	if !errors.Is(err, io.ErrUnexpectedEOF) || !strings.HasPrefix(err.Error(), "x.pickle.gz: truncated snapshot at pickle byte ") ||
		!strings.HasSuffix(err.Error(), ": unexpected EOF") {
		t.Errorf("error %q", err)
	}
}

func TestDetect(t *testing.T) {
	for _, tc := range []struct {
		head []byte
		want bool
	}{
		{nil, false},
		{[]byte{0x1f}, false},
		{[]byte{0x1f, 0x8b}, true},
		{[]byte{0x1f, 0x8b, 8, 0}, true},
		{[]byte{0x80, 1}, false},
		{[]byte{0x80, 2}, true},
		{[]byte{0x80, 4, 0x95}, true},
		{[]byte{0x80, 5}, true},
		{[]byte{0x80, 6}, false},
		{[]byte("header source=text"), false},
		{[]byte("PK\x03\x04"), false},
	} {
		if got := Detect(tc.head); got != tc.want {
			t.Errorf("Detect(% x) = %v, want %v", tc.head, got, tc.want)
		}
	}
	for _, file := range []string{"tiny_proto2.pickle", "tiny_proto5.pickle", "tiny_proto4.pickle.gz"} {
		if !Detect(mustRead(t, filepath.Join("testdata", file))) {
			t.Errorf("Detect(%s) = false", file)
		}
	}
}

func TestFormatValue(t *testing.T) {
	for _, tc := range []struct {
		v    any
		want string
	}{
		{nil, ""},
		{true, "true"},
		{-1, "-1"},
		{0.0, "0"},
		{0.6, "0.6"},
		{"x", "x"},
	} {
		if got := formatValue(tc.v); got != tc.want {
			t.Errorf("formatValue(%#v) = %q, want %q", tc.v, got, tc.want)
		}
	}
}

// TestImportCyclicSettings: a settings value that contains itself (the
// pickle memo allows it) is cut off, not followed forever.
func TestImportCyclicSettings(t *testing.T) {
	var b bytes.Buffer
	b.Write([]byte{0x80, 2, '}', '('})
	pickleValue(&b, "device_traces")
	pickleValue(&b, []any{[]any{}})
	pickleValue(&b, "allocator_settings")
	b.WriteString("}(")
	pickleValue(&b, "a")
	b.WriteString("]q\x00h\x00a") // l = []; l.append(l)
	b.WriteString("uu.")
	src, err := Import(&b, "cyclic.pickle", Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Repeat("[", maxDepth) + "..." + strings.Repeat("]", maxDepth)
	if got := src.Header().Settings["a"]; got != want {
		t.Errorf("setting a = %q, want %q", got, want)
	}
}

// TestImportSharedSettings: a settings list that holds one long string many
// times (by memo reference) is cut off at maxSettingLen.
func TestImportSharedSettings(t *testing.T) {
	var b bytes.Buffer
	b.Write([]byte{0x80, 2, '}', '('})
	pickleValue(&b, "device_traces")
	pickleValue(&b, []any{[]any{}})
	pickleValue(&b, "allocator_settings")
	b.WriteString("}(")
	pickleValue(&b, "a")
	b.WriteString("](")
	pickleValue(&b, strings.Repeat("x", 10000))
	b.WriteString("q\x00")
	b.WriteString(strings.Repeat("h\x00", 1000))
	b.WriteString("euu.")
	src, err := Import(&b, "shared.pickle", Options{})
	if err != nil {
		t.Fatal(err)
	}
	got := src.Header().Settings["a"]
	if len(got) > maxSettingLen+20000 || !strings.HasSuffix(got, ",...,...]") {
		t.Errorf("setting a has %d bytes, ends %q", len(got), got[max(0, len(got)-20):])
	}
}

// FuzzImport demands only that Import never panics and that its errors are
// one line naming the file.
func FuzzImport(f *testing.F) {
	for _, file := range []string{"tiny_proto2.pickle", "tiny_proto5.pickle", "tiny_proto4.pickle.gz", "unknown_action.pickle"} {
		b, err := os.ReadFile(filepath.Join("testdata", file))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add(snap(alloc(kv{"addr", new(big.Int).Lsh(big.NewInt(1), 64)})))
	// A cut history, with a final segment, for the reconstruction.
	f.Add(pickleOf([]kv{
		{"segments", []any{segDict(0x7f0000000000, 20<<20, "large", [3]any{4 << 20, 1000, "active_allocated"}, [3]any{16 << 20, 0, "inactive"})}},
		{"device_traces", []any{[]any{entry("free_completed", 0x7f0000400000, 3<<20), entry("segment_free", 0x7f0002000000, 2<<20)}}},
	}))
	// Private pools: their inference (pools.go).
	pools, _ := poolsSnapshot()
	f.Add(pools)
	// The opcodes of protocol 0 and the containers made from a mark.
	f.Add([]byte("\x80\x02(dp0\nVdevice_traces\np1\n((lp2\nlp3\nsVallocator_settings\n(dVa\nI01\n" +
		"sVd\n(I1\nI2\ntsVg\n\x8f(K\x01\x90sVl\ng3\nss."))
	f.Fuzz(func(t *testing.T, data []byte) {
		src, err := Import(bytes.NewReader(data), "f", Options{})
		if err != nil {
			if msg := err.Error(); !strings.HasPrefix(msg, "f: ") || strings.ContainsAny(msg, "\n\r") {
				t.Errorf("bad error %q", msg)
			}
			return
		}
		for {
			if _, err := src.Next(); err != nil {
				if err != io.EOF {
					t.Errorf("Next: %v", err)
				}
				break
			}
		}
	})
}

// BenchmarkImportKVDecode imports the largest real snapshot from memory
// and reads every event (Import reads the pickle twice: once in Import,
// once as the events are read).
func BenchmarkImportKVDecode(b *testing.B) {
	data, err := os.ReadFile(filepath.Join(tracesDir, "pytorch", "kv_decode.pickle.gz"))
	if err != nil {
		b.Skipf("no real trace: %v", err)
	}
	b.SetBytes(int64(len(data)))
	n := 0
	for b.Loop() {
		src, err := Import(bytes.NewReader(data), "kv_decode.pickle.gz", Options{})
		if err != nil {
			b.Fatal(err)
		}
		for n = 0; ; n++ {
			if _, err := src.Next(); err == io.EOF {
				break
			} else if err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/event")
}

// TestImportTrailing: nothing may follow a snapshot's STOP. Two snapshots
// one after the other (cat a.pickle b.pickle, or two gzip members) are
// refused as concatenated, naming the pickle byte where the second
// starts; other appended bytes are refused with their count. Before, the
// first snapshot was read alone and the rest ignored.
func TestImportTrailing(t *testing.T) {
	plain, err := os.ReadFile(filepath.Join("testdata", "tiny_proto5.pickle"))
	if err != nil {
		t.Fatal(err)
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(plain)
	zw.Close()
	n := len(plain)
	for _, tc := range []struct {
		name string
		data []byte
		want string
	}{
		{"two.pickle", append(append([]byte{}, plain...), plain...),
			fmt.Sprintf("two.pickle: a second pickle follows the snapshot at pickle byte %d (%d bytes): concatenated snapshots are refused; split them into one file each", n, n)},
		{"two.pickle.gz", append(append([]byte{}, gz.Bytes()...), gz.Bytes()...),
			fmt.Sprintf("two.pickle.gz: a second gzip stream follows the snapshot's (%d bytes after pickle byte %d): concatenated snapshots are refused; split them into one file each", gz.Len(), n)},
		// Bytes after the gzip stream: appended, not a truncated snapshot
		// (as it was called).
		{"tail.pickle.gz", append(append([]byte{}, gz.Bytes()...), "garbage"...),
			fmt.Sprintf("tail.pickle.gz: 7 bytes follow the snapshot's gzip stream (after pickle byte %d): appended data is refused", n)},
		{"tail.pickle", append(append([]byte{}, plain...), "junk\n"...),
			fmt.Sprintf("tail.pickle: 5 bytes follow the snapshot's end at pickle byte %d: appended data is refused", n)},
	} {
		path := filepath.Join(t.TempDir(), tc.name)
		if err := os.WriteFile(path, tc.data, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, _, err := importFile(t, path, Options{}); err == nil || err.Error() != tc.want {
			t.Errorf("%s: error %v\nwant %s", tc.name, err, tc.want)
		}
	}
}

// TestImportInconsistentStream: a flipped byte that moves a malloc to
// another stream than its free's (byte 20286 of churn's pickle, the
// stream of the alloc at 0x7fa9f6602600: 0 to 8) is an inconsistent
// snapshot; it changed the figures silently before.
func TestImportInconsistentStream(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "testdata", "pytorch", "churn.pickle.gz"))
	if err != nil {
		t.Fatal(err)
	}
	z, err := gzip.NewReader(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	data, err := io.ReadAll(z)
	if err != nil {
		t.Fatal(err)
	}
	if data[20286] != 0 {
		t.Fatalf("byte 20286 is %#x: not the stream the test flips", data[20286])
	}
	data[20286] ^= 8
	path := filepath.Join(t.TempDir(), "stream8.pickle")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	_, _, err = importFile(t, path, Options{})
	if err == nil || !strings.Contains(err.Error(), "inconsistent snapshot") || !strings.Contains(err.Error(), "on stream 0x0, which entry") {
		t.Errorf("error %v", err)
	}
}

// TestImportRepeatedKeys: a dict that sets a key again keeps its last
// value, as CPython's does, among kept settings (string keys, a known one
// among them, and an int key); a trace
// entry that has a key twice (two entries run together by a damaged byte:
// CPython's pickler writes a dict's keys once) is an error.
func TestImportRepeatedKeys(t *testing.T) {
	var b bytes.Buffer
	b.WriteString(settingsPrefix())
	// "size" (a known key) and "k" (another string), set twice; 7 an int key.
	b.WriteString("}(")
	for _, v := range []any{"size", 1, "k", 2, 7, 3, "size", 4, "k", 5, 7, 6} {
		pickleValue(&b, v)
	}
	b.WriteString("u" + settingsEnd)
	src, err := Import(&b, "repeated.pickle", Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := src.Header().Settings["a"], "7:6,k:5,size:4"; got != want {
		t.Errorf("setting a = %s, want %s", got, want)
	}

	entry := append(alloc(), kv{"size", 1024})
	_, err = Import(bytes.NewReader(snap(entry)), "twice.pickle", Options{})
	if want := `inconsistent snapshot: a trace entry has its key "size" twice`; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("error %v, want one with %q", err, want)
	}
}

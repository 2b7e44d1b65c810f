package cupy

import (
	"bytes"
	"errors"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/trace"
)

func importAll(t testing.TB, data []byte, opts Options) ([]trace.Event, error) {
	t.Helper()
	src, err := Import(bytes.NewReader(data), "log.jsonl", opts)
	if err != nil {
		return nil, err
	}
	var evs []trace.Event
	for {
		ev, err := src.Next()
		if err == io.EOF {
			return evs, nil
		}
		if err != nil {
			return evs, err
		}
		evs = append(evs, ev)
	}
}

// small is a log of two devices, as DebugPrintHook prints it: on device 0
// a device alloc and its malloc, a malloc of a cached chunk, a malloc of 0
// bytes, a failed malloc, a failed device alloc and two frees.
const small = `{"hook":"alloc","device_id":0,"mem_size":3584,"mem_ptr":139650121334784}
{"hook":"malloc","device_id":0,"size":3472,"mem_size":3584,"mem_ptr":139650121334784,"pmem_id":"0x7f04fe168710"}
{"hook":"alloc","device_id":1,"mem_size":512,"mem_ptr":139650000000000}
{"hook":"malloc","device_id":1,"size":1,"mem_size":512,"mem_ptr":139650000000000,"pmem_id":"0x7f04fe168800"}
{"hook":"free","device_id":0,"mem_size":3584,"mem_ptr":139650121334784,"pmem_id":"0x7f04fe168710"}

{"hook":"malloc","device_id":0,"size":1000,"mem_size":1024,"mem_ptr":139650121334784,"pmem_id":"0x7f04fe1687b0"}
{"hook":"malloc","device_id":0,"size":0,"mem_size":0,"mem_ptr":0,"pmem_id":"0x7ff2df766790"}
{"hook":"alloc","device_id":0,"mem_size":1073741824,"mem_ptr":0}
{"hook":"malloc","device_id":0,"size":1073741800,"mem_size":1073741824,"mem_ptr":0,"pmem_id":"0x0"}
{"hook":"free","device_id":0,"mem_size":1024,"mem_ptr":139650121334784,"pmem_id":"0x7f04fe1687b0"}
`

func TestImport(t *testing.T) {
	if !Detect([]byte(small)) {
		t.Fatal("Detect: false")
	}
	evs, err := importAll(t, []byte(small), Options{})
	if err != nil {
		t.Fatal(err)
	}
	const p = 139650121334784
	want := []trace.Event{
		{Op: trace.OpSegmentAlloc, Addr: p, Size: 3584},
		{Op: trace.OpMalloc, Addr: p, Size: 3472},
		{Op: trace.OpFree, Addr: p, Size: 3584},
		{Op: trace.OpMalloc, Addr: p, Size: 1000},
		{Op: trace.OpMallocFailed, Size: 1073741800},
		{Op: trace.OpFree, Addr: p, Size: 1024},
	}
	if !equal(evs, want) {
		t.Errorf("events:\n got %v\nwant %v", evs, want)
	}
	evs, err = importAll(t, []byte(small), Options{Device: 1})
	if err != nil {
		t.Fatal(err)
	}
	want = []trace.Event{
		{Op: trace.OpSegmentAlloc, Addr: 139650000000000, Size: 512},
		{Op: trace.OpMalloc, Addr: 139650000000000, Size: 1},
	}
	if !equal(evs, want) {
		t.Errorf("device 1:\n got %v\nwant %v", evs, want)
	}
	src, _ := Import(strings.NewReader(small), "log.jsonl", Options{})
	h := src.Header()
	if h.Source != "cupy" || h.Metadata["device_id"] != "0" {
		t.Errorf("header %+v", h)
	}
	for _, w := range []string{trace.UnrecordedStreams, trace.UnrecordedTimes, trace.UnrecordedSegmentFrees} {
		if !h.Unrecorded(w) {
			t.Errorf("header: %q not unrecorded (%q)", w, h.Metadata["unrecorded"])
		}
	}
}

func equal(a, b []trace.Event) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestNoSuchDevice: a log without lines of the device asked for names the
// devices it has, at its end.
func TestNoSuchDevice(t *testing.T) {
	_, err := importAll(t, []byte(small), Options{Device: 3})
	if err == nil || err.Error() != "log.jsonl: no line of device 3; the log has device_id 0, 1 (--device)" {
		t.Errorf("err = %v", err)
	}
	if _, err := Import(strings.NewReader(small), "log.jsonl", Options{Device: -1}); err == nil {
		t.Error("device -1 accepted")
	}
	// An empty log is an empty trace.
	if evs, err := importAll(t, nil, Options{Device: 2}); err != nil || len(evs) != 0 {
		t.Errorf("empty log: %v, %v", evs, err)
	}
}

// TestErrors: a bad line is a *trace.SyntaxError naming the file and the
// line, final, after the events of the lines before it.
func TestErrors(t *testing.T) {
	good := `{"hook":"alloc","device_id":0,"mem_size":512,"mem_ptr":1}` + "\n"
	for _, tc := range []struct {
		line, want string
	}{
		{`[1, 2]`, "log.jsonl:2: not a JSON object (a DebugPrintHook line starts with {)"},
		{`{"hook":"alloc",`, "log.jsonl:2: bad JSON at byte 16: unexpected end of JSON input"},
		{`{"device_id":0}`, `log.jsonl:2: no "hook"`},
		{`{"hook":"realloc","device_id":0,"mem_size":1,"mem_ptr":1}`, `log.jsonl:2: unknown hook "realloc" (want alloc, malloc or free)`},
		{`{"hook":"malloc","device_id":0,"mem_size":512,"mem_ptr":1}`, `log.jsonl:2: malloc line without "size"`},
		{`{"hook":"free","device_id":0,"mem_ptr":1}`, `log.jsonl:2: free line without "mem_size"`},
		{`{"hook":"free","device_id":0,"mem_size":-512,"mem_ptr":1}`, "log.jsonl:2: mem_size -512: want a non-negative integer below 2^64"},
		{`{"hook":"free","device_id":"0","mem_size":512,"mem_ptr":1}`, `log.jsonl:2: device_id "0": want a non-negative integer below 2^64`},
		{`{"hook":"free","device_id":0,"mem_size":512,"mem_ptr":18446744073709551616}`, "log.jsonl:2: mem_ptr 18446744073709551616: want a non-negative integer below 2^64"},
		{`{"hook":"free","device_id":0,"mem_size":5.12e2,"mem_ptr":1}`, "log.jsonl:2: mem_size 5.12e2: want a non-negative integer below 2^64"},
		{`{"hook":7,"device_id":0}`, "log.jsonl:2: bad line: json: cannot unmarshal number into Go struct field hookLine.hook of type string"},
		{strings.Repeat("x", maxLine+1), "log.jsonl:2: a line longer than 1048576 bytes: not a DebugPrintHook log"},
	} {
		t.Run(tc.want, func(t *testing.T) {
			src, _ := Import(strings.NewReader(good+tc.line+"\n"+good), "log.jsonl", Options{})
			if _, err := src.Next(); err != nil {
				t.Fatalf("line 1: %v", err)
			}
			_, err := src.Next()
			var se *trace.SyntaxError
			if !errors.As(err, &se) || err.Error() != tc.want {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
			if _, again := src.Next(); again != err {
				t.Errorf("error not final: then %v", again)
			}
		})
	}
}

// TestNUL: through a trace.LineReader, binary data is refused at its line.
func TestNUL(t *testing.T) {
	data := `{"hook":"alloc","device_id":0,"mem_size":512,"mem_ptr":1}` + "\n{\"ho\x00ok\"}\n"
	lr := trace.NewLineReader(strings.NewReader(data), "log.jsonl")
	src, _ := Import(lr, "log.jsonl", Options{})
	if _, err := src.Next(); err != nil {
		t.Fatal(err)
	}
	_, err := src.Next()
	if err == nil || !strings.HasPrefix(err.Error(), "log.jsonl:2: a NUL byte at byte offset 62") {
		t.Errorf("err = %v", err)
	}
}

// TestRecordings imports the H200 recordings of testdata/cupy: every line
// makes its event (the mallocs of 0 bytes and the failed device allocs
// aside), and the trace is valid.
func TestRecordings(t *testing.T) {
	for _, tc := range []struct {
		name                                   string
		segments, mallocs, failed, frees, zero int
	}{
		{"churn", 58, 600, 0, 600, 0},
		{"linalg", 15, 442, 0, 440, 4},
		{"churn_limit", 48, 595, 5, 595, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data, err := os.ReadFile("../../testdata/cupy/" + tc.name + ".jsonl")
			if err != nil {
				t.Fatal(err)
			}
			if !Detect(data) {
				t.Error("Detect: false")
			}
			evs, err := importAll(t, data, Options{})
			if err != nil {
				t.Fatal(err)
			}
			n := map[trace.Op]int{}
			for _, ev := range evs {
				n[ev.Op]++
			}
			if n[trace.OpSegmentAlloc] != tc.segments || n[trace.OpMalloc] != tc.mallocs || n[trace.OpMallocFailed] != tc.failed || n[trace.OpFree] != tc.frees {
				t.Errorf("ops %v", n)
			}
			if lines := bytes.Count(data, []byte("\n")); lines != len(evs)+tc.zero {
				t.Errorf("%d lines, %d events and %d mallocs of 0 bytes", lines, len(evs), tc.zero)
			}
			errs, err := trace.Validate(trace.NewSliceSource(trace.Header{}, evs), 10)
			if err != nil || len(errs) > 0 {
				t.Errorf("Validate: %v %v", errs, err)
			}
		})
	}
}

func TestDetect(t *testing.T) {
	for _, tc := range []struct {
		head string
		want bool
	}{
		{small, true},
		{"\xef\xbb\xbf\n  " + small, true},
		{`{"hook": "free", "device_id": 0}`, true},
		{`{"traceEvents": []}`, false},
		{"Thread,Time,Action,Pointer,Size,Stream\n", false},
		{"malloc id=1 size=4096\n", false},
		{"", false},
	} {
		if got := Detect([]byte(tc.head)); got != tc.want {
			t.Errorf("Detect(%.30q) = %v", tc.head, got)
		}
	}
}

// TestLiveMalloc: a malloc at the address of a live chunk, which a pool
// never makes, is refused at its line: two logs joined.
func TestLiveMalloc(t *testing.T) {
	malloc := `{"hook":"malloc","device_id":0,"size":100,"mem_size":512,"mem_ptr":4096,"pmem_id":"0x1"}` + "\n"
	free := `{"hook":"free","device_id":0,"mem_size":512,"mem_ptr":4096,"pmem_id":"0x1"}` + "\n"
	src, _ := Import(strings.NewReader(malloc+free+malloc+malloc), "log.jsonl", Options{})
	var err error
	for range 4 {
		if _, err = src.Next(); err != nil {
			break
		}
	}
	if err == nil || err.Error() != "log.jsonl:4: malloc at 0x1000, live since line 3: a pool never hands out a live chunk (two logs joined?)" {
		t.Errorf("err = %v", err)
	}
}

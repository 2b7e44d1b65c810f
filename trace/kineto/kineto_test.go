package kineto

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/trace"
)

// mem is a [memory] event of CUDA device 0 as Kineto writes it.
func mem(tid int, ts string, bytes int64, addr uint64, reserved uint64) string {
	return memOn(0, 1, tid, ts, bytes, addr, reserved)
}

// memOn is a [memory] event of device id on device type typ.
func memOn(id, typ, tid int, ts string, bytes int64, addr uint64, reserved uint64) string {
	return fmt.Sprintf(`{
    "ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]",
    "pid": 540, "tid": %d,
    "ts": %s,
    "args": {
      "Total Reserved": %d, "Total Allocated": 0, "Bytes": %d, "Device Id": %d, "Device Type": %d, "Addr": %d, "finished": false, "Ev Idx": 7
    }
  }`, tid, ts, reserved, bytes, id, typ, addr)
}

// oom is an [OutOfMemory] event of device 0.
func oom(ts string, bytes int64, reserved uint64) string {
	return fmt.Sprintf(`{"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[OutOfMemory]", "pid": 540, "tid": 540, "ts": %s,
    "args": {"Total Reserved": %d, "Total Allocated": 0, "Bytes": %d, "Device Id": 0, "Device Type": 1, "finished": false, "Ev Idx": 9}}`, ts, reserved, bytes)
}

// op is an operator event, which Import passes over.
func op(ts string) string {
	return fmt.Sprintf(`{"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": 540, "tid": 540, "ts": %s, "dur": 7.5,
    "args": {"External id": 518, "Record function id": 0, "Ev Idx": 5, "Input Dims": [[64, 1024], []], "Input type": ["float", ""]}}`, ts)
}

// traceOf is a trace of a device with memory bytes and the events evs.
func traceOf(memory uint64, evs ...string) string {
	return fmt.Sprintf(`
{
  "schemaVersion": 1,
  "deviceProperties": [
    {
      "id": 0, "name": "NVIDIA H200", "totalGlobalMem": %d,
      "computeMajor": 9, "computeMinor": 0
    }
  ],
  "trace_id": "6B3B5AB2E25242B5A55196FFEE95EABD",
  "profile_memory": 1,
  "cuda_runtime_version": 13000,
  "displayTimeUnit": "ms",
  "baseTimeNanoseconds": 1000000,
  "traceEvents": [
  %s
  ],
  "traceName": "prof.pt.trace.json"
}`, memory, strings.Join(evs, ",\n  "))
}

const h200 = 150109880320

func importString(t *testing.T, in string, opts Options) (trace.Header, []string) {
	t.Helper()
	src, err := Import(strings.NewReader(in), "prof.json", opts)
	if err != nil {
		t.Fatal(err)
	}
	return src.Header(), drain(t, src)
}

func drain(t testing.TB, src trace.Source) []string {
	t.Helper()
	var out []string
	for {
		ev, err := src.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatalf("Next after a successful Import: %v", err)
		}
		out = append(out, trace.FormatText(ev))
	}
}

func gzipped(s string) []byte {
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	zw.Write([]byte(s))
	zw.Close()
	return b.Bytes()
}

// Hand-computed: every Time is baseTimeNanoseconds (1 ms) plus ts.
func TestImport(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      string
		opts    Options
		want    []string
		calls   string // Metadata "device_calls"
		unknown string // Metadata "unknown_frees"
	}{{
		// Out of order in the file, on two threads; a host event and one
		// of device 1 skipped; a release (empty_cache) before a free.
		name: "plain",
		in: traceOf(h200,
			mem(2, "15.000", 5*mib, 0x30000000, 23068672),
			mem(2, "13.000", -12*mib, 0x10000000, 14680064),
			op("9.5"),
			mem(2, "10.000", 12*mib, 0x10000000, 12*mib),
			memOn(-1, 0, 2, "12.500", 4096, 0x55d0c000, 0),
			mem(2, "12.250", 4096, 0x20001000, 14680064),
			mem(3, "11.500", 4096, 0x20000000, 14680064),
			mem(2, "14.000", -4096, 0x20000000, 2*mib),
			memOn(1, 1, 2, "12.600", 4096, 0x7000000, 2*mib)),
		want: []string{
			"segment_alloc addr=0x10000000 size=12582912 t=1010000 thread=2",
			"malloc addr=0x10000000 size=12582912 t=1010000 thread=2",
			"segment_alloc addr=0x20000000 size=2097152 t=1011500 thread=3",
			"malloc addr=0x20000000 size=4096 t=1011500 thread=3",
			"malloc addr=0x20001000 size=4096 t=1012250 thread=2",
			"free addr=0x10000000 size=12582912 t=1013000 thread=2",
			"segment_free addr=0x10000000 size=12582912 t=1014000 thread=2",
			"free addr=0x20000000 size=4096 t=1014000 thread=2",
			"segment_alloc addr=0x30000000 size=20971520 t=1015000 thread=2",
			"malloc addr=0x30000000 size=5242880 t=1015000 thread=2",
		},
		calls: "cudaMalloc segments, inferred from Total Reserved at every event",
	}, {
		// A release inside a malloc, whose new segment is where a released
		// one was, in PyTorch's order (the large pool by size, then the
		// small); an OOM that released a segment first.
		name: "release at a malloc, OOM",
		in: traceOf(h200,
			mem(1, "1", 20*mib, 0x10000000, 20*mib),
			mem(1, "2", 12*mib, 0x20000000, 32*mib),
			mem(1, "3", 1024, 0x30000000, 34*mib),
			mem(1, "4", 24*mib, 0x40000000, 58*mib),
			mem(1, "5", -20*mib, 0x10000000, 58*mib),
			mem(1, "6", -12*mib, 0x20000000, 58*mib),
			mem(1, "7", -1024, 0x30000000, 58*mib),
			mem(1, "8", 12*mib, 0x20000000, 36*mib),
			mem(1, "9", -12*mib, 0x20000000, 36*mib),
			oom("10", 100*mib, 24*mib)),
		want: []string{
			"segment_alloc addr=0x10000000 size=20971520 t=1001000 thread=1",
			"malloc addr=0x10000000 size=20971520 t=1001000 thread=1",
			"segment_alloc addr=0x20000000 size=12582912 t=1002000 thread=1",
			"malloc addr=0x20000000 size=12582912 t=1002000 thread=1",
			"segment_alloc addr=0x30000000 size=2097152 t=1003000 thread=1",
			"malloc addr=0x30000000 size=1024 t=1003000 thread=1",
			"segment_alloc addr=0x40000000 size=25165824 t=1004000 thread=1",
			"malloc addr=0x40000000 size=25165824 t=1004000 thread=1",
			"free addr=0x10000000 size=20971520 t=1005000 thread=1",
			"free addr=0x20000000 size=12582912 t=1006000 thread=1",
			"free addr=0x30000000 size=1024 t=1007000 thread=1",
			"segment_free addr=0x20000000 size=12582912 t=1008000 thread=1",
			"segment_free addr=0x10000000 size=20971520 t=1008000 thread=1",
			"segment_free addr=0x30000000 size=2097152 t=1008000 thread=1",
			"segment_alloc addr=0x20000000 size=12582912 t=1008000 thread=1",
			"malloc addr=0x20000000 size=12582912 t=1008000 thread=1",
			"free addr=0x20000000 size=12582912 t=1009000 thread=1",
			"segment_free addr=0x20000000 size=12582912 t=1010000 thread=540",
			"malloc_failed size=104857600 t=1010000 thread=540",
		},
		calls: "cudaMalloc segments, inferred from Total Reserved at every event",
	}, {
		// Expandable segments of a card of 8 GiB (ranges of 9 GiB): maps
		// of the pages a block lacks, the range given back once all its
		// pages are unmapped (and reserved again), a hole unmapped in the
		// middle and mapped again, the large pool released before the
		// small.
		name: "expandable",
		in: traceOf(8<<30,
			mem(1, "1", 12*mib, 0x100000000, 20*mib),
			mem(1, "2", 12*mib, 0x100c00000, 40*mib),
			mem(1, "3", 4096, 0x1000000000, 42*mib),
			mem(1, "4", -12*mib, 0x100000000, 42*mib),
			mem(1, "5", -12*mib, 0x100c00000, 42*mib),
			mem(1, "6", -4096, 0x1000000000, 2*mib),
			mem(1, "7", 12*mib, 0x100000000, 22*mib),
			mem(1, "8", 40*mib, 0x100c00000, 62*mib),
			mem(1, "9", 8*mib, 0x103400000, 62*mib),
			mem(1, "10", -40*mib, 0x100c00000, 62*mib),
			mem(1, "11", 4096, 0x1000000000, 42*mib),
			mem(1, "12", 30*mib, 0x100c00000, 62*mib)),
		want: []string{
			"segment_map addr=0x100000000 size=20971520 t=1001000 thread=1",
			"malloc addr=0x100000000 size=12582912 t=1001000 thread=1",
			"segment_map addr=0x101400000 size=20971520 t=1002000 thread=1",
			"malloc addr=0x100c00000 size=12582912 t=1002000 thread=1",
			"segment_map addr=0x1000000000 size=2097152 t=1003000 thread=1",
			"malloc addr=0x1000000000 size=4096 t=1003000 thread=1",
			"free addr=0x100000000 size=12582912 t=1004000 thread=1",
			"free addr=0x100c00000 size=12582912 t=1005000 thread=1",
			"segment_unmap addr=0x100000000 size=41943040 t=1006000 thread=1",
			"free addr=0x1000000000 size=4096 t=1006000 thread=1",
			"segment_map addr=0x100000000 size=20971520 t=1007000 thread=1",
			"malloc addr=0x100000000 size=12582912 t=1007000 thread=1",
			"segment_map addr=0x101400000 size=41943040 t=1008000 thread=1",
			"malloc addr=0x100c00000 size=41943040 t=1008000 thread=1",
			"malloc addr=0x103400000 size=8388608 t=1009000 thread=1",
			"free addr=0x100c00000 size=41943040 t=1010000 thread=1",
			"segment_unmap addr=0x101400000 size=20971520 t=1011000 thread=1",
			"segment_unmap addr=0x1000000000 size=2097152 t=1011000 thread=1",
			"segment_map addr=0x1000000000 size=2097152 t=1011000 thread=1",
			"malloc addr=0x1000000000 size=4096 t=1011000 thread=1",
			"segment_map addr=0x101400000 size=20971520 t=1012000 thread=1",
			"malloc addr=0x100c00000 size=31457280 t=1012000 thread=1",
		},
		calls: "expandable segments (a setting the trace does not record: replay with --set pytorch.expandable_segments=True), inferred from Total Reserved at every event",
	}, {
		// Reserved bytes neither model explains: from there, the drops
		// only, at address 0. The free of an address never allocated is
		// kept, and counted.
		name: "unexplained",
		in: traceOf(h200,
			mem(1, "1", 12*mib, 0x10000000, 12*mib),
			mem(1, "2", 4096, 0x20000000, 20000000),
			mem(1, "3", -12*mib, 0x10000000, 20000000-12*mib),
			mem(1, "4", 12*mib, 0x10000000, 20000000),
			mem(1, "5", -512, 0x90000000, 20000000)),
		want: []string{
			"segment_alloc addr=0x10000000 size=12582912 t=1001000 thread=1",
			"malloc addr=0x10000000 size=12582912 t=1001000 thread=1",
			"malloc addr=0x20000000 size=4096 t=1002000 thread=1",
			"segment_free size=12582912 t=1003000 thread=1",
			"free addr=0x10000000 size=12582912 t=1003000 thread=1",
			"malloc addr=0x10000000 size=12582912 t=1004000 thread=1",
			"free addr=0x90000000 size=512 t=1005000 thread=1",
		},
		calls: "cudaMalloc segments, inferred from Total Reserved up to event 2; from there only its drops, as segment_free of the bytes released " +
			"at address 0: no device calls explain Total Reserved from 12582912 to 20000000 bytes at event 2 (memory event 1, a malloc of 4096 bytes at 0x20000000, after byte ",
		unknown: "1",
	}, {
		// The bare array form; device 1 picked; a tid as a string, a ts
		// with more digits than nanoseconds and one with an exponent.
		name: "array, device 1",
		in: "[" + strings.Join([]string{
			memOn(0, 1, 5, "1", 4096, 0x10000, 2*mib),
			memOn(1, 1, 5, "2.0019", 4096, 0x20000, 2*mib),
			strings.Replace(memOn(1, 1, 5, "3e3", -4096, 0x20000, 2*mib), `"tid": 5`, `"tid": "77"`, 1),
		}, ",") + "]",
		opts: Options{Device: 1},
		want: []string{
			"segment_alloc addr=0x20000 size=2097152 t=2001 thread=5",
			"malloc addr=0x20000 size=4096 t=2001 thread=5",
			"free addr=0x20000 size=4096 t=3000000 thread=77",
		},
		calls: "cudaMalloc segments, inferred from Total Reserved at every event",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			for _, in := range []struct {
				what string
				b    []byte
			}{{"plain", []byte(tc.in)}, {"gzip", gzipped(tc.in)}} {
				src, err := Import(bytes.NewReader(in.b), "prof.json", tc.opts)
				if err != nil {
					t.Fatalf("%s: %v", in.what, err)
				}
				got := drain(t, src)
				if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
					t.Errorf("%s: events:\n%s\nwant:\n%s", in.what, strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
				}
				h := src.Header()
				if c := h.Metadata["device_calls"]; !strings.HasPrefix(c, tc.calls) {
					t.Errorf("%s: device_calls %q, want %q", in.what, c, tc.calls)
				}
				if u := h.Metadata["unknown_frees"]; u != tc.unknown {
					t.Errorf("%s: unknown_frees %q, want %q", in.what, u, tc.unknown)
				}
				if h.Source != "kineto" || !h.Unrecorded("streams") {
					t.Errorf("%s: source %q, unrecorded %q", in.what, h.Source, h.Metadata["unrecorded"])
				}
			}
		})
	}
}

// TestHeader: the device's name and memory, the counts of events kept and
// skipped, the time base.
func TestHeader(t *testing.T) {
	h, _ := importString(t, traceOf(h200,
		mem(1, "1", 4096, 0x10000, 2*mib),
		memOn(-1, 0, 1, "2", 64, 0x55d0c000, 0),
		memOn(1, 1, 1, "3", 4096, 0x20000, 2*mib),
		memOn(0, 7, 1, "4", 4096, 0x30000, 2*mib),
		op("5")), Options{})
	want := map[string]string{
		"format": "torch.profiler (Kineto) Chrome trace JSON", "device": "0", "device_memory": "150109880320",
		"memory_events": "1", "trace_events": "5", "host_events_skipped": "1", "other_device_events_skipped": "1",
		"devices": "0:1 1:1", "base_time_ns": "1000000", "schema_version": "1", "cuda_runtime_version": "13000",
		"display_time_unit": "ms", "trace_id": "6B3B5AB2E25242B5A55196FFEE95EABD",
		"device_calls": "cudaMalloc segments, inferred from Total Reserved at every event", "unrecorded": unrecorded,
	}
	if h.Source != "kineto" || h.Device != "NVIDIA H200" || h.DeviceMemory != 0 {
		t.Errorf("source %q, device %q, memory %d", h.Source, h.Device, h.DeviceMemory)
	}
	for k, v := range want {
		if h.Metadata[k] != v {
			t.Errorf("Metadata %q = %q, want %q", k, h.Metadata[k], v)
		}
	}
	for k := range h.Metadata {
		if _, ok := want[k]; !ok {
			t.Errorf("Metadata %q = %q: not expected", k, h.Metadata[k])
		}
	}
}

func TestErrors(t *testing.T) {
	ok := traceOf(h200, mem(1, "1", 4096, 0x10000, 2*mib))
	at := func(s, sub string) int { return strings.Index(s, sub) }
	badName := strings.Replace(ok, `"ts": 1`, `"ts": 1,,`, 1)
	noBytes := strings.Replace(ok, `"Bytes": 4096, `, ``, 1)
	for _, tc := range []struct {
		name, in string
		want     string // the whole message, or its start when it ends in "..."
		is       error
	}{
		{"empty", "", "prof.json: not a torch.profiler trace (an empty file)", ErrNotTrace},
		{"not JSON", "  \x80\x04K.", "prof.json: not a torch.profiler trace (not JSON at byte 2: invalid character '\\u0080' looking for beginning of value)", ErrNotTrace},
		{"a number", "17", "prof.json: not a torch.profiler trace (a JSON number at byte 0, not an object)", ErrNotTrace},
		{"no traceEvents", `{"schemaVersion": 1}`, "prof.json: not a torch.profiler trace (an object without traceEvents)", ErrNotTrace},
		{"traceEvents not an array", `{"traceEvents": 5}`, "prof.json: traceEvents at byte 16 is a JSON number, not an array", nil},
		{"bad key", `{"schemaVersion": 1,, "traceEvents": []}`, "prof.json: bad JSON at byte 20: invalid character ',' looking for beginning of object key string", nil},
		{"bad JSON", badName, fmt.Sprintf("prof.json: bad JSON at byte %d: invalid character ',' looking for beginning of object key string", at(badName, ",,")+1), nil},
		{"truncated", ok[:at(ok, `"Device Id"`)], fmt.Sprintf("prof.json: truncated trace at byte %d: unexpected EOF", at(ok, `"Device Id"`)), io.ErrUnexpectedEOF},
		{"truncated after the events", ok[:at(ok, `"traceName"`)], fmt.Sprintf("prof.json: truncated trace at byte %d: unexpected EOF", at(ok, `"traceName"`)), io.ErrUnexpectedEOF},
		{"bad JSON between events", strings.Replace(ok, `}
  ]`, `} x ]`, 1), fmt.Sprintf("prof.json: bad JSON at byte %d: invalid character 'x' after array element", at(strings.Replace(ok, `}
  ]`, `} x ]`, 1), "x ]")), nil},
		{"appended", ok + "\n{}", fmt.Sprintf("prof.json: a JSON object follows the trace's end at byte %d: appended data is refused", len(ok)), nil},
		{"no Bytes", noBytes, fmt.Sprintf("prof.json: traceEvents[0] (a [memory] event at byte %d): no \"Bytes\" in its args", at(noBytes, `{
    "ph": "i"`)), nil},
		{"no Addr", strings.Replace(ok, `"Addr": 65536`, `"Adr": 65536`, 1), "prof.json: traceEvents[0] (a [memory] event at byte ...): no \"Addr\" in its args", nil},
		{"no ts", strings.Replace(ok, `"ts": 1,`, ``, 1), "prof.json: traceEvents[0] (a [memory] event at byte ...): no \"ts\"", nil},
		{"bad ts", strings.Replace(ok, `"ts": 1,`, `"ts": "soon",`, 1), "prof.json: traceEvents[0] (a [memory] event at byte ...): \"ts\" is \"\\\"soon\\\"\": not a number of microseconds", nil},
		{"no args", strings.Replace(ok, `"args"`, `"argz"`, 1), "prof.json: traceEvents[0] (a [memory] event at byte ...): no args", nil},
		{"args not an object", traceOf(h200, `{"name": "[memory]", "ts": 1, "args": [1]}`), "prof.json: traceEvents[0] (a [memory] event at byte ...): its args \"[1]\" are not an object", nil},
		{"Bytes 0", strings.Replace(ok, `"Bytes": 4096`, `"Bytes": 0`, 1), "prof.json: traceEvents[0] (a [memory] event at byte ...): \"Bytes\" is 0: neither a malloc nor a free", nil},
		{"Bytes fraction", strings.Replace(ok, `"Bytes": 4096`, `"Bytes": 4096.5`, 1), "prof.json: traceEvents[0] (a [memory] event at byte ...): \"Bytes\" is \"4096.5\", want an integer from -4611686018427387904 to 4611686018427387904", nil},
		{"reserved negative", strings.Replace(ok, `"Total Reserved": 2097152`, `"Total Reserved": -1`, 1), "prof.json: traceEvents[0] (a [memory] event at byte ...): \"Total Reserved\" is \"-1\", want an integer from 0 to 4611686018427387904", nil},
		{"OOM without bytes", traceOf(h200, strings.Replace(oom("1", 4096, 0), `"Bytes": 4096`, `"Bytes": -4096`, 1)), "prof.json: traceEvents[0] (a [OutOfMemory] event at byte ...): \"Bytes\" is -4096, want the positive size of the failed request", nil},
		{"no memory events", traceOf(h200, op("1")), "prof.json: no memory events of a CUDA device among its 1 events (was it profiled with torch.profiler.profile(profile_memory=True)?)", ErrNoMemoryEvents},
		{"host only", traceOf(h200, memOn(-1, 0, 1, "1", 64, 0x5000, 0)), "prof.json: no memory events of a CUDA device among its 1 events (1 of host memory only)", ErrNoMemoryEvents},
		{"other device", traceOf(h200, memOn(2, 1, 1, "1", 64, 0x5000, 0), memOn(1, 1, 1, "1", 64, 0x5000, 0)), "prof.json: no memory events of CUDA device 0 (the trace has memory events of device 1, 2: --device picks one)", ErrNoMemoryEvents},
		{"base time", strings.Replace(ok, `"baseTimeNanoseconds": 1000000`, `"baseTimeNanoseconds": 1.5`, 1), "prof.json: baseTimeNanoseconds at byte ... is \"1.5\", not a count of nanoseconds", nil},
		{"time overflow", strings.Replace(strings.Replace(ok, `"baseTimeNanoseconds": 1000000`, `"baseTimeNanoseconds": 9000000000000000000`, 1), `"ts": 1,`, `"ts": 1000000000000000,`, 1),
			"prof.json: baseTimeNanoseconds 9000000000000000000 plus ts 1000000000000000000 ns overflows", nil},
		{"gzip truncated", string(gzipped(ok)[:60]), "prof.json: truncated ...", io.ErrUnexpectedEOF},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Import(strings.NewReader(tc.in), "prof.json", Options{})
			if err == nil {
				t.Fatalf("no error, want %q", tc.want)
			}
			msg := err.Error()
			if !like(msg, tc.want) {
				t.Errorf("error %q\nwant  %q", msg, tc.want)
			}
			if strings.ContainsAny(msg, "\n\r") {
				t.Errorf("error %q: more than one line", msg)
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Errorf("error %v: not %v", err, tc.is)
			}
		})
	}
}

// like reports whether msg is want, where each "..." of want stands for
// any text.
func like(msg, want string) bool {
	parts := strings.Split(want, "...")
	if !strings.HasPrefix(msg, parts[0]) {
		return false
	}
	msg = msg[len(parts[0]):]
	for _, p := range parts[1:] {
		k := strings.Index(msg, p)
		if k < 0 {
			return false
		}
		msg = msg[k+len(p):]
	}
	return msg == "" || strings.HasSuffix(want, "...")
}

// TestDetect: the first 512 bytes (what tracefile peeks) of a trace tell
// it, plain or gzip-compressed; a gzip'd pickle, a CSV, other JSON do not
// look like one.
func TestDetect(t *testing.T) {
	real, err := os.ReadFile("../../testdata/profiler/prof_mlp.pt.trace.json.gz")
	if err != nil {
		t.Fatal(err)
	}
	pickle, err := os.ReadFile("../pytorch/testdata/tiny_proto4.pickle.gz")
	if err != nil {
		t.Fatal(err)
	}
	head := func(b []byte) []byte { return b[:min(len(b), 512)] }
	in := traceOf(h200, mem(1, "1", 4096, 0x10000, 2*mib))
	for _, tc := range []struct {
		name string
		head []byte
		want bool
	}{
		{"real, gzip", head(real), true},
		{"plain", head([]byte(in)), true},
		{"gzip", head(gzipped(in)), true},
		{"traceEvents first", []byte(`{"traceEvents": [`), true},
		{"with a BOM", []byte("\xef\xbb\xbf  {\"schemaVersion\": 1,"), true},
		{"gzip'd pickle", head(pickle), false},
		{"other JSON", []byte(`{"kind": "sim", "version": 1}`), false},
		{"array", []byte(`[{"ph": "i"}]`), false},
		{"CSV", []byte("Thread,Time,Action,Pointer,Size,Stream\n"), false},
		{"empty", nil, false},
		{"gzip magic only", []byte{0x1f, 0x8b}, false},
	} {
		if got := Detect(tc.head); got != tc.want {
			t.Errorf("%s: Detect = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestNoPanicOnCut: every cut of a small trace, plain and compressed,
// imports or fails with one line naming the file.
func TestNoPanicOnCut(t *testing.T) {
	in := traceOf(8<<30,
		mem(1, "1", 12*mib, 0x100000000, 20*mib),
		mem(1, "2", -12*mib, 0x100000000, 0),
		oom("3", 100*mib, 0))
	for _, b := range [][]byte{[]byte(in), gzipped(in)} {
		for n := range len(b) {
			src, err := Import(bytes.NewReader(b[:n]), "cut.json", Options{})
			if err != nil {
				if msg := err.Error(); !strings.HasPrefix(msg, "cut.json: ") || strings.ContainsAny(msg, "\n\r") {
					t.Fatalf("cut at %d: error %q", n, msg)
				}
				continue
			}
			drain(t, src)
		}
	}
}

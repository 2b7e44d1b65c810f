package xspace

import (
	"bytes"
	"encoding/json"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/trace"
)

const limit = 1 << 30 // BFC's memory limit in the hand-built XSpaces

// importBytes imports the XSpace b as the file "test.xplane.pb".
func importBytes(b []byte, opts Options) (trace.Header, []string, error) {
	src, err := Import(bytes.NewReader(b), "test.xplane.pb", opts)
	if err != nil {
		return trace.Header{}, nil, err
	}
	var lines []string
	for _, ev := range src.Rest() {
		lines = append(lines, trace.FormatText(ev))
	}
	return src.Header(), lines, nil
}

// oneLine is a thread that mallocs two chunks and frees the first:
// BFC's 256-byte chunk for 4 bytes, then a 512-byte one for 300.
var oneLine = xplane{name: "/host:CPU", lines: []xline{{id: 7, ts: 1000, evs: []xevent{
	{name: "ThunkExecute", ps: 1_000},
	bfcEvent(true, 5_000, "GPU_0_bfc", 0x1000, 4, 256, 256, 256, limit),
	bfcEvent(true, 6_500, "GPU_0_bfc", 0x1100, 300, 512, 768, 768, limit),
	{name: "ThunkExecute", ps: 7_000, stats: []xstat{{"addr", 99}}},
	bfcEvent(false, 9_000, "GPU_0_bfc", 0x1000, 4, 256, 512, 768, limit),
}}}}

// header returns the metadata Import writes for events of GPU_0_bfc, with
// more over it.
func header(more map[string]string) map[string]string {
	md := map[string]string{"format": "XSpace (XLA profiler)", "allocator": "GPU_0_bfc", "device": "0", "allocated_at_start": "0", "unrecorded": "streams,device calls"}
	maps.Copy(md, more)
	return md
}

func TestImport(t *testing.T) {
	for _, tc := range []struct {
		name     string
		xspace   []byte
		opts     Options
		events   []string
		metadata map[string]string
		device   string
		memory   uint64
	}{
		{
			name:   "one thread",
			xspace: space(oneLine),
			events: []string{
				"malloc addr=0x1000 size=4 t=1005 thread=7",
				"malloc addr=0x1100 size=300 t=1006 thread=7",
				"free addr=0x1000 size=4 t=1009 thread=7",
			},
			metadata: header(map[string]string{"recorded_mallocs": "2", "recorded_peak_allocated_bytes": "768", "largest_alloc_size": "512"}),
		},
		{
			name:   "gzip-compressed",
			xspace: gzipped(space(oneLine)),
			events: []string{
				"malloc addr=0x1000 size=4 t=1005 thread=7",
				"malloc addr=0x1100 size=300 t=1006 thread=7",
				"free addr=0x1000 size=4 t=1009 thread=7",
			},
			metadata: header(map[string]string{"recorded_mallocs": "2", "recorded_peak_allocated_bytes": "768", "largest_alloc_size": "512"}),
		},
		{
			// Two threads interleave; the later line's timestamp is
			// later, its events' offsets smaller; one pair is 400 ps
			// apart within a nanosecond.
			name: "threads interleaved, to the picosecond",
			xspace: space(xplane{name: "/host:CPU", lines: []xline{
				{id: 1, ts: 100, evs: []xevent{
					bfcEvent(true, 10_000, "GPU_0_bfc", 0xa00, 1000, 1024, 1024, 1024, limit),  // t=110
					bfcEvent(false, 30_700, "GPU_0_bfc", 0xb00, 2000, 2048, 1280, 3328, limit), // t=130.7
					bfcEvent(false, 40_000, "GPU_0_bfc", 0xa00, 1000, 1024, 256, 3328, limit),  // t=140
				}},
				{id: 2, ts: 120, evs: []xevent{
					bfcEvent(true, 0, "GPU_0_bfc", 0xb00, 2000, 2048, 3072, 3072, limit),    // t=120
					bfcEvent(true, 10_300, "GPU_0_bfc", 0xc00, 256, 256, 3328, 3328, limit), // t=130.3
				}},
			}}),
			events: []string{
				"malloc addr=0xa00 size=1000 t=110 thread=1",
				"malloc addr=0xb00 size=2000 t=120 thread=2",
				"malloc addr=0xc00 size=256 t=130 thread=2",
				"free addr=0xb00 size=2000 t=130 thread=1",
				"free addr=0xa00 size=1000 t=140 thread=1",
			},
			// BFC's bytes_allocated after each event is what the events
			// in this order add up to (0xc00's malloc, at 130.3 ns, before
			// 0xb00's free, at 130.7): no mismatch.
			metadata: header(map[string]string{"recorded_mallocs": "3", "recorded_peak_allocated_bytes": "3328", "largest_alloc_size": "2048"}),
		},
		{
			// The host allocator and GPU 1's are skipped and counted;
			// the device plane names the GPU; allocator_name is a
			// str_value, the integers uint64_value; the line's timestamp
			// follows its events, the metadata come first.
			name: "device 0 among others",
			xspace: space(
				xplane{name: "/device:GPU:0", stats: []xstat{{"gpu_device_name", "NVIDIA H200"}, {"memory_size", uint64(150109880320)}, {"core_count", 132}}},
				xplane{name: "/device:GPU:1", stats: []xstat{{"gpu_device_name", "NVIDIA H100"}, {"memory_size", uint64(85520809984)}}},
				xplane{name: "/host:CPU", metaFirst: true, lines: []xline{{id: 3, ts: 50, tsEnd: true, evs: []xevent{
					bfcEvent(true, 1_000, "xla_gpu_host_bfc", 0x7f00, 4, 256, 256, 256, limit),
					{name: allocName, ps: 2_000, stats: []xstat{
						{"allocator_name", "GPU_0_bfc"}, {"addr", uint64(0x302000000)}, {"requested_bytes", uint64(4096)},
						{"allocation_bytes", uint64(4096)}, {"bytes_allocated", uint64(4096)}, {"peak_bytes_in_use", uint64(4096)},
						{"bytes_reserved", uint64(0)}, {"bytes_available", uint64(limit - 4096)}, {"tf_op", "jit(step)/dot_general"},
					}},
					bfcEvent(true, 3_000, "GPU_1_bfc", 0x402000000, 8, 256, 256, 256, limit),
					bfcEvent(false, 4_000, "xla_gpu_host_bfc", 0x7f00, 4, 256, 0, 256, limit),
					bfcEvent(false, 5_000, "GPU_1_bfc", 0x402000000, 8, 256, 0, 256, limit),
				}}}},
			),
			events: []string{
				"malloc addr=0x302000000 size=4096 t=52 thread=3 label=jit(step)/dot_general",
			},
			metadata: header(map[string]string{"recorded_mallocs": "1", "recorded_peak_allocated_bytes": "4096", "largest_alloc_size": "4096",
				"skipped_allocators": "GPU_1_bfc=1 xla_gpu_host_bfc=1"}),
			device: "NVIDIA H200",
			memory: 150109880320,
		},
		{
			name: "device 1",
			opts: Options{Device: 1},
			xspace: space(
				xplane{name: "/device:GPU:0", stats: []xstat{{"gpu_device_name", "NVIDIA H200"}, {"memory_size", uint64(150109880320)}}},
				xplane{name: "/device:GPU:1", stats: []xstat{{"gpu_device_name", ref("NVIDIA H100")}, {"memory_size", uint64(85520809984)}}},
				xplane{name: "/host:CPU", lines: []xline{{id: 3, ts: 50, evs: []xevent{
					bfcEvent(true, 1_000, "GPU_0_bfc", 0x302000000, 4, 256, 256, 256, limit),
					bfcEvent(true, 3_000, "GPU_1_bfc", 0x402000000, 8, 256, 256, 256, limit),
					bfcEvent(false, 5_000, "GPU_1_bfc", 0x402000000, 8, 256, 0, 256, limit),
				}}}},
			),
			events: []string{
				"malloc addr=0x402000000 size=8 t=53 thread=3",
				"free addr=0x402000000 size=8 t=55 thread=3",
			},
			metadata: map[string]string{"format": "XSpace (XLA profiler)", "allocator": "GPU_1_bfc", "device": "1", "allocated_at_start": "0", "unrecorded": "streams,device calls",
				"recorded_mallocs": "1", "recorded_peak_allocated_bytes": "256", "largest_alloc_size": "256", "skipped_allocators": "GPU_0_bfc=1"},
			device: "NVIDIA H100",
			memory: 85520809984,
		},
		{
			// The profile began with 512 bytes in use, and dropped the
			// malloc of 0x3000: BFC's bytes_allocated after the free of
			// 0x3000 is 512 below what the events add up to.
			name: "mid-run, an event dropped",
			xspace: space(xplane{name: "/host:CPU", lines: []xline{{id: 1, ts: 0, evs: []xevent{
				bfcEvent(true, 1_000, "GPU_0_bfc", 0x2000, 100, 256, 768, 768, limit),
				bfcEvent(false, 2_000, "GPU_0_bfc", 0x3000, 300, 512, 256, 768, limit),
				bfcEvent(false, 3_000, "GPU_0_bfc", 0x2000, 100, 256, 0, 768, limit),
			}}}}),
			events: []string{
				"malloc addr=0x2000 size=100 t=1 thread=1",
				"free addr=0x3000 size=300 t=2 thread=1",
				"free addr=0x2000 size=100 t=3 thread=1",
			},
			metadata: header(map[string]string{"recorded_mallocs": "1", "recorded_peak_allocated_bytes": "768", "largest_alloc_size": "256",
				"allocated_at_start": "512"}),
		},
		{
			name: "allocated bytes disagree",
			xspace: space(xplane{name: "/host:CPU", lines: []xline{{id: 1, ts: 0, evs: []xevent{
				bfcEvent(true, 1_000, "GPU_0_bfc", 0x2000, 100, 256, 256, 256, limit),
				bfcEvent(true, 2_000, "GPU_0_bfc", 0x3000, 300, 512, 256, 768, limit),
			}}}}),
			events: []string{
				"malloc addr=0x2000 size=100 t=1 thread=1",
				"malloc addr=0x3000 size=300 t=2 thread=1",
			},
			metadata: header(map[string]string{"recorded_mallocs": "2", "recorded_peak_allocated_bytes": "768", "largest_alloc_size": "512",
				"allocated_mismatch_event": "1"}),
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, evs, err := importBytes(tc.xspace, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := strings.Join(evs, "\n"), strings.Join(tc.events, "\n"); got != want {
				t.Errorf("events:\n%s\nwant:\n%s", got, want)
			}
			if h.Source != "xspace" || h.Device != tc.device || h.DeviceMemory != tc.memory {
				t.Errorf("header source %q device %q memory %d, want xspace, %q, %d", h.Source, h.Device, h.DeviceMemory, tc.device, tc.memory)
			}
			if !maps.Equal(h.Metadata, tc.metadata) {
				t.Errorf("metadata %v,\nwant %v", h.Metadata, tc.metadata)
			}
			if want := map[string]string{"memory_limit": "1073741824"}; !maps.Equal(h.Settings, want) {
				t.Errorf("settings %v, want %v", h.Settings, want)
			}
		})
	}
}

func TestImportErrors(t *testing.T) {
	good := space(oneLine)
	noAddr := space(xplane{name: "/host:CPU", lines: []xline{{id: 1, evs: []xevent{
		{name: allocName, ps: 1000, stats: []xstat{{"allocator_name", ref("GPU_0_bfc")}, {"requested_bytes", 8}}},
	}}}})
	// A plane whose line claims 127 bytes, of the 3 it has left.
	longLine := appendMessage(nil, planeName, []byte("/host:CPU"))
	longLine = appendMessage(nil, spacePlanes, append(longLine, 0x1a, 0x7f, 0x08, 0x01, 0x00))
	// A plane that claims 1<<32 bytes.
	hugePlane := append([]byte{0x0a, 0x80, 0x80, 0x80, 0x80, 0x10}, good...)
	for _, tc := range []struct {
		name   string
		xspace []byte
		opts   Options
		err    error // errors.Is, or nil
		msg    string
	}{
		{"cut", good[:40], Options{}, trace.ErrTruncated,
			"test.xplane.pb: byte offset 0: truncated: field 1 claims 643 bytes, the file has 37 left"},
		{"a line longer than its plane", longLine, Options{}, trace.ErrTruncated,
			"test.xplane.pb: byte offset 13: truncated: field 3 claims 127 bytes, its message has 3 left"},
		{"a plane of 4 GiB", hugePlane, Options{}, trace.ErrTruncated, "test.xplane.pb: byte offset 0: truncated: field 1 claims 4294967296 bytes, the file has 646 left"},
		{"wire type 7", []byte{0x0f}, Options{}, trace.ErrCorrupt, "test.xplane.pb: byte offset 0: corrupt: field 1 has wire type 7"},
		{"a plane of wire type 0", []byte{0x08, 0x01}, Options{}, trace.ErrCorrupt,
			"test.xplane.pb: byte offset 0: corrupt: field 1 has wire type 0, want a message (2)"},
		{"a varint of 11 bytes", append([]byte{0x10}, bytes.Repeat([]byte{0xff}, 11)...), Options{}, trace.ErrCorrupt,
			"test.xplane.pb: byte offset 1: corrupt: field 2: "},
		{"no addr", noAddr, Options{}, trace.ErrCorrupt,
			"test.xplane.pb: byte offset 20: corrupt: MemoryAllocation event of GPU_0_bfc has no addr stat"},
		{"no allocator events", space(xplane{name: "/host:CPU", lines: []xline{{id: 1, evs: []xevent{{name: "ThunkExecute"}}}}}), Options{}, nil,
			"test.xplane.pb: no MemoryAllocation or MemoryDeallocation events in the XSpace (was it profiled with memory tracing on?)"},
		{"another device's", good, Options{Device: 2}, nil,
			"test.xplane.pb: no allocator events of device 2 (allocator GPU_2_bfc); the XSpace has those of GPU_0_bfc (--device picks another GPU)"},
		{"gzip cut short", gzipped(good)[:30], Options{}, trace.ErrTruncated, "test.xplane.pb: byte offset "},
		{"gzip twice", append(gzipped(good), gzipped(good)...), Options{}, trace.ErrCorrupt,
			"test.xplane.pb: byte offset " + strconv.Itoa(len(gzipped(good))) + ": corrupt: bytes follow the XSpace's gzip stream (a second stream, or appended data): refused"},
		{"planes twice", append(good, good...), Options{}, trace.ErrCorrupt,
			"test.xplane.pb: byte offset " + strconv.Itoa(len(good)+3) + `: corrupt: a second plane "/host:CPU" with allocator events (the first at byte 3)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := importBytes(tc.xspace, tc.opts)
			if err == nil {
				t.Fatal("no error")
			}
			if !strings.HasPrefix(err.Error(), tc.msg) || strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q,\nwant one line starting %q", err, tc.msg)
			}
			if tc.err != nil && !errors.Is(err, tc.err) {
				t.Errorf("error %q is not %q", err, tc.err)
			}
		})
	}
}

func TestDetect(t *testing.T) {
	for _, tc := range []struct {
		name string
		head []byte
		want bool
	}{
		{"host plane", space(oneLine), true},
		{"gzip-compressed", gzipped(space(oneLine)), true},
		{"device plane with an id", append([]byte{0x0a, 20, 0x08, 0x05, 0x12, 14}, "/device:GPU:0\x00"...), true},
		{"unnamed plane", space(xplane{lines: []xline{{id: 1}}}), false},
		{"other name", space(xplane{name: "Task Environment"}), false},
		{"native trace", []byte(trace.Magic + "\x02\x00"), false},
		{"pickle", []byte{0x80, 0x04, 0x95}, false},
		{"gzip of a pickle", gzipped([]byte{0x80, 0x04, 0x95, 0, 0, 0}), false},
		{"text form", []byte("malloc addr=0x10 size=4 t=0\n"), false},
		{"a newline first", []byte("\n/host:CPU\n"), false},
		{"rmm", []byte("Thread,Time,Action,Pointer,Size,Stream\n"), false},
		{"empty", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Detect(tc.head); got != tc.want {
				t.Errorf("Detect = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestRealShaped imports testdata/train.bfc.mem.xplane.pb.gz, the memory
// events of the XSpace of testdata/jax/record.py's train job under XLA's
// BFC, preallocated (see testdata/memonly), and checks them against that
// run's memory_stats() (testdata/jax/train.bfc.json): num_allocs 1377,
// peak_bytes_in_use 388236544, largest_alloc_size 314572800, bytes_limit
// 112583507968, nothing in use at the end.
func TestRealShaped(t *testing.T) {
	path := filepath.Join("testdata", "train.bfc.mem.xplane.pb.gz")
	checkTrain(t, path)
}

// TestRealFile does the same on the whole XSpace, where the trace
// collection ($ALLOCSIM_TRACES, else ../shared/traces) has it as
// jax/train.bfc.xplane.pb or .pb.gz, and checks that it gives the same
// events as the small one.
func TestRealFile(t *testing.T) {
	dir := os.Getenv("ALLOCSIM_TRACES")
	if dir == "" {
		dir = filepath.Join("..", "..", "..", "shared", "traces")
	}
	for _, name := range []string{"train.bfc.xplane.pb", "train.bfc.xplane.pb.gz"} {
		path := filepath.Join(dir, "jax", name)
		if _, err := os.Stat(path); err != nil {
			continue
		}
		t.Run(name, func(t *testing.T) {
			whole := checkTrain(t, path)
			small := checkTrain(t, filepath.Join("testdata", "train.bfc.mem.xplane.pb.gz"))
			if !slicesEqual(whole, small) {
				t.Errorf("the whole XSpace's %d events differ from the small one's %d", len(whole), len(small))
			}
		})
		return
	}
	t.Skipf("no jax/train.bfc.xplane.pb(.gz) in %s", dir)
}

func slicesEqual(a, b []trace.Event) bool {
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

func checkTrain(t *testing.T, path string) []trace.Event {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	src, err := Import(f, path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	evs := src.Rest()
	h := src.Header()
	var mallocs, frees int
	var largest, live, peakLive uint64
	sizes := map[uint64]uint64{}
	for i, ev := range evs {
		if i > 0 && ev.Time < evs[i-1].Time {
			t.Fatalf("event %d at %d ns, before event %d at %d", i, ev.Time, i-1, evs[i-1].Time)
		}
		switch ev.Op {
		case trace.OpMalloc:
			mallocs++
			largest = max(largest, ev.Size)
			sizes[ev.Addr] = ev.Size
			live += ev.Size
			peakLive = max(peakLive, live)
		case trace.OpFree:
			frees++
			if sizes[ev.Addr] != ev.Size {
				t.Fatalf("event %d: free of %#x, %d bytes, which holds %d", i, ev.Addr, ev.Size, sizes[ev.Addr])
			}
			delete(sizes, ev.Addr)
			live -= ev.Size
		}
	}
	span := evs[len(evs)-1].Time - evs[0].Time
	t.Logf("%s: %d mallocs, %d frees, largest %d bytes, peak requested %d bytes, %d ns from %d ns", path, mallocs, frees, largest, peakLive, span, evs[0].Time)
	if mallocs != 1377 || frees != 1377 || len(sizes) != 0 {
		t.Errorf("%d mallocs, %d frees, %d live at the end; want 1377 (num_allocs), 1377, 0 (bytes_in_use 0)", mallocs, frees, len(sizes))
	}
	if largest != 314572800 {
		t.Errorf("largest request %d bytes, want 314572800 (the 300 MiB array; largest_alloc_size)", largest)
	}
	if span != 13315766518 || evs[0].Time != 1823342910 {
		t.Errorf("events from %d ns for %d ns, want from 1823342910 for 13315766518", evs[0].Time, span)
	}
	want := map[string]string{
		"format": "XSpace (XLA profiler)", "allocator": "GPU_0_bfc", "device": "0",
		"recorded_mallocs": "1377", "recorded_peak_allocated_bytes": "388236544", "largest_alloc_size": "314572800",
		"allocated_at_start": "0", "skipped_allocators": "xla_gpu_host_bfc=30", "unrecorded": "streams,device calls",
	}
	if !maps.Equal(h.Metadata, want) {
		t.Errorf("metadata %v,\nwant %v", h.Metadata, want)
	}
	if h.Settings["memory_limit"] != "112583507968" || h.Device != "NVIDIA H200" || h.DeviceMemory != 150109880320 {
		t.Errorf("settings %v, device %q, %d bytes; want memory_limit 112583507968 (bytes_limit), NVIDIA H200 of 150109880320 bytes", h.Settings, h.Device, h.DeviceMemory)
	}
	return evs
}

// TestJAXXSpaces imports the XSpaces of the JAX jobs of
// testdata/jax/xspace (jax/record.py --xspace: train and attn under BFC,
// preallocated and growing) and checks each against the memory_stats() of
// its run, in NAME.json beside it: the mallocs (num_allocs), the peak of
// the bytes in use and the largest chunk BFC recorded (peak_bytes_in_use,
// largest_alloc_size), its limit (bytes_limit), and nothing in use at the
// end (bytes_in_use 0).
func TestJAXXSpaces(t *testing.T) {
	paths, _ := filepath.Glob(filepath.Join("..", "..", "testdata", "jax", "xspace", "*.xplane.pb.gz"))
	if len(paths) != 4 {
		t.Fatalf("%d XSpaces in testdata/jax/xspace, want 4", len(paths))
	}
	for _, path := range paths {
		name := strings.TrimSuffix(filepath.Base(path), ".xplane.pb.gz")
		t.Run(name, func(t *testing.T) {
			raw, err := os.ReadFile(strings.TrimSuffix(path, ".xplane.pb.gz") + ".json")
			if err != nil {
				t.Fatal(err)
			}
			var rec struct {
				Stats struct {
					NumAllocs        int64 `json:"num_allocs"`
					PeakBytesInUse   int64 `json:"peak_bytes_in_use"`
					LargestAllocSize int64 `json:"largest_alloc_size"`
					BytesLimit       int64 `json:"bytes_limit"`
					BytesInUse       int64 `json:"bytes_in_use"`
				}
			}
			if err := json.Unmarshal(raw, &rec); err != nil {
				t.Fatal(err)
			}
			f, err := os.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			src, err := Import(f, path, Options{})
			if err != nil {
				t.Fatal(err)
			}
			live := map[uint64]bool{}
			for _, ev := range src.Rest() {
				if ev.Op == trace.OpMalloc {
					live[ev.Addr] = true
				} else {
					delete(live, ev.Addr)
				}
			}
			s := rec.Stats
			md := src.Header().Metadata
			got := []string{md["recorded_mallocs"], md["recorded_peak_allocated_bytes"], md["largest_alloc_size"], src.Header().Settings["memory_limit"],
				strconv.Itoa(len(live)), md["allocated_at_start"], md["allocated_mismatch_event"]}
			want := []string{strconv.FormatInt(s.NumAllocs, 10), strconv.FormatInt(s.PeakBytesInUse, 10), strconv.FormatInt(s.LargestAllocSize, 10),
				strconv.FormatInt(s.BytesLimit, 10), strconv.FormatInt(s.BytesInUse, 10), "0", ""}
			if !slices.Equal(got, want) {
				t.Errorf("mallocs, peak in use, largest chunk, limit, live at the end, in use at the start, mismatch: %q,\nmemory_stats: %q", got, want)
			}
		})
	}
}

package xspace

import (
	"bytes"
	"strconv"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/trace"
)

// FuzzXSpace: any bytes imported as an XSpace give time-ordered device
// mallocs and frees that agree with the header, or one error, one line,
// naming the file; never a panic.
func FuzzXSpace(f *testing.F) {
	f.Add(space(oneLine))
	f.Add(gzipped(space(oneLine)))
	f.Add(space(
		xplane{name: "/device:GPU:0", stats: []xstat{{"gpu_device_name", "NVIDIA H200"}, {"memory_size", uint64(150109880320)}}},
		xplane{name: "/host:CPU", metaFirst: true, lines: []xline{
			{id: 1, ts: 100, evs: []xevent{
				bfcEvent(true, 10_000, "GPU_0_bfc", 0xa00, 1000, 1024, 1024, 1024, limit),
				bfcEvent(true, 11_000, "xla_gpu_host_bfc", 0xa00, 8, 256, 256, 256, limit),
				bfcEvent(false, 40_000, "GPU_0_bfc", 0xa00, 1000, 1024, 0, 1024, limit),
			}},
			{id: 2, ts: 120, tsEnd: true, evs: []xevent{
				bfcEvent(true, 0, "GPU_0_bfc", 0xb00, 2000, 2048, 3072, 3072, limit),
				{name: "ThunkExecute", ps: 5, stats: []xstat{{"addr", 1}, {"tf_op", "x"}}},
			}},
		}},
	))
	f.Add([]byte{0x0a, 0x80, 0x80, 0x80, 0x80, 0x10, 0x12, 0x01, '/'})
	f.Fuzz(func(t *testing.T, b []byte) {
		src, err := Import(bytes.NewReader(b), "fuzz.xplane.pb", Options{})
		if err != nil {
			if msg := err.Error(); strings.Contains(msg, "\n") || !strings.HasPrefix(msg, "fuzz.xplane.pb: ") {
				t.Fatalf("error %q: not one line naming the file", msg)
			}
			return
		}
		evs := src.Rest()
		mallocs := 0
		for i, ev := range evs {
			if ev.Op != trace.OpMalloc && ev.Op != trace.OpFree || ev.Kind != trace.KindDevice {
				t.Fatalf("event %d: %s", i, trace.FormatText(ev))
			}
			if i > 0 && ev.Time < evs[i-1].Time {
				t.Fatalf("event %d at %d ns, before event %d at %d", i, ev.Time, i-1, evs[i-1].Time)
			}
			if ev.Op == trace.OpMalloc {
				mallocs++
			}
		}
		if got := src.Header().Metadata["recorded_mallocs"]; got != strconv.Itoa(mallocs) || len(evs) == 0 {
			t.Fatalf("%d events, %d mallocs; the header says %s", len(evs), mallocs, got)
		}
	})
}

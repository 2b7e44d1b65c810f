package cupy

import (
	"bytes"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/trace"
)

// FuzzCuPy: any bytes read as a DebugPrintHook log, through a
// trace.LineReader as replay reads a file, give events or one error, one
// line naming the file, which is final; never a panic. A malloc has an
// address, a failed malloc none, and every event is of the device asked
// for, on stream 0 at time 0.
func FuzzCuPy(f *testing.F) {
	f.Add([]byte(small), 0)
	f.Add([]byte(small), 1)
	for _, name := range []string{"churn", "linalg", "churn_limit"} {
		data, _ := os.ReadFile("../../testdata/cupy/" + name + ".jsonl")
		// The first 40 lines: device allocs, mallocs, frees, a malloc of
		// 0 bytes in linalg's.
		for k, i := 0, 0; k < 40 && i < len(data); k++ {
			j := bytes.IndexByte(data[i:], '\n')
			if j < 0 {
				break
			}
			i += j + 1
			if k == 39 {
				f.Add(data[:i], 0)
			}
		}
	}
	f.Add([]byte(`{"hook":"malloc","device_id":0,"size":30844117,"mem_size":30844416,"mem_ptr":0,"pmem_id":"0x0"}`), 0)
	f.Add([]byte("{\"hook\":\"free\",\"device_id\":0,\"mem_size\":1,\"mem_ptr\":1}\r\n\n{}"), 0)
	f.Fuzz(func(t *testing.T, b []byte, device int) {
		oneLine := func(err error) {
			if msg := err.Error(); strings.Contains(msg, "\n") || !strings.Contains(msg, "fuzz.jsonl") {
				t.Fatalf("error %q: not one line naming the file", msg)
			}
		}
		src, err := Import(trace.NewLineReader(bytes.NewReader(b), "fuzz.jsonl"), "fuzz.jsonl", Options{Device: device})
		if err != nil {
			if device >= 0 {
				t.Fatalf("device %d: %v", device, err)
			}
			oneLine(err)
			return
		}
		for i := 0; i < 1<<16; i++ {
			ev, err := src.Next()
			if err != nil {
				if _, err2 := src.Next(); err2 != err {
					t.Fatalf("error not final: %v then %v", err, err2)
				}
				if err != io.EOF {
					oneLine(err)
				}
				return
			}
			switch {
			case ev.Op == trace.OpMalloc && ev.Addr == 0, ev.Op == trace.OpMallocFailed && ev.Addr != 0,
				ev.Op == trace.OpSegmentAlloc && ev.Addr == 0, ev.Stream != 0, ev.Time != 0:
				t.Fatalf("event %+v", ev)
			}
		}
	})
}

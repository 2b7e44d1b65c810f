package kineto

import (
	"bytes"
	"io"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/trace"
)

// FuzzKineto: any bytes, plain or gzip'd, import to events that read to
// their end without an error, or fail with one line naming the file;
// never a panic. The events are the mallocs, frees and failed mallocs
// kept, and device calls before them.
func FuzzKineto(f *testing.F) {
	plain := traceOf(h200,
		mem(2, "15.000", 5*mib, 0x30000000, 23068672),
		mem(2, "13.000", -12*mib, 0x10000000, 14680064),
		op("9.5"),
		mem(2, "10.000", 12*mib, 0x10000000, 12*mib),
		memOn(-1, 0, 2, "12.500", 4096, 0x55d0c000, 0),
		mem(3, "11.500", 4096, 0x20000000, 14680064),
		mem(2, "14.000", -4096, 0x20000000, 2*mib),
		oom("16", 100*mib, 0))
	expandable := traceOf(8<<30,
		mem(1, "1", 12*mib, 0x100000000, 20*mib),
		mem(1, "2", 40*mib, 0x100c00000, 62*mib),
		mem(1, "3", 4096, 0x1000000000, 64*mib),
		mem(1, "4", -40*mib, 0x100c00000, 64*mib),
		mem(1, "5", 8*mib, 0x100c00000, 44*mib))
	for _, s := range []string{plain, expandable, "[" + mem(1, "1", 512, 1, 2*mib) + "]", `{"traceEvents": []}`, "{}"} {
		f.Add([]byte(s))
	}
	f.Add(gzipped(plain))
	// The reader's limits and the paths around them: nesting at and over
	// MaxDepth, escapes in keys and strings, numbers of every form, keys
	// matched without regard to case.
	deep := func(n int) string {
		return `{"traceEvents": [], "x": ` + strings.Repeat("[", n) + strings.Repeat("]", n) + "}"
	}
	for _, s := range []string{deep(MaxDepth - 1), deep(MaxDepth), deep(MaxDepth + 5),
		`{"traceEvents": [{"NAME": "[memory]", "Ts": 1, "ARGS": {"Device Type": 1, "Device Id": 0, "Bytes": 512, "Total Reserved": 2097152, "Addr": 4096}}]}`,
		`{"trace\u0045vents": [{"name": "[memory\u005d", "ts": 1, "args": {"Device Type": 1, "Device Id": 0, "Bytes": 512, "Total Reserved": 2097152, "Addr": 4096}}]}`,
		`{"traceEvents": [1, -0, -0.5e+3, 2E-7, 0.25, true, false, null, "a\"\/\b\f\n\r\t\u00e9", {}, [], [{}]]}`,
		`{"traceEvents": [01]}`, `{"traceEvents": [-]}`, `{"traceEvents": [1.]}`, `{"traceEvents": [1e]}`, `{"traceEvents": [tru]}`, `{"traceEvents": ["\x"]}`, `{"traceEvents": [,]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		src, err := Import(bytes.NewReader(data), "fuzz.json", Options{})
		if err != nil {
			if msg := err.Error(); !strings.HasPrefix(msg, "fuzz.json: ") || strings.ContainsAny(msg, "\n\r") {
				t.Fatalf("error %q: not one line naming the file", msg)
			}
			return
		}
		for {
			ev, err := src.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("Next after Import: %v", err)
			}
			switch ev.Op {
			case trace.OpMalloc, trace.OpFree, trace.OpMallocFailed,
				trace.OpSegmentAlloc, trace.OpSegmentFree, trace.OpSegmentMap, trace.OpSegmentUnmap:
			default:
				t.Fatalf("event %s: not an op of the importer", trace.FormatText(ev))
			}
			if ev.Size == 0 {
				t.Fatalf("event %s: no size", trace.FormatText(ev))
			}
		}
	})
}

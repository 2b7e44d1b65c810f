package kineto

import (
	"errors"
	"fmt"
	"io"
	"runtime"
	"strings"
	"testing"
)

// genReader yields head, then block n times, then tail, generated as it
// is read.
type genReader struct {
	parts []string
	block string
	n     int
	rest  string
}

func gen(head, block string, n int, tail string) *genReader {
	return &genReader{parts: []string{head, tail}, block: block, n: n}
}

func (g *genReader) Read(p []byte) (int, error) {
	for g.rest == "" {
		switch {
		case g.parts[0] != "":
			g.rest, g.parts[0] = g.parts[0], ""
		case g.n > 0:
			g.rest, g.n = g.block, g.n-1
		case g.parts[1] != "":
			g.rest, g.parts[1] = g.parts[1], ""
		default:
			return 0, io.EOF
		}
	}
	n := copy(p, g.rest)
	g.rest = g.rest[n:]
	return n, nil
}

// The reader's limits (issue 36: a string of 1 GiB in trace_id, in an
// event or under an unknown key took 4-5 GB; an array 50 million deep
// under an unknown key 1.4 GB): a string or number over MaxString, or
// nesting over MaxDepth, anywhere, is refused with ErrLimit, naming the
// file, the byte offset and the limit, having allocated little; at the
// limits, the trace is read.
func TestLimits(t *testing.T) {
	ev := mem(1, "1", 4096, 0x10000, 2*mib)
	events := `{"traceEvents": [` + ev + `], `
	big := MaxString + 1<<20 // in blocks of 1 MiB
	mb := strings.Repeat("A", 1<<20)
	digits := strings.Repeat("7", 1<<20)
	for _, tc := range []struct {
		name       string
		in         *genReader
		want       string // the message, "" for none; "..." as in TestErrors
		allocBound uint64 // bytes
	}{
		{"trace_id", gen(events+`"trace_id": "`, mb, big>>20, `"}`),
			fmt.Sprintf("prof.json: over a limit of the reader: a string longer than 16777216 bytes at byte %d", len(events)+len(`"trace_id": `)), 8 << 20},
		{"event", gen(`{"traceEvents": [`+ev+`, {"ph": "X", "name": "k", "args": {"x": "`, mb, big>>20, `"}}]}`),
			"prof.json: over a limit of the reader: a string longer than 16777216 bytes at byte ...", 8 << 20},
		{"memory event name", gen(`{"traceEvents": [{"name": "`, mb, big>>20, `"}]}`),
			"prof.json: over a limit of the reader: a string longer than 16777216 bytes at byte 26", 8 << 20},
		{"unknown key", gen(events+`"foo": "`, mb, big>>20, `"}`), "prof.json: over a limit of the reader: a string longer than ...", 8 << 20},
		{"key", gen(events+`"`, mb, big>>20, `": 1}`), "prof.json: over a limit of the reader: a string longer than ...", 8 << 20},
		{"number", gen(events+`"foo": 1`, digits, big>>20, `}`), "prof.json: over a limit of the reader: a number longer than 16777216 bytes at byte ...", 8 << 20},
		{"fraction", gen(events+`"foo": 1.`, digits, big>>20, `}`), "prof.json: over a limit of the reader: a number longer than 16777216 bytes at byte ...", 8 << 20},
		{"deep", gen(events+`"foo": `, strings.Repeat("[", 1<<20), 4, strings.Repeat("]", 4<<20)+"}"),
			fmt.Sprintf("prof.json: over a limit of the reader: arrays and objects nested deeper than 1000 at byte %d", len(events)+len(`"foo": `)+MaxDepth-1), 1 << 20},
		{"deep objects", gen(events+`"foo": `, strings.Repeat(`{"a":`, 1<<18), 4, strings.Repeat("}", 4<<18)+"}"), "prof.json: over a limit of the reader: arrays and objects nested deeper than 1000 at byte ...", 1 << 20},
		{"at the depth limit", gen(events+`"foo": `, "[", MaxDepth-1, strings.Repeat("]", MaxDepth-1)+"}"), "", 1 << 20},
		{"string at the limit", gen(events+`"foo": "`, mb, MaxString>>20, `"}`), "", 8 << 20},
		{"number at the limit", gen(events+`"foo": 1`, digits[1:], 1, strings.Repeat(digits, MaxString>>20-1)+`}`), "", 8 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			_, err := Import(tc.in, "prof.json", Options{})
			runtime.ReadMemStats(&after)
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > tc.allocBound {
				t.Errorf("allocated %d KiB, want at most %d", alloc>>10, tc.allocBound>>10)
			}
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !like(err.Error(), tc.want) || !errors.Is(err, ErrLimit) {
				t.Fatalf("error %v\nwant  %s (ErrLimit)", err, tc.want)
			}
		})
	}
}

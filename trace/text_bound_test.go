package trace

import (
	"bytes"
	"errors"
	"io"
	"runtime"
	"strings"
	"testing"
)

// repeatReader yields head, then line n times, then tail, generated as it
// is read.
type repeatReader struct {
	head, line, tail string
	n                int
	buf              []byte
}

func (r *repeatReader) Read(p []byte) (int, error) {
	for len(r.buf) < len(p) {
		switch {
		case r.head != "":
			r.buf, r.head = append(r.buf, r.head...), ""
		case r.n > 0:
			r.buf, r.n = append(r.buf, r.line...), r.n-1
		case r.tail != "":
			r.buf, r.tail = append(r.buf, r.tail...), ""
		default:
			if len(r.buf) == 0 {
				return 0, io.EOF
			}
			n := copy(p, r.buf)
			r.buf = r.buf[:copy(r.buf, r.buf[n:])]
			return n, nil
		}
	}
	n := copy(p, r.buf)
	r.buf = r.buf[:copy(r.buf, r.buf[n:])]
	return n, nil
}

// A TextReader holds one line at a time: reading a million device_sync
// lines leaves no more live heap than reading ten (issue 36: the text form
// was read whole, 10 million lines 2.07 GB).
func TestTextReaderBounded(t *testing.T) {
	live := func(n int) (int64, int) {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		tr, err := NewTextReader(&repeatReader{head: "header source=text\nstack id=4 frame=a.py:1:f\nmalloc id=1 size=4096 stack=4\n", line: "device_sync\n", n: n}, "sync.txt")
		if err != nil {
			t.Fatal(err)
		}
		events := 0
		for {
			_, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			events++
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		runtime.KeepAlive(tr)
		return int64(after.HeapAlloc) - int64(before.HeapAlloc), events
	}
	small, _ := live(10)
	big, events := live(1_000_000)
	if events != 1_000_001 {
		t.Fatalf("%d events, want 1000001", events)
	}
	if big-small > 1<<20 {
		t.Errorf("a TextReader holds %d bytes more after 1000000 lines than after 10, want under 1 MiB", big-small)
	}
}

// A LineReader passes lines of MaxLineBytes and refuses a longer one at
// its byte offset, whatever the reads' sizes; a text trace of one line of
// 1 GiB is refused after 16 MiB (issue 36).
func TestLineReaderMaxLine(t *testing.T) {
	long := strings.Repeat("x", MaxLineBytes)
	for _, tc := range []struct {
		name, text string
		want       string // "" for no error
	}{
		{"at the limit", "a\n" + long + "\nb\n", ""},
		{"last line at the limit", "a\n" + long, ""},
		{"one over", "a\n" + long + "y\nb\n", "l.txt:2: a line longer than 16777216 bytes (the limit) at byte offset 16777218: no text trace has one"},
		{"first line", long + "y", "l.txt:1: a line longer than 16777216 bytes (the limit) at byte offset 16777216: no text trace has one"},
	} {
		for _, size := range []int{1000, 64 << 10, 40 << 20} {
			lr := NewLineReader(strings.NewReader(tc.text), "l.txt")
			n, err := io.CopyBuffer(io.Discard, struct{ io.Reader }{lr}, make([]byte, size))
			switch {
			case tc.want == "" && (err != nil || n != int64(len(tc.text))):
				t.Errorf("%s, reads of %d: %d bytes, %v", tc.name, size, n, err)
			case tc.want != "" && (err == nil || err.Error() != tc.want):
				t.Errorf("%s, reads of %d: %v, want %s", tc.name, size, err, tc.want)
			}
		}
	}
	// A line of 1 GiB, generated: refused after 16 MiB, as a *SyntaxError.
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, _, err := ParseText("big.txt", &repeatReader{head: "marker label=", line: strings.Repeat("x", 1<<20), n: 1 << 10})
	runtime.ReadMemStats(&after)
	var se *SyntaxError
	if !errors.As(err, &se) || se.Line != 1 || !strings.Contains(err.Error(), "longer than 16777216 bytes (the limit)") {
		t.Errorf("a line of 1 GiB: %v", err)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 256<<20 {
		t.Errorf("a line of 1 GiB refused after allocating %d MiB, want under 256", alloc>>20)
	}
}

// Text traces read the same through a TextReader as through ParseText,
// stacks included, and its table is the same from the start.
func TestTextReaderStacks(t *testing.T) {
	tr, err := NewTextReader(strings.NewReader(stackText), "s.txt")
	if err != nil {
		t.Fatal(err)
	}
	st := tr.Stacks()
	evs, err := ReadAll(tr)
	if err != nil {
		t.Fatal(err)
	}
	_, want, wantSt, err := ParseTextStacks("s.txt", strings.NewReader(stackText))
	if err != nil {
		t.Fatal(err)
	}
	if tr.Stacks() != st || st.Len() != wantSt.Len() || len(evs) != len(want) {
		t.Fatalf("stacks %d, events %d; want %d, %d", st.Len(), len(evs), wantSt.Len(), len(want))
	}
	for i := range evs {
		if evs[i] != want[i] {
			t.Errorf("event %d: %+v, want %+v", i, evs[i], want[i])
		}
	}
	var buf bytes.Buffer
	if _, err := WriteTextSource(&buf, NewSliceSource(Header{}, evs).WithStacks(st)); err != nil {
		t.Fatal(err)
	}
}

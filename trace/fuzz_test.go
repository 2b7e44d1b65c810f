package trace

import (
	"bytes"
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
)

// FuzzReader feeds arbitrary bytes to the native reader: it must never
// panic, and every failure is a *FormatError naming the file and offset.
func FuzzReader(f *testing.F) {
	h, evs := seedTrace(f)
	f.Add(encodeF(f, h, evs))
	f.Add(encodeF(f, Header{}, nil))
	f.Add([]byte(Magic))
	f.Fuzz(func(t *testing.T, data []byte) {
		_, _, err := decodeAll(data)
		if err == nil {
			return
		}
		var fe *FormatError
		if !errors.As(err, &fe) {
			t.Fatalf("error %v is not a *FormatError", err)
		}
		if strings.Contains(err.Error(), "\n") || !strings.HasPrefix(err.Error(), "x.trace: byte offset ") {
			t.Fatalf("error %q is not one line naming file and offset", err)
		}
	})
}

// FuzzText feeds arbitrary text to the text-form parser: it must never
// panic, and what it accepts survives WriteText and ParseText unchanged
// and the native format unchanged.
func FuzzText(f *testing.F) {
	seed, err := os.ReadFile("testdata/small.txt")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(string(seed))
	f.Add("malloc id=1 size=4KiB\nfree id=1\n")
	f.Add(`marker label="a \"b\" c" t=-3`)
	// The streaming reader's paths: the header and stack lines before the
	// first event, a stack line after it (no event names a stack: the
	// round trip below writes none), a header after an event, a NUL byte
	// (the line it cuts is not read), CRLF line ends.
	f.Add("# c\nstack id=3 frame=a.py:1:f\nheader source=x\nmalloc id=1 size=1\nstack id=1 frame=b.py:2:g frame=a.py:1:f\nmalloc id=2 size=2\n")
	f.Add("malloc id=1 size=1\nheader source=y\n")
	f.Add("malloc id=1 size=1\nfree id=1\x00 size=3\n")
	f.Add("header source=x\r\nmalloc id=1 size=1\r\n")
	f.Fuzz(func(t *testing.T, text string) {
		h, evs, err := ParseText("f.txt", strings.NewReader(text))
		if err != nil {
			var se *SyntaxError
			if !errors.As(err, &se) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("error %q is not a one-line *SyntaxError", err)
			}
			return
		}
		var buf bytes.Buffer
		if err := WriteText(&buf, h, evs); err != nil {
			t.Fatal(err)
		}
		h2, evs2, err := ParseText("again", &buf)
		if err != nil {
			t.Fatalf("reparse: %v\n%s", err, buf.String())
		}
		if !reflect.DeepEqual(evs, evs2) || !reflect.DeepEqual(h.Settings, h2.Settings) || h.Source != h2.Source {
			t.Fatalf("text roundtrip differs:\n%+v\n%+v", evs, evs2)
		}
		valid := evs[:0:0]
		for _, ev := range evs {
			if ev.Op.Valid() {
				valid = append(valid, ev)
			}
		}
		var nb bytes.Buffer
		w, err := NewWriter(&nb, h)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range valid {
			if err := w.Write(ev); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		_, evs3, err := decodeAll(nb.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		if len(valid) == 0 && len(evs3) == 0 {
			return
		}
		if !reflect.DeepEqual(valid, evs3) {
			t.Fatalf("native roundtrip differs:\n%+v\n%+v", valid, evs3)
		}
	})
}

func seedTrace(f *testing.F) (Header, []Event) {
	file, err := os.Open("testdata/small.txt")
	if err != nil {
		f.Fatal(err)
	}
	defer file.Close()
	h, evs, err := ParseText("small.txt", file)
	if err != nil {
		f.Fatal(err)
	}
	return h, evs
}

func encodeF(f *testing.F, h Header, evs []Event) []byte {
	var buf bytes.Buffer
	w, err := NewWriter(&buf, h)
	if err != nil {
		f.Fatal(err)
	}
	for _, ev := range evs {
		if err := w.Write(ev); err != nil {
			f.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		f.Fatal(err)
	}
	return buf.Bytes()
}

package trace

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

func readSmall(t *testing.T) (Header, []Event) {
	t.Helper()
	f, err := os.Open("testdata/small.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h, evs, err := ParseText("small.txt", f)
	if err != nil {
		t.Fatal(err)
	}
	return h, evs
}

func encode(t *testing.T, h Header, evs []Event) []byte {
	t.Helper()
	var buf bytes.Buffer
	w, err := NewWriter(&buf, h)
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range evs {
		if err := w.Write(ev); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func decodeAll(data []byte) (Header, []Event, error) {
	r, err := NewReader(bytes.NewReader(data), "x.trace")
	if err != nil {
		return Header{}, nil, err
	}
	var evs []Event
	for {
		ev, err := r.Next()
		if err == io.EOF {
			return r.Header(), evs, nil
		}
		if err != nil {
			return r.Header(), evs, err
		}
		evs = append(evs, ev)
	}
}

func TestParseTextSmall(t *testing.T) {
	h, evs := readSmall(t)
	if h.Device != "NVIDIA H200" || h.DeviceMemory != 150000000000 || h.Settings["PYTORCH_CUDA_ALLOC_CONF"] != "expandable_segments:True" || h.Metadata["job"] != "demo" {
		t.Errorf("header = %+v", h)
	}
	if len(evs) != 24 {
		t.Fatalf("got %d events, want 24", len(evs))
	}
	want := Event{Op: OpMalloc, Addr: 0x7f0000000000, Size: 1000, Time: 1001, Thread: 7}
	if evs[1] != want {
		t.Errorf("event 1 = %+v, want %+v", evs[1], want)
	}
	if evs[3].Kind != KindPinned || evs[3].Size != 64<<10 {
		t.Errorf("event 3 = %+v", evs[3])
	}
	if evs[11].Op != OpMallocFailed || evs[11].Size != 80<<30 {
		t.Errorf("event 11 = %+v", evs[11])
	}
	if evs[16].Label != "step 1" || evs[6].Addr != 3 || evs[6].Stream != 0x55aa {
		t.Errorf("events 6, 16 = %+v, %+v", evs[6], evs[16])
	}
	if want := (Event{Op: OpMalloc, Addr: 0x7f0000200000, Size: 512, Stream: 0x55aa, Pool: 1, Time: 3100}); evs[19] != want {
		t.Errorf("event 19 = %+v, want %+v", evs[19], want)
	}
	if want := (Event{Op: OpMalloc, Addr: 0x7f0000300000, Size: 512, Stream: 0x55aa, Pool: 1, Restore: true, Time: 3160}); evs[21] != want {
		t.Errorf("event 21 = %+v, want %+v", evs[21], want)
	}
	if want := (Event{Op: OpPoolRelease, Pool: 1, Time: 3200}); evs[23] != want {
		t.Errorf("event 23 = %+v, want %+v", evs[23], want)
	}
}

// TestFormatVersion1 reads a file written by a build of format version 1
// (before pools): the same events as the text form's first 19.
func TestFormatVersion1(t *testing.T) {
	h, evs := readSmall(t)
	data, err := os.ReadFile("testdata/small_v1.trace")
	if err != nil {
		t.Fatal(err)
	}
	if data[8] != 1 {
		t.Fatalf("small_v1.trace has version byte %d, want 1", data[8])
	}
	h1, evs1, err := decodeAll(data)
	if err != nil {
		t.Fatal(err)
	}
	h.Version = 1
	if !reflect.DeepEqual(h, h1) {
		t.Errorf("header: got %+v, want %+v", h1, h)
	}
	if !reflect.DeepEqual(evs[:19], evs1) {
		t.Errorf("events differ:\ngot  %+v\nwant %+v", evs1, evs[:19])
	}
	// A version 1 file has no pool field and no pool_release.
	for _, ev := range []Event{{Op: OpMalloc, Size: 1, Pool: 1}, {Op: OpPoolRelease, Pool: 1}} {
		v2 := encode(t, Header{}, []Event{ev})
		v1 := append([]byte(nil), v2...)
		v1[8] = 1
		if _, _, err := decodeAll(v1); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%v in a version 1 file: got %v, want corrupt", ev.Op, err)
		}
	}
}

// TestFormatPoolBytes pins the encoding of the pool: a 9th field after the
// label, which is written (empty) to carry it, and the restore flag a 10th;
// an event without a pool is the bytes version 1 wrote.
func TestFormatPoolBytes(t *testing.T) {
	for _, tc := range []struct {
		ev   Event
		want string
	}{
		{Event{Op: OpMalloc, Size: 512}, "94 01 00 00 cd 02 00"},
		{Event{Op: OpMalloc, Size: 512, Pool: 3}, "99 01 00 00 cd 02 00 00 00 00 a0 03"},
		{Event{Op: OpMalloc, Size: 512, Pool: 3, Label: "x"}, "99 01 00 00 cd 02 00 00 00 00 a1 78 03"},
		{Event{Op: OpPoolRelease, Pool: 1}, "99 10 00 00 00 00 00 00 a0 01"},
		{Event{Op: OpMalloc, Size: 512, Pool: 3, Restore: true}, "9a 01 00 00 cd 02 00 00 00 00 a0 03 01"},
	} {
		var w Writer
		w.enc = msgpack.NewEncoder(&w.buf)
		if err := w.Write(tc.ev); err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprintf("% x", w.buf.Bytes()); got != tc.want {
			t.Errorf("%+v: got %s, want %s", tc.ev, got, tc.want)
		}
	}
}

func TestTextRoundtrip(t *testing.T) {
	h, evs := readSmall(t)
	var buf bytes.Buffer
	if err := WriteText(&buf, h, evs); err != nil {
		t.Fatal(err)
	}
	h2, evs2, err := ParseText("again", &buf)
	if err != nil {
		t.Fatalf("%v\n%s", err, buf.String())
	}
	if !reflect.DeepEqual(h, h2) || !reflect.DeepEqual(evs, evs2) {
		t.Errorf("text roundtrip differs:\n%+v\n%+v", evs, evs2)
	}
}

func TestTextErrors(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"mallo id=1 size=3", `t.txt:1: unknown op "mallo"`},
		{"malloc id=1 size=x", `t.txt:1: size="x": bad number`},
		{"\nmalloc id=1 sz=3", `t.txt:2: unknown field "sz"`},
		{"malloc id", `t.txt:1: field "id" is not key=value`},
		{"malloc kind=gpu", `t.txt:1: unknown kind "gpu"`},
		{"malloc id=1 size=1\nheader source=x", `t.txt:2: header after the first event`},
		{`marker label="abc`, `t.txt:1: bad quoted value at column 14`},
		{"malloc size=99999999999999TiB", `t.txt:1: size="99999999999999TiB": bad number`},
	} {
		_, _, err := ParseText("t.txt", strings.NewReader(tc.in))
		if err == nil || err.Error() != tc.want {
			t.Errorf("ParseText(%q) = %v, want %s", tc.in, err, tc.want)
		}
	}
}

func TestFormatRoundtrip(t *testing.T) {
	h, evs := readSmall(t)
	data := encode(t, h, evs)
	h2, evs2, err := decodeAll(data)
	if err != nil {
		t.Fatal(err)
	}
	h.Version = Version
	if !reflect.DeepEqual(h, h2) {
		t.Errorf("header: got %+v, want %+v", h2, h)
	}
	if !reflect.DeepEqual(evs, evs2) {
		t.Errorf("events differ:\ngot  %+v\nwant %+v", evs2, evs)
	}
}

// TestFormatManyFrames writes enough events for several frames, with
// addresses and times going both ways, and reads them back.
func TestFormatManyFrames(t *testing.T) {
	var evs []Event
	for i := 0; i < 20000; i++ {
		evs = append(evs, Event{Op: OpMalloc, Addr: uint64(i%7) << 40, Size: uint64(i) * 512, Time: int64(i*3 - (i%5)*2), Stream: uint64(i % 3)})
	}
	evs = append(evs, Event{Op: OpFree, Addr: ^uint64(0), Time: -5})
	data := encode(t, Header{Source: "text"}, evs)
	if bytes.Count(data, []byte{frameEvents}) < 2 {
		t.Logf("file of %d bytes", len(data))
	}
	_, evs2, err := decodeAll(data)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(evs, evs2) {
		t.Fatal("events differ after roundtrip")
	}
}

// TestFormatTruncated cuts the file at every byte: each prefix is an error,
// never a shorter trace read as whole.
func TestFormatTruncated(t *testing.T) {
	h, evs := readSmall(t)
	data := encode(t, h, evs)
	for n := 0; n < len(data); n++ {
		_, _, err := decodeAll(data[:n])
		if err == nil {
			t.Fatalf("prefix of %d/%d bytes read without error", n, len(data))
		}
		var fe *FormatError
		if !errors.As(err, &fe) || !errors.Is(err, ErrTruncated) {
			t.Fatalf("prefix of %d bytes: %v, want a truncation FormatError", n, err)
		}
		if !strings.HasPrefix(err.Error(), "x.trace: byte offset ") {
			t.Fatalf("prefix of %d bytes: error %q does not name the file and offset", n, err)
		}
	}
}

// TestFormatBitFlips flips every bit past the magic: each is detected.
func TestFormatBitFlips(t *testing.T) {
	h, evs := readSmall(t)
	data := encode(t, h, evs)
	for i := len(Magic); i < len(data); i++ {
		for bit := 0; bit < 8; bit++ {
			c := bytes.Clone(data)
			c[i] ^= 1 << bit
			if _, _, err := decodeAll(c); err == nil {
				t.Fatalf("flip of bit %d at byte %d not detected", bit, i)
			}
		}
	}
}

func TestFormatBadStart(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want error
		msg  string
	}{
		{"", ErrTruncated, "x.trace: byte offset 0: truncated: empty file"},
		{"GPUTR", ErrTruncated, "x.trace: byte offset 5: truncated: the file ends inside the magic"},
		{"PK\x03\x04 a zip file", ErrBadMagic, "x.trace: byte offset 0: not a native trace (bad magic)"},
		{"GPUTRACE\x07", ErrUnsupportedVersion, "x.trace: byte offset 8: unsupported format version 7 (this build reads versions 1 to 3)"},
	} {
		_, _, err := decodeAll([]byte(tc.in))
		if !errors.Is(err, tc.want) || err.Error() != tc.msg {
			t.Errorf("%q: got %v, want %s", tc.in, err, tc.msg)
		}
	}
}

func TestFormatTrailingData(t *testing.T) {
	h, evs := readSmall(t)
	data := append(encode(t, h, evs), 0)
	if _, _, err := decodeAll(data); !errors.Is(err, ErrCorrupt) {
		t.Errorf("data after the trailer: got %v, want ErrCorrupt", err)
	}
}

func TestWriterRejectsInvalidOp(t *testing.T) {
	w, err := NewWriter(io.Discard, Header{})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Write(Event{}); err == nil {
		t.Error("writing an event with the zero op succeeded")
	}
}

// The same trace is the same bytes: the header's maps are written sorted
// (they came out in Go's random map order before: record import of one
// snapshot differed between runs).
func TestWriterDeterministic(t *testing.T) {
	h := Header{Source: "pytorch", Settings: map[string]string{}, Metadata: map[string]string{}}
	for i := range 50 {
		h.Settings[fmt.Sprintf("s%d", i)] = "v"
		h.Metadata[fmt.Sprintf("m%d", i)] = "v"
	}
	var first []byte
	for run := range 5 {
		var buf bytes.Buffer
		w, err := NewWriter(&buf, h)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Write(Event{Op: OpMalloc, Addr: 1, Size: 2}); err != nil {
			t.Fatal(err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		if run == 0 {
			first = buf.Bytes()
		} else if !bytes.Equal(buf.Bytes(), first) {
			t.Fatalf("run %d wrote other bytes", run)
		}
	}
}

package trace

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// stackText is a text-form trace whose mallocs carry stacks: two named by
// their lines, one malloc without.
const stackText = `header source=text
stack id=7 frame=train.py:40:forward frame="lib/torch/nn/module.py:1790:_call_impl" frame=train.py:12:main
stack id=3 frame=train.py:41:forward frame=train.py:12:main
malloc id=1 size=1MiB stack=7
malloc id=2 size=2MiB stack=3
malloc id=3 size=4KiB
malloc_failed size=1GiB stack=7
free id=1
`

func TestTextStacks(t *testing.T) {
	h, evs, st, err := ParseTextStacks("s.txt", strings.NewReader(stackText))
	if err != nil {
		t.Fatal(err)
	}
	// The table numbers the stacks in the order of their lines.
	if got := []uint32{evs[0].Stack, evs[1].Stack, evs[2].Stack, evs[3].Stack}; !reflect.DeepEqual(got, []uint32{1, 2, 0, 1}) {
		t.Errorf("stacks %v, want [1 2 0 1]", got)
	}
	want1 := []Frame{{"forward", "train.py", 40}, {"_call_impl", "lib/torch/nn/module.py", 1790}, {"main", "train.py", 12}}
	if got := st.Frames(1); !reflect.DeepEqual(got, want1) {
		t.Errorf("stack 1 = %v, want %v", got, want1)
	}
	if st.Len() != 2 || st.NumFrames() != 4 {
		t.Errorf("%d stacks of %d frames, want 2 of 4 (main shared)", st.Len(), st.NumFrames())
	}
	// Written and read again: the same events and stacks, the lines
	// renumbered.
	var buf bytes.Buffer
	if err := WriteTextStacks(&buf, h, evs, st); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "stack id=1 frame=train.py:40:forward frame=lib/torch/nn/module.py:1790:_call_impl frame=train.py:12:main\nmalloc addr=0x1 size=1048576 t=0 stack=1\n") {
		t.Errorf("text form:\n%s", buf.String())
	}
	_, evs2, st2, err := ParseTextStacks("again", &buf)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(evs, evs2) || !reflect.DeepEqual(st.Frames(2), st2.Frames(2)) {
		t.Errorf("text round trip differs:\n%v\n%v", evs, evs2)
	}
	for _, bad := range []struct{ text, msg string }{
		{"malloc id=1 size=1 stack=1", "stack=\"1\": no stack line gives that id before"},
		{"stack id=1 frame=x.py:1:f\nstack id=1 frame=x.py:2:f", "stack 1 is given twice"},
		{"stack id=1", "stack 1 has no frame"},
		{"stack id=1 frame=nope", "frame=\"nope\": want FILE:LINE:NAME"},
	} {
		_, _, _, err := ParseTextStacks("bad", strings.NewReader(bad.text))
		if err == nil || !strings.Contains(err.Error(), bad.msg) {
			t.Errorf("%q: error %v, want %q", bad.text, err, bad.msg)
		}
	}
}

func TestParseFrame(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Frame
		ok   bool
	}{
		{"train.py:40:forward", Frame{"forward", "train.py", 40}, true},
		{"<frozen runpy>:88:_run_code", Frame{"_run_code", "<frozen runpy>", 88}, true},
		{"c10/cuda/X.cpp:12:c10::cuda::malloc(unsigned long)", Frame{"c10::cuda::malloc(unsigned long)", "c10/cuda/X.cpp", 12}, true},
		{"C:\\a.py:3:f", Frame{"f", "C:\\a.py", 3}, true},
		{"a.py:x:f", Frame{}, false},
	} {
		got, ok := ParseFrame(tc.in)
		if got != tc.want || ok != tc.ok {
			t.Errorf("ParseFrame(%q) = %v, %v; want %v, %v", tc.in, got, ok, tc.want, tc.ok)
		}
		if ok && got.String() != tc.in {
			t.Errorf("%v.String() = %q, want %q", got, got.String(), tc.in)
		}
	}
}

// TestFormatStacks writes a trace whose stacks come as its events go, over
// many event frames, and reads it back: the same events, and each event's
// frames the same.
func TestFormatStacks(t *testing.T) {
	st := NewStacks()
	var evs []Event
	for i := range 30000 {
		ev := Event{Op: OpMalloc, Addr: uint64(i + 1), Size: 512, Time: int64(i)}
		if i%3 != 0 {
			// A new stack every 100 mallocs, over frames shared among them.
			n := i / 100
			ev.Stack = st.AddFrames([]Frame{{"f", fmt.Sprintf("m%d.py", n%7), int64(n)}, {"main", "train.py", 12}})
		}
		if i%5 == 0 {
			ev.Pool = 2
		}
		evs = append(evs, ev)
	}
	var buf bytes.Buffer
	w, err := NewWriter(&buf, Header{Source: "text"})
	if err != nil {
		t.Fatal(err)
	}
	w.SetStacks(st)
	for _, ev := range evs {
		if err := w.Write(ev); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	data := buf.Bytes()
	if n := bytes.Count(data, []byte{frameStacks}); n < 2 {
		t.Fatalf("%d stack frames at most, want several", n)
	}
	r, err := NewReader(bytes.NewReader(data), "s.trace")
	if err != nil {
		t.Fatal(err)
	}
	if r.Header().Version != 3 {
		t.Errorf("version %d, want 3", r.Header().Version)
	}
	for k := 0; ; k++ {
		ev, err := r.Next()
		if err == io.EOF {
			if k != len(evs) {
				t.Fatalf("%d events, want %d", k, len(evs))
			}
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if ev != evs[k] {
			t.Fatalf("event %d = %+v, want %+v", k, ev, evs[k])
		}
		if got, want := r.Stacks().Frames(ev.Stack), st.Frames(evs[k].Stack); !reflect.DeepEqual(got, want) {
			t.Fatalf("event %d frames %v, want %v", k, got, want)
		}
	}
	if r.Stacks().Len() != st.Len() || r.Stacks().NumFrames() != st.NumFrames() {
		t.Errorf("read %d stacks of %d frames, wrote %d of %d", r.Stacks().Len(), r.Stacks().NumFrames(), st.Len(), st.NumFrames())
	}
}

// TestFormatStackBytes pins an event's stack: an 11th field after a
// written label, pool and restore flag (0); the stack frame before the
// events names the frames and stacks.
func TestFormatStackBytes(t *testing.T) {
	st := NewStacks()
	st.AddFrames([]Frame{{"f", "a.py", 3}})
	data := encodeStacks(t, st, []Event{{Op: OpMalloc, Size: 512, Stack: 1}})
	if want := "9b 01 00 00 cd 02 00 00 00 00 a0 00 00 01"; !strings.Contains(hexBytes(data), want) {
		t.Errorf("bytes %s, want them to hold %s", hexBytes(data), want)
	}
	// [0, [["f", "a.py", 3]], 1, [[0]]]
	if want := "94 00 91 93 a1 66 a4 61 2e 70 79 03 01 91 91 00"; !strings.Contains(hexBytes(data), want) {
		t.Errorf("bytes %s, want the stack frame %s", hexBytes(data), want)
	}
}

func encodeStacks(t *testing.T, st *Stacks, evs []Event) []byte {
	t.Helper()
	var buf bytes.Buffer
	w, err := NewWriter(&buf, Header{})
	if err != nil {
		t.Fatal(err)
	}
	w.SetStacks(st)
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

func hexBytes(b []byte) string {
	var s []string
	for _, c := range b {
		s = append(s, fmt.Sprintf("%02x", c))
	}
	return strings.Join(s, " ")
}

// TestFormatBadStacks: a stack the table lacks is refused by the writer,
// and by the reader in a file; a stack frame in a version 2 file is
// corruption.
func TestFormatBadStacks(t *testing.T) {
	w, err := NewWriter(io.Discard, Header{})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Write(Event{Op: OpMalloc, Size: 1, Stack: 1}); err == nil || !strings.Contains(err.Error(), "stack 1 is not in the writer's stack table (0 stacks)") {
		t.Errorf("writer: %v", err)
	}
	st := NewStacks()
	st.AddFrames([]Frame{{"f", "a.py", 3}})
	data := encodeStacks(t, st, []Event{{Op: OpMalloc, Size: 512, Stack: 1}})
	// The event's stack 1 made 2 (the last byte of the event, before the
	// frame's CRC): the CRC fails first, so fix it up.
	i := bytes.Index(data, []byte{0x9b, 0x01, 0x00, 0x00, 0xcd, 0x02, 0x00, 0x00, 0x00, 0x00, 0xa0, 0x00, 0x00, 0x01})
	if i < 0 {
		t.Fatal("event not found")
	}
	bad := append([]byte(nil), data...)
	bad[i+13] = 2
	bad = fixCRCs(t, bad)
	if _, _, err := decodeAll(bad); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "stack 2 is not in the trace's stack table (1 stacks)") {
		t.Errorf("reader: %v", err)
	}
	v2 := append([]byte(nil), data...)
	v2[8] = 2
	if _, _, err := decodeAll(v2); !errors.Is(err, ErrCorrupt) {
		t.Errorf("version 2 with stacks: %v", err)
	}
}

// TestFormatVersion2 reads a file written by a build of format version 2
// (before stacks): the same events as the text form.
func TestFormatVersion2(t *testing.T) {
	h, evs := readSmall(t)
	data, err := os.ReadFile("testdata/small_v2.trace")
	if err != nil {
		t.Fatal(err)
	}
	if data[8] != 2 {
		t.Fatalf("small_v2.trace has version byte %d, want 2", data[8])
	}
	h2, evs2, err := decodeAll(data)
	if err != nil {
		t.Fatal(err)
	}
	h.Version = 2
	if !reflect.DeepEqual(h, h2) || !reflect.DeepEqual(evs, evs2) {
		t.Errorf("got %+v %+v\nwant %+v %+v", h2, evs2, h, evs)
	}
}

// fixCRCs recomputes the CRC of every frame of a native trace and the
// trailer's checksum of the event and stack frames, so that a test's
// change to a payload reaches the decoder.
func fixCRCs(t *testing.T, data []byte) []byte {
	t.Helper()
	out := append([]byte(nil), data[:9]...)
	var all uint32
	for p := 9; p < len(data); {
		kind := data[p]
		n, k := binary.Uvarint(data[p+1:])
		payload := data[p+1+k : p+1+k+int(n)]
		p += 1 + k + int(n) + 4
		if kind == frameTrailer {
			var tr trailer
			if err := msgpack.Unmarshal(payload, &tr); err != nil {
				t.Fatal(err)
			}
			tr.CRC = all
			var err error
			if payload, err = msgpack.Marshal(&tr); err != nil {
				t.Fatal(err)
			}
		} else if kind != frameHeader {
			all = crc32.Update(all, castagnoli, payload)
		}
		out = append(out, kind)
		out = binary.AppendUvarint(out, uint64(len(payload)))
		out = append(out, payload...)
		out = binary.LittleEndian.AppendUint32(out, crc32.Checksum(payload, castagnoli))
	}
	return out
}

// TestFormatStacksCopied: a native trace with stacks copied through a
// Writer that takes the reader's table once, before the first event (as
// record import, --viz and --sites take it), is the same file; the table
// was nil until the first stack frame was read, and the copy failed at its
// first malloc with a stack ("stack 1 is not in the writer's stack table
// (0 stacks)").
func TestFormatStacksCopied(t *testing.T) {
	st := NewStacks()
	var in bytes.Buffer
	w, err := NewWriter(&in, Header{Source: "text"})
	if err != nil {
		t.Fatal(err)
	}
	w.SetStacks(st)
	for i := range 300 {
		ev := Event{Op: OpMalloc, Addr: uint64(i + 1), Size: 512, Time: int64(i)}
		if i%2 == 1 {
			ev.Stack = st.AddFrames([]Frame{{"f", "a.py", int64(i / 10)}, {"main", "train.py", 12}})
		}
		if err := w.Write(ev); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	r, err := NewReader(bytes.NewReader(in.Bytes()), "in.trace")
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	w2, err := NewWriter(&out, r.Header())
	if err != nil {
		t.Fatal(err)
	}
	w2.SetStacks(r.Stacks())
	for {
		ev, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := w2.Write(ev); err != nil {
			t.Fatal(err)
		}
	}
	if err := w2.Close(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out.Bytes(), in.Bytes()) {
		t.Errorf("the copy differs from the trace (%d bytes against %d)", out.Len(), in.Len())
	}
}

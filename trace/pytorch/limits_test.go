package pytorch

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

// gzipOf returns the gzip of the parts in turn, each repeated as many
// times as its count says: the bombs below are tiny once compressed.
func gzipOf(parts ...any) []byte {
	var b bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&b, gzip.BestSpeed)
	for i := 0; i < len(parts); i += 2 {
		s, n := parts[i].(string), parts[i+1].(int)
		chunk := []byte(strings.Repeat(s, min(n, 1+(64<<10)/len(s))))
		for ; n > 0; n -= len(chunk) / len(s) {
			zw.Write(chunk[:min(n, len(chunk)/len(s))*len(s)])
		}
	}
	zw.Close()
	return b.Bytes()
}

func le32(n uint32) string {
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], n)
	return string(b[:])
}

func le64(n uint64) string {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], n)
	return string(b[:])
}

// settingsPrefix starts a snapshot with an empty device trace and
// allocator_settings {"a": ...}, the value to follow; settingsEnd ends it.
func settingsPrefix() string {
	var b bytes.Buffer
	b.Write([]byte{0x80, 2, '}', '('})
	pickleValue(&b, "device_traces")
	pickleValue(&b, []any{[]any{}})
	pickleValue(&b, "allocator_settings")
	b.WriteString("}(")
	pickleValue(&b, "a")
	return b.String()
}

const settingsEnd = "uu."

// framesPrefix starts a snapshot whose one entry, an alloc, has a frames
// list whose items are to follow (a batch after a MARK), the frame dict
// {"name": "f", "filename": "f.py", "line": 1} at memo index 1;
// framesEnd ends it after an APPENDS that closes the batch.
func framesPrefix() string {
	var b bytes.Buffer
	b.Write([]byte{0x80, 2, '}', '('})
	pickleValue(&b, "device_traces")
	b.WriteString("]](}(")
	for _, kv := range []kv{{"action", "alloc"}, {"addr", 4096}, {"size", 512}, {"stream", 0}} {
		pickleValue(&b, kv.k)
		pickleValue(&b, kv.v)
	}
	pickleValue(&b, "frames")
	b.WriteString("](}q\x01(")
	for _, kv := range []kv{{"name", "f"}, {"filename", "f.py"}, {"line", 1}} {
		pickleValue(&b, kv.k)
		pickleValue(&b, kv.v)
	}
	b.WriteString("u")
	return b.String()
}

const framesEnd = "ueau."

// TestImportLimits: pickles that go over the decoder's limits (issue 36:
// 4M nested lists took 1.6 GB, 100M MARKs 2.5 GB, a string of 1 GiB more
// than 6 GB, a LONG4 integer of 16 MiB minutes, 50M frames in a stack
// more than 6 GB) are refused with a one-line error that names the file,
// the pickle byte and the limit, wrapping ErrLimit, and allocate little
// on the way (under a memory limit, in case they do not). Before, each
// was read on (and most then failed as not a snapshot, or not at all).
func TestImportLimits(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(1 << 30))
	stack := "\x80\x02" + strings.Repeat("]", 1<<18) + strings.Repeat("a", 1<<18-1) + "."
	sp := settingsPrefix()
	fp := framesPrefix()
	for _, tc := range []struct {
		name     string
		data     []byte
		want     string
		maxAlloc uint64 // bytes allocated by Import at most
	}{
		{"nested.pickle", []byte(stack),
			"nested.pickle: pickle byte 65538: a stack of 65537 values is over the limit of 65536 values of this importer; no real snapshot comes near it",
			48 << 20},
		{"nested.pickle.gz", gzipOf("\x80\x02", 1, "}X\x00\x00\x00\x00", 1<<18, "N", 1, "s", 1<<18, ".", 1), // dicts, each under the empty key of the one before
			"nested.pickle.gz: pickle byte 196610: a stack of 65537 values is over the limit of 65536 values of this importer; no real snapshot comes near it",
			48 << 20},
		{"marks.pickle.gz", gzipOf("\x80\x02", 1, "(", 1<<22, ".", 1),
			"marks.pickle.gz: pickle byte 4098: a mark stack of 4097 marks is over the limit of 4096 marks of this importer; no real snapshot comes near it",
			4 << 20},
		{"str8.pickle.gz", gzipOf("\x80\x04\x8d"+le64(1<<25), 1, "a", 1<<25, ".", 1),
			"str8.pickle.gz: pickle byte 2: a string of 33554432 bytes is over the limit of 16777216 bytes of this importer; no real snapshot comes near it",
			4 << 20},
		{"str1g.pickle", []byte("\x80\x04\x8d" + le64(1<<30) + "aaaa"),
			"str1g.pickle: pickle byte 2: a string of 1073741824 bytes is over the limit of 16777216 bytes of this importer; no real snapshot comes near it",
			4 << 20},
		{"bytes8.pickle.gz", gzipOf("\x80\x04\x8e"+le64(1<<25), 1, "b", 1<<25, ".", 1),
			"bytes8.pickle.gz: pickle byte 2: a bytes of 33554432 bytes is over the limit of 16777216 bytes of this importer; no real snapshot comes near it",
			4 << 20},
		{"str4.pickle.gz", gzipOf("\x80\x02X"+le32(1<<25), 1, "c", 1<<25, ".", 1),
			"str4.pickle.gz: pickle byte 2: a string of 33554432 bytes is over the limit of 16777216 bytes of this importer; no real snapshot comes near it",
			4 << 20},
		// A LONG4 integer in the settings: 1 MiB took 2 s to format, 16
		// MiB minutes.
		{"long4.pickle.gz", gzipOf(sp+"\x8b"+le32(1<<20), 1, "\x01", 1<<20, settingsEnd, 1),
			"long4.pickle.gz: pickle byte 59: an integer of 1048576 bytes is over the limit of 4096 bytes of this importer; no real snapshot comes near it",
			4 << 20},
		{"long4huge.pickle", []byte(sp + "\x8b" + le32(1<<24) + "\x01\x01"),
			"long4huge.pickle: pickle byte 59: an integer of 16777216 bytes is over the limit of 4096 bytes of this importer; no real snapshot comes near it",
			4 << 20},
		// Memo indexes out of order, which CPython never writes.
		{"sparse.pickle", []byte("\x80\x02" + func() string {
			var b strings.Builder
			for i := range uint32(70000) {
				b.WriteString("Nr" + le32(^i) + "0")
			}
			return b.String()
		}() + "N."),
			"sparse.pickle: pickle byte 458755: memo index 4294901759, with 65536 others out of order, is over the limit of 65536 slots of this importer; no real snapshot comes near it",
			16 << 20},
		// A value memoized again and again (CPython memoizes an object
		// once): 4 bytes of memo a byte of pickle.
		{"memoize.pickle.gz", gzipOf("\x80\x04\x8c\x01s", 1, "\x94", 1<<24, ".", 1),
			"memoize.pickle.gz: bad pickle at byte 6: opcode 0x94: the value on top is memoized already",
			4 << 20},
		{"getput.pickle.gz", gzipOf("\x80\x02Nq\x00", 1, "h\x00q\x01", 1<<22, ".", 1),
			"getput.pickle.gz: bad pickle at byte 7: opcode 0x71: the value on top is memoized already",
			4 << 20},
		// Lists kept (in the settings) through the memo, off the stack.
		{"held.pickle.gz", gzipOf(sp+"](", 1, "]\x940", 1<<19, "e"+settingsEnd, 1),
			"held.pickle.gz: pickle byte 393262: a list, dict, tuple or set held with 131072 others is over the limit of 131072 of this importer; no real snapshot comes near it",
			128 << 20},
		// One frame dict 256001 times in a stack (through the memo, in
		// batches of 1000 as CPython writes them).
		{"frames.pickle.gz", gzipOf(fp+"e", 1, "("+strings.Repeat("h\x01", 1000)+"e", 1<<8, framesEnd, 1),
			"frames.pickle.gz: pickle byte 132293: a frames list of 66001 frames is over the limit of 65536 frames of this importer; no real snapshot comes near it",
			16 << 20},
		// Frame dicts made and dropped, never in the frames list.
		{"framedicts.pickle.gz", gzipOf(fp+"e(", 1, "}0", 1<<18, "e"+framesEnd, 1),
			"framedicts.pickle.gz: pickle byte 131235: a frame dict read with 65536 others not yet in a frames list is over the limit of 65536 of this importer; no real snapshot comes near it",
			16 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			alloc := allocated(func() { _, err = Import(bytes.NewReader(tc.data), tc.name, Options{}) })
			if err == nil || err.Error() != tc.want {
				t.Errorf("error %v\nwant %s", err, tc.want)
			} else if !errors.Is(err, ErrLimit) && !strings.Contains(tc.want, "bad pickle") {
				t.Errorf("error %v does not wrap ErrLimit", err)
			}
			if alloc > tc.maxAlloc {
				t.Errorf("Import allocated %d bytes, want at most %d", alloc, tc.maxAlloc)
			}
		})
	}
}

// allocated returns the bytes f allocates.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestDecoderLimits: the limits that real-sized inputs would take too
// long to reach in a test, lowered: the memo's slots and values, and the
// bytes of the strings kept.
func TestDecoderLimits(t *testing.T) {
	for _, tc := range []struct {
		name string
		data string
		lim  func(*limits)
		want string
	}{
		{"memo", "\x80\x02N" + strings.Repeat("]\x94", 1001) + ".", func(l *limits) { l.memo = 1000 },
			"pickle byte 2004: a memo of 1001 slots is over the limit of 1000 slots of this importer; no real snapshot comes near it"},
		{"memovals", "\x80\x02]" + strings.Repeat("]\x94a", 101) + ".", func(l *limits) { l.memoVals = 100 },
			"pickle byte 304: a memo of 101 values other than strings and skipped containers is over the limit of 100 values of this importer; no real snapshot comes near it"},
		{"strs", "\x80\x02]" + "X\x04\x00\x00\x00abcd0X\x04\x00\x00\x00abce0X\x04\x00\x00\x00abcf0X\x04\x00\x00\x00abcga.", func(l *limits) { l.strs = int64(d0strs()) + 3*68 },
			"pickle byte 33: 37 distinct strings of 2693 bytes in all (counting 64 more for each) is over the limit of 2625 bytes of this importer; no real snapshot comes near it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newDecoder(strings.NewReader(tc.data), 0, nil)
			tc.lim(&d.lim)
			err := d.run()
			var le *limitError
			if !errors.As(err, &le) || err.Error() != tc.want {
				t.Errorf("error %v\nwant %s", err, tc.want)
			}
		})
	}
}

// d0strs returns the bytes a new decoder counts for the strings it starts
// with.
func d0strs() int64 { return newDecoder(strings.NewReader(""), 0, nil).strBytes }

// TestMarkWalk: a container made under many marks, each with a scalar
// below it, looks through a bounded number of them for its context;
// before, through all of them (4000 marks and 1M empty lists: 4e9 steps,
// 23 s), a time bomb of a few KB.
func TestMarkWalk(t *testing.T) {
	var b bytes.Buffer
	b.Write([]byte{0x80, 2, '}', '('})
	pickleValue(&b, "junk") // skipped, and so is what goes in its list
	b.WriteString("](" + strings.Repeat("N(", 4000) + strings.Repeat("]0", 10000) + ".")
	d := newDecoder(&b, 0, nil)
	err := d.run()
	if err == nil || err.Error() != "opcode 0x2e: 8005 values left on the stack" {
		t.Errorf("error %v", err)
	}
	if max := int64(10000 * (maxMarkWalk + 1)); d.markSteps > max {
		t.Errorf("%d steps through the marks for 10000 lists, want at most %d", d.markSteps, max)
	}
}

package pytorch

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"
	"unicode/utf8"

	"github.com/gpualloc/allocsim/trace"
)

// pickleStrings returns the strings of a pickle of the opcodes the
// SnapshotWriter writes, in order, or an error for an opcode it does not
// write; it reads the opcodes as Python's unpickler does, without
// decoding the strings (Python rejects one that is not UTF-8).
func pickleStrings(data []byte) ([]string, error) {
	var out []string
	for i := 0; i < len(data); {
		op := data[i]
		i++
		arg := 0
		switch op {
		case opMark, opAppend, opAppends, opEmptyList, opEmptyDict, opSetItem, opSetItems,
			opNewTrue, opNewFalse, opTuple2, opMemoize:
		case opStop:
			return out, nil
		case opProto, opBinInt1, opBinGet:
			arg = 1
		case opBinInt2:
			arg = 2
		case opBinInt, opLongBinGet:
			arg = 4
		case opLong1:
			if i >= len(data) {
				return nil, fmt.Errorf("truncated at %d", i)
			}
			arg = 1 + int(data[i])
		case opShortBinUnicode:
			if i >= len(data) {
				return nil, fmt.Errorf("truncated at %d", i)
			}
			n := int(data[i])
			if i+1+n > len(data) {
				return nil, fmt.Errorf("truncated at %d", i)
			}
			out = append(out, string(data[i+1:i+1+n]))
			arg = 1 + n
		case opBinUnicode:
			if i+4 > len(data) {
				return nil, fmt.Errorf("truncated at %d", i)
			}
			n := int(binary.LittleEndian.Uint32(data[i:]))
			if i+4+n > len(data) {
				return nil, fmt.Errorf("truncated at %d", i)
			}
			out = append(out, string(data[i+4:i+4+n]))
			arg = 4 + n
		default:
			return nil, fmt.Errorf("opcode %#x at %d", op, i-1)
		}
		i += arg
	}
	return nil, fmt.Errorf("no STOP")
}

// A frame, file or setting with invalid UTF-8 is written with U+FFFD in
// place of the bad bytes, so that Python can load the snapshot (issue
// 36, item 5), and Replaced counts the strings so changed.
func TestSnapshotWriterInvalidUTF8(t *testing.T) {
	long := "deep\xff" + string(bytes.Repeat([]byte("x"), 300))
	entries := []TraceEntry{
		{Action: "segment_alloc", Addr: seg, Size: 2 << 20},
		{Action: "alloc", Addr: seg, Size: 1000, Frames: []trace.Frame{{Name: "fwd\xff", File: "m\xc3.py", Line: 1}, {Name: long, File: "m.py", Line: 2}}},
		{Action: "alloc", Addr: seg + 1024, Size: 1000, Frames: []trace.Frame{{Name: "fwd\xff", File: "m\xc3.py", Line: 1}}},
	}
	var buf bytes.Buffer
	w := NewSnapshotWriter(&buf, 0)
	for _, e := range entries {
		if err := w.Add(e); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(nil, map[string]string{"k\xfe": "v\xfd"}); err != nil {
		t.Fatal(err)
	}
	strs, err := pickleStrings(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, s := range strs {
		if !utf8.ValidString(s) {
			t.Errorf("string %q is not UTF-8: Python cannot load the pickle", s)
		}
		seen[s] = true
	}
	for _, s := range []string{"fwd\uFFFD", "m\uFFFD.py", "deep\uFFFD" + long[5:], "k\uFFFD", "v\uFFFD"} {
		if !seen[s] {
			t.Errorf("no string %q in the pickle", s)
		}
	}
	if got := w.Replaced(); got != 5 {
		t.Errorf("Replaced() = %d, want 5 (fwd, m.py, deep; the second frame through the memo; k, v)", got)
	}
}

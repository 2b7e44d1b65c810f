package pytorch

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/big"
	"strconv"
	"strings"
)

// This file is the pickle machine of the snapshot decoder (stream.go):
// its values, the buffered input, the memo, and the opcodes, run by
// decoder.run.

// kind is the kind of a value on the decoder's stack.
type kind uint8

const (
	vNone       kind = iota + 1
	vBool            // n: 0 or 1
	vInt             // n: the int64
	vUint            // n: the bits of a uint64 above math.MaxInt64
	vBig             // n: index into decoder.bigs
	vFloat           // n: the float64's bits
	vStr             // n: string id
	vBytes           // n: string id of the bytes
	vCont            // n: container slot, g: its generation
	vSkip            // n: the skipped container's pyKind
	vFrame           // n: a frame dict already converted, its frame id (frames.go)
	vStack           // n: a frames list already converted, its stack id
	vFrameBuild      // n: a frame dict being read, its index in decoder.building; g: buildGen
)

// pyKind is the Python type of a container.
type pyKind uint8

const (
	pyList pyKind = iota + 1
	pyDict
	pyTuple
	pySet
	pyFrozenSet
)

var pyKindNames = [...]string{pyList: "list", pyDict: "dict", pyTuple: "tuple", pySet: "set", pyFrozenSet: "set"}

// value is a value on the stack or in the memo.
type value struct {
	k kind
	g uint32 // generation of a vCont
	n int64
}

// container is a list, dict, tuple or set that the decoder keeps, whole or
// in part by its role. items holds a list's items, or a dict's keys and
// values in turn.
type container struct {
	kind pyKind
	role role
	// keys is a filter of a dict's string keys: bit n%16 is set once it
	// holds the string of id n, so that setKey and hasKey scan the items
	// only for a key whose bit is set (in the padding before gen).
	keys  uint16
	gen   uint32
	n     int      // items appended or keys set, kept or not
	items []value  // kept items (dict: key, value, key, value...)
	fids  []uint32 // roleFrames: the frame ids of its items
	dev   value    // roleTraces: the item at the device, k 0 if none yet
	blks  []snapBlock
	// memo is 1 + the memo index of a frames container, 0 if it was
	// not memoized: its slot is set to its id once converted.
	memo uint64
}

// pickleError is a problem in the pickle itself at byte Offset.
type pickleError struct {
	Offset int64
	Op     byte
	Msg    string
}

func (e *pickleError) Error() string { return fmt.Sprintf("opcode %#02x: %s", e.Op, e.Msg) }

// limits bound what a pickle can make the decoder hold or compute, so
// that a small file (or a small gzip'd one) that is broken or hostile is
// refused with a one-line error rather than taking gigabytes or minutes:
// 4M nested lists took 1.6 GB, 100M MARKs 2.5 GB, a string of 1 GiB more
// than 6 GB, a LONG4 integer of 16 MiB minutes. Each limit is far above
// what real snapshots need. The largest figures measured (the snapshots
// of testdata/, of trace/pytorch/testdata and of the shared traces, and a
// 64 MiB one of testdata/bigsnap.py, shaped as PyTorch writes one with
// stacks, whose memo grows with its size: 16M slots at 1 GiB) are given
// with each.
type limits struct {
	stack    int    // values on the stack (real: 1169, a batch of 1000 entries)
	marks    int    // marks at once (real: 7)
	conts    int    // lists, dicts, tuples and sets held at once (real: 1158)
	str      uint64 // bytes of one str or bytes (real: 7956, a C++ frame name)
	strs     int64  // bytes of all distinct strings, plus 64 a string (real: 0.5 MB)
	long     uint64 // bytes of one LONG4 integer (real: 9; LONG1 holds up to 255)
	memo     int    // memo slots (real: 1.5M; 16M for 1 GiB of snapshot)
	sparse   int    // memo slots beyond the next (real: 0, CPython counts up)
	memoVals int    // memoized values other than strings and skipped containers (real: 353)
	frames   int    // frames of one frames list, and frame dicts read at once (real: 269)
}

// defaultLimits are the decoder's limits, at least 10 times the real
// figures above (the memo's 16 times a 1 GiB snapshot's); their memory
// is at most about 1 MiB for the stack, 15 MiB for the containers (112
// bytes each, and a list or dict's items), 48 MiB for a string read, 128
// MiB for the strings kept, and 1 GiB for the memo (4 bytes a slot, as a
// snapshot of 16 GiB needs). A device trace that a pickle builds in a way
// CPython's pickler never does is kept whole, a container an entry: up to
// 131072 entries.
var defaultLimits = limits{
	stack:    1 << 16,
	marks:    1 << 12,
	conts:    1 << 17,
	str:      16 << 20,
	strs:     128 << 20,
	long:     4 << 10,
	memo:     1 << 28,
	sparse:   1 << 16,
	memoVals: 1 << 20,
	frames:   1 << 16,
}

// limitError is a pickle that goes over one of the decoder's limits at
// byte Offset: What is what went over (with its size where the pickle
// claims one), Limit and Unit the limit.
type limitError struct {
	Offset int64
	What   string
	Limit  int64
	Unit   string
}

func (e *limitError) Error() string {
	return fmt.Sprintf("pickle byte %d: %s is over the limit of %d%s of this importer; no real snapshot comes near it", e.Offset, e.What, e.Limit, e.Unit)
}

func (e *limitError) Unwrap() error { return ErrLimit }

// over returns a limitError at byte at.
func (d *decoder) over(at int64, limit int64, unit, format string, args ...any) error {
	return &limitError{Offset: at, What: fmt.Sprintf(format, args...), Limit: limit, Unit: unit}
}

// overLater records a limitError found where no error can be returned,
// at the opcode being run; run returns it once the opcode is done.
func (d *decoder) overLater(limit int64, unit, format string, args ...any) {
	if d.limitErr == nil {
		d.limitErr = d.over(d.at, limit, unit, format, args...)
	}
}

// errTruncated is returned by the decoder when the pickle ends before its
// STOP (or before the end of a frame it declared); errInput wraps an error
// of the underlying reader.
var errTruncated = errors.New("truncated")

type inputError struct{ err error }

func (e *inputError) Error() string { return e.err.Error() }
func (e *inputError) Unwrap() error { return e.err }

// input is a buffered reader of the pickle that knows the offset of every
// byte.
type input struct {
	r    io.Reader
	buf  []byte
	pos  int   // next unread byte in buf
	end  int   // end of the valid bytes in buf
	base int64 // pickle offset of buf[0]
	err  error // the first error of r (io.EOF at the end), sticky
}

const inputBuffer = 256 << 10

// maxLine bounds the text argument of the opcodes of protocol 0 (a number,
// a string); it is less than the buffer, which must hold the whole line.
const maxLine = 64 << 10

func newInput(r io.Reader) *input {
	return &input{r: r, buf: make([]byte, inputBuffer)}
}

// offset returns the pickle offset of the next unread byte.
func (in *input) offset() int64 { return in.base + int64(in.pos) }

// total returns the number of pickle bytes read from r so far.
func (in *input) total() int64 { return in.base + int64(in.end) }

// more makes at least n (at most len(buf)) bytes available at buf[pos:]
// and reports whether the input had them. Its test of the bytes at hand
// is inlined; fill reads more.
func (in *input) more(n int) bool {
	if in.end-in.pos >= n {
		return true
	}
	return in.fill(n)
}

// fill is more when the buffer holds fewer than n bytes.
func (in *input) fill(n int) bool {
	if in.err != nil {
		return false
	}
	if in.pos > 0 {
		copy(in.buf, in.buf[in.pos:in.end])
		in.base += int64(in.pos)
		in.end -= in.pos
		in.pos = 0
	}
	idle := 0
	for (in.end < n || in.end < len(in.buf)/2) && in.err == nil {
		k, err := in.r.Read(in.buf[in.end:])
		in.end += k
		if err != nil {
			in.err = err
		} else if k == 0 {
			if idle++; idle > 100 {
				in.err = io.ErrNoProgress
			}
		}
	}
	return in.end-in.pos >= n
}

// u8, u16, u32 and u64 read a little-endian unsigned integer of 1, 2, 4 or
// 8 bytes and report whether the input had it. They read the first
// argument of an opcode only: run has then made 16 bytes available after
// the opcode's, or all that the input holds (in.err is set), so that the
// bytes at hand say it all and the reads are inlined.
func (in *input) u8() (uint64, bool) {
	if in.end-in.pos < 1 {
		return 0, false
	}
	in.pos++
	return uint64(in.buf[in.pos-1]), true
}

func (in *input) u16() (uint64, bool) {
	if in.end-in.pos < 2 {
		return 0, false
	}
	in.pos += 2
	return uint64(binary.LittleEndian.Uint16(in.buf[in.pos-2:])), true
}

func (in *input) u32() (uint64, bool) {
	if in.end-in.pos < 4 {
		return 0, false
	}
	in.pos += 4
	return uint64(binary.LittleEndian.Uint32(in.buf[in.pos-4:])), true
}

func (in *input) u64() (uint64, bool) {
	if in.end-in.pos < 8 {
		return 0, false
	}
	in.pos += 8
	return binary.LittleEndian.Uint64(in.buf[in.pos-8:]), true
}

// skip steps over n bytes, which need not fit in the buffer. It reports
// whether the input had them.
func (in *input) skip(n uint64) bool {
	for n > 0 {
		if in.pos == in.end && !in.more(1) {
			return false
		}
		k := uint64(in.end - in.pos)
		if k > n {
			k = n
		}
		in.pos += int(k)
		n -= k
	}
	return true
}

// bytes returns the next n bytes, which need not fit in the buffer; the
// result is valid until the next call. It grows its result only as the
// bytes arrive, so that a length claimed beyond the end of the input
// allocates nothing. It reports whether the input had them.
func (in *input) bytes(n uint64, scratch *[]byte) ([]byte, bool) {
	if n <= uint64(len(in.buf)) {
		if !in.more(int(n)) {
			return nil, false
		}
		b := in.buf[in.pos : in.pos+int(n)]
		in.pos += int(n)
		return b, true
	}
	out := (*scratch)[:0]
	for uint64(len(out)) < n {
		if in.pos == in.end && !in.more(1) {
			*scratch = out
			return nil, false
		}
		k := min(uint64(in.end-in.pos), n-uint64(len(out)))
		out = append(out, in.buf[in.pos:in.pos+int(k)]...)
		in.pos += int(k)
	}
	*scratch = out
	return out, true
}

// line returns the bytes up to the next newline, without it.
func (in *input) line(max int) ([]byte, bool) {
	for {
		if i := indexByte(in.buf[in.pos:in.end], '\n'); i >= 0 {
			b := in.buf[in.pos : in.pos+i]
			in.pos += i + 1
			return b, true
		}
		if in.end-in.pos >= max || !in.more(in.end-in.pos+1) {
			return nil, false
		}
	}
}

func indexByte(b []byte, c byte) int {
	for i, x := range b {
		if x == c {
			return i
		}
	}
	return -1
}

// memoTable maps memo indexes to values in 4 bytes a slot: 0 unset, else a
// tag in the top two bits and a payload below. The dense slots are in
// chunks of memoChunk, allocated as the memo grows (CPython's pickler
// counts its indexes up from 0), so that a slot is two loads away and the
// table never copies itself; indexes out of that order go to sparse.
type memoTable struct {
	chunks []*[memoChunk]uint32 // dense slots
	// spare are chunks to reuse: the first reading's, for the second
	// (source.fill), which would otherwise hold as many new ones while
	// those are not yet collected.
	spare  []*[memoChunk]uint32
	sparse map[uint64]uint32
	n      int // slots set (MEMOIZE's index)
	vals   []value
}

const (
	memoChunk = 4096
	tagStr    = 1 << 30
	tagVal    = 2 << 30
	tagSkip   = 3 << 30
	tagMask   = 3 << 30
)

// get returns slot idx and whether it is set.
func (m *memoTable) get(idx uint64) (uint32, bool) {
	if c := idx / memoChunk; c < uint64(len(m.chunks)) {
		if x := m.chunks[c][idx%memoChunk]; x != 0 {
			return x, true
		}
	}
	if len(m.sparse) == 0 {
		return 0, false
	}
	x, ok := m.sparse[idx]
	return x, ok
}

// dense reports whether a new slot idx would be dense (else sparse).
func (m *memoTable) dense(idx uint64) bool { return idx/memoChunk <= uint64(len(m.chunks)) }

func (m *memoTable) put(idx uint64, x uint32) {
	c := idx / memoChunk
	if c == uint64(len(m.chunks)) {
		var ch *[memoChunk]uint32
		if k := len(m.spare); k > 0 {
			ch, m.spare[k-1] = m.spare[k-1], nil
			m.spare = m.spare[:k-1]
			*ch = [memoChunk]uint32{}
		} else {
			ch = new([memoChunk]uint32)
		}
		m.chunks = append(m.chunks, ch)
	}
	if c < uint64(len(m.chunks)) {
		p := &m.chunks[c][idx%memoChunk]
		if *p == 0 {
			m.n++
		}
		*p = x
		return
	}
	if m.sparse == nil {
		m.sparse = map[uint64]uint32{}
	}
	if _, ok := m.sparse[idx]; !ok {
		m.n++
	}
	m.sparse[idx] = x
}

// container returns the container of v, or nil if v is not one (or one
// whose slot has been reused since).
func (d *decoder) container(v value) *container {
	if v.k != vCont {
		return nil
	}
	c := &d.conts[v.n]
	if c.gen != v.g {
		return nil
	}
	return c
}

func (d *decoder) newContainer(kind pyKind, r role) value {
	var i int32
	if n := len(d.free); n > 0 {
		i = d.free[n-1]
		d.free = d.free[:n-1]
	} else {
		if len(d.conts) >= d.lim.conts {
			d.overLater(int64(d.lim.conts), "", "a list, dict, tuple or set held with %d others", len(d.conts))
			return value{k: vSkip, n: int64(kind)}
		}
		d.conts = append(d.conts, container{})
		i = int32(len(d.conts) - 1)
	}
	c := &d.conts[i]
	c.gen++
	c.kind, c.role, c.n, c.keys = kind, r, 0, 0
	c.items, c.fids = c.items[:0], c.fids[:0]
	c.dev = value{}
	c.blks = c.blks[:0]
	c.memo = 0
	return value{k: vCont, g: c.gen, n: int64(i)}
}

// release lets the container of v be reused; references to it left in the
// stack or memo then resolve to nothing.
func (d *decoder) release(v value) {
	if c := d.container(v); c != nil {
		c.gen++
		d.free = append(d.free, int32(v.n))
	}
}

// pyType names v's Python type for error messages.
func (d *decoder) pyType(v value) string {
	switch v.k {
	case vNone:
		return "None"
	case vBool:
		return "bool"
	case vInt, vUint, vBig:
		return "int"
	case vFloat:
		return "float"
	case vStr:
		return "str"
	case vBytes:
		return "bytes"
	case vSkip:
		return pyKindNames[v.n]
	case vFrame:
		return "dict"
	case vStack:
		return "list"
	case vFrameBuild:
		return "dict"
	case vCont:
		if c := d.container(v); c != nil {
			return pyKindNames[c.kind]
		}
		return "value no longer kept"
	}
	return "value"
}

// run executes opcodes until STOP (d.stopped), until a batch of entries
// has been converted when pauseAfterAppend is set (d.paused), or until an
// error. A pickle that ends early gives errTruncated; an error of the
// underlying reader an *inputError; a bad pickle a *pickleError; an error
// of the sink is returned as is.
func (d *decoder) run() error {
	in := d.in
	d.paused = false
	for !d.stopped && !d.paused {
		// 16 bytes at hand (the opcode and up to 15 of its first
		// argument, for u8 to u64), or all there are.
		if in.end-in.pos < 16 && !in.more(16) && in.pos == in.end {
			return d.eof()
		}
		at := in.offset()
		d.at = at
		op := in.buf[in.pos]
		in.pos++
		d.prevMemo, d.memoTop = d.memoTop, false
		var err error
		switch op {
		case 0x94: // MEMOIZE
			if len(d.stack) == 0 {
				return d.fail(at, op, "empty stack")
			}
			err = d.memoize(at, op, uint64(d.memo.n), d.stack[len(d.stack)-1])
		case 'h', 'j': // BINGET LONG_BINGET
			var idx uint64
			var ok bool
			if op == 'h' {
				idx, ok = in.u8()
			} else {
				idx, ok = in.u32()
			}
			if !ok {
				return d.eof()
			}
			err = d.get(at, op, idx)
		case 0x8c: // SHORT_BINUNICODE
			if !in.more(1) {
				return d.eof()
			}
			n := int(in.buf[in.pos])
			if !in.more(1 + n) {
				return d.eof()
			}
			id := d.intern(in.buf[in.pos+1 : in.pos+1+n])
			in.pos += 1 + n
			d.stack = append(d.stack, value{k: vStr, n: int64(id)})
		case 'K', 'M', 'J': // BININT1 BININT2 BININT
			var x uint64
			var ok bool
			switch op {
			case 'K':
				x, ok = in.u8()
			case 'M':
				x, ok = in.u16()
			default:
				x, ok = in.u32()
				x = uint64(int32(x)) // signed
			}
			if !ok {
				return d.eof()
			}
			d.stack = append(d.stack, value{k: vInt, n: int64(x)})
		case 0x8a: // LONG1
			if !in.more(1) {
				return d.eof()
			}
			n := int(in.buf[in.pos])
			if !in.more(1 + n) {
				return d.eof()
			}
			d.stack = append(d.stack, d.long(in.buf[in.pos+1:in.pos+1+n]))
			in.pos += 1 + n
		case '}', ']': // EMPTY_DICT EMPTY_LIST
			k := pyList
			if op == '}' {
				k = pyDict
			}
			d.stack = append(d.stack, d.create(k))
		case '(': // MARK
			if len(d.marks) >= d.lim.marks {
				return d.over(at, int64(d.lim.marks), " marks", "a mark stack of %d marks", len(d.marks)+1)
			}
			d.marks = append(d.marks, len(d.stack))
		case 'u', 'e', 0x90: // SETITEMS APPENDS ADDITEMS
			m, ok := d.popMark()
			if !ok || m == 0 {
				if !ok {
					return d.fail(at, op, "no mark")
				}
				return d.fail(at, op, "stack underflow")
			}
			items := d.stack[m:]
			target := d.stack[m-1]
			if op == 'u' {
				err = d.setItems(at, op, target, items)
			} else {
				err = d.appendItems(at, op, target, items)
			}
			d.stack = d.stack[:m]
		case 's': // SETITEM
			n := len(d.stack)
			if n < 3 || d.topMark() > n-3 {
				return d.fail(at, op, "stack underflow")
			}
			err = d.setItems(at, op, d.stack[n-3], d.stack[n-2:])
			d.stack = d.stack[:n-2]
		case 'a': // APPEND
			n := len(d.stack)
			if n < 2 || d.topMark() > n-2 {
				return d.fail(at, op, "stack underflow")
			}
			err = d.appendItems(at, op, d.stack[n-2], d.stack[n-1:])
			d.stack = d.stack[:n-1]
		case 'N':
			d.stack = append(d.stack, value{k: vNone})
		case 0x88, 0x89: // NEWTRUE NEWFALSE
			var b int64
			if op == 0x88 {
				b = 1
			}
			d.stack = append(d.stack, value{k: vBool, n: b})
		case 'G': // BINFLOAT
			if !in.more(8) {
				return d.eof()
			}
			d.stack = append(d.stack, value{k: vFloat, n: int64(binary.BigEndian.Uint64(in.buf[in.pos:]))})
			in.pos += 8
		case 'X', 0x8d, 'U', 'T', 'C', 'B', 0x8e, 0x96: // strings and bytes with a length
			err = d.str(at, op)
		case 0x95: // FRAME
			n, ok := in.u64()
			if !ok {
				return d.eof()
			}
			d.frameEnd = in.offset() + int64(min(n, math.MaxInt64/2))
			d.memoTop = d.prevMemo // a frame may start between a value and its MEMOIZE
		case 0x80: // PROTO
			p, ok := in.u8()
			if !ok {
				return d.eof()
			}
			d.proto = int(p)
			if d.proto > 5 {
				return d.fail(at, op, "unsupported protocol %d", d.proto)
			}
		case '.': // STOP
			if len(d.stack) != 1 || len(d.marks) != 0 {
				if len(d.stack) == 0 {
					return d.fail(at, op, "empty stack")
				}
				return d.fail(at, op, "%d values left on the stack", len(d.stack)+len(d.marks))
			}
			// Python reads a frame whole before running it: a frame
			// that claims more bytes than follow is a truncated pickle.
			if d.frameEnd > in.offset() && !in.skip(uint64(d.frameEnd-in.offset())) {
				return d.eof()
			}
			d.root = d.stack[0]
			d.stopped = true
		case ')': // EMPTY_TUPLE
			d.stack = append(d.stack, d.tuple(pyTuple, nil))
		case 0x85, 0x86, 0x87: // TUPLE1 TUPLE2 TUPLE3
			k := int(op - 0x84)
			n := len(d.stack)
			if n < k || d.topMark() > n-k {
				return d.fail(at, op, "stack underflow")
			}
			var tmp [3]value
			copy(tmp[:], d.stack[n-k:])
			d.stack = d.stack[:n-k] // the tuple's context is below its items
			d.stack = append(d.stack, d.tuple(pyTuple, tmp[:k]))
		case 't', 0x91, 'l', 'd': // TUPLE FROZENSET LIST DICT (items from the mark)
			m, ok := d.popMark()
			if !ok {
				return d.fail(at, op, "no mark")
			}
			// The new value's context is below the mark; its items stay
			// in the stack's array, untouched until the push below.
			items := d.stack[m:]
			d.stack = d.stack[:m]
			var v value
			switch op {
			case 't':
				v = d.tuple(pyTuple, items)
			case 0x91:
				v = d.tuple(pyFrozenSet, items)
			case 'l':
				v = d.create(pyList)
				err = d.appendItems(at, op, v, items)
			case 'd':
				if len(items)%2 != 0 {
					return d.fail(at, op, "odd number of items")
				}
				v = d.create(pyDict)
				err = d.setItems(at, op, v, items)
			}
			d.stack = append(d.stack, v)
		case 0x8f: // EMPTY_SET
			d.stack = append(d.stack, d.create(pySet))
		case '0': // POP
			if n := len(d.stack); n > 0 && d.topMark() < n {
				d.stack = d.stack[:n-1]
			} else if _, ok := d.popMark(); !ok {
				return d.fail(at, op, "stack underflow")
			}
		case '1': // POP_MARK
			m, ok := d.popMark()
			if !ok {
				return d.fail(at, op, "no mark")
			}
			d.stack = d.stack[:m]
		case '2': // DUP
			if n := len(d.stack); n == 0 || d.topMark() == n {
				return d.fail(at, op, "stack underflow")
			}
			d.stack = append(d.stack, d.stack[len(d.stack)-1])
		case 'q', 'r': // BINPUT LONG_BINPUT
			var idx uint64
			var ok bool
			if op == 'q' {
				idx, ok = in.u8()
			} else {
				idx, ok = in.u32()
			}
			if !ok {
				return d.eof()
			}
			if len(d.stack) == 0 {
				return d.fail(at, op, "empty stack")
			}
			err = d.memoize(at, op, idx, d.stack[len(d.stack)-1])
		case 'p', 'g': // PUT GET (decimal index on a line)
			b, ok := in.line(32)
			if !ok {
				return d.eofOr(at, op, "no newline")
			}
			idx, perr := strconv.ParseUint(string(b), 10, 64)
			if perr != nil {
				return d.fail(at, op, "bad memo index %q", b)
			}
			if op == 'g' {
				err = d.get(at, op, idx)
			} else if len(d.stack) == 0 {
				return d.fail(at, op, "empty stack")
			} else {
				err = d.memoize(at, op, idx, d.stack[len(d.stack)-1])
			}
		case 'I', 'L', 'F': // INT LONG FLOAT as text
			b, ok := in.line(maxLine)
			if !ok {
				return d.eofOr(at, op, "no newline")
			}
			v, ok := d.textNumber(op, b)
			if !ok {
				return d.fail(at, op, "bad number %q", b)
			}
			d.stack = append(d.stack, v)
		case 'V', 'S': // UNICODE STRING as text
			b, ok := in.line(maxLine)
			if !ok {
				return d.eofOr(at, op, "no newline")
			}
			if op == 'S' {
				if len(b) < 2 || (b[0] != '\'' && b[0] != '"') || b[len(b)-1] != b[0] {
					return d.fail(at, op, "bad string %q", b[:min(len(b), 16)])
				}
				b = b[1 : len(b)-1]
			}
			d.stack = append(d.stack, value{k: vStr, n: int64(d.intern(b))})
		case 0x8b: // LONG4
			x, ok := in.u32()
			if !ok {
				return d.eof()
			}
			n := int32(x)
			if n < 0 {
				return d.fail(at, op, "negative length %d", n)
			}
			if uint64(n) > d.lim.long {
				return d.over(at, int64(d.lim.long), " bytes", "an integer of %d bytes", n)
			}
			b, ok := in.bytes(uint64(n), &d.scratch)
			if !ok {
				return d.eof()
			}
			d.stack = append(d.stack, d.long(b))
		case 'c', 0x93, 'R', 'b', 'i', 'o', 0x81, 0x92, 'P', 'Q', 0x82, 0x83, 0x84, 0x97, 0x98:
			return d.fail(at, op, "a Python object, not a plain value")
		default:
			return d.fail(at, op, "unknown opcode")
		}
		if err == nil && d.limitErr != nil {
			err = d.limitErr
		}
		// Each opcode pushes one value at most: the stack stays within
		// one value of its limit.
		if err == nil && len(d.stack) > d.lim.stack {
			err = d.over(at, int64(d.lim.stack), " values", "a stack of %d values", len(d.stack))
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// eof is the error for input that ended where more was needed.
func (d *decoder) eof() error {
	if d.in.err != nil && d.in.err != io.EOF {
		return &inputError{d.in.err}
	}
	return errTruncated
}

func (d *decoder) eofOr(at int64, op byte, msg string) error {
	if d.in.err != nil {
		return d.eof()
	}
	return d.fail(at, op, "%s", msg)
}

func (d *decoder) topMark() int {
	if n := len(d.marks); n > 0 {
		return d.marks[n-1]
	}
	return 0
}

func (d *decoder) popMark() (int, bool) {
	n := len(d.marks)
	if n == 0 {
		return 0, false
	}
	m := d.marks[n-1]
	d.marks = d.marks[:n-1]
	return m, true
}

// str pushes a string or bytes value with a length prefix.
func (d *decoder) str(at int64, op byte) error {
	in := d.in
	var n uint64
	var ok bool
	switch op {
	case 'U', 'C': // SHORT_BINSTRING SHORT_BINBYTES
		n, ok = in.u8()
	case 'X', 'T', 'B': // BINUNICODE BINSTRING BINBYTES
		n, ok = in.u32()
		if ok && op == 'T' && int32(n) < 0 {
			return d.fail(at, op, "negative length %d", int32(n))
		}
	default: // BINUNICODE8 BINBYTES8 BYTEARRAY8
		n, ok = in.u64()
	}
	if !ok {
		return d.eof()
	}
	if n > d.lim.str {
		what := "a string"
		if op == 'C' || op == 'B' || op == 0x8e || op == 0x96 {
			what = "a bytes"
		}
		return d.over(at, int64(d.lim.str), " bytes", "%s of %d bytes", what, n)
	}
	b, ok := in.bytes(n, &d.scratch)
	if !ok {
		return d.eof()
	}
	k := vStr
	if op == 'C' || op == 'B' || op == 0x8e || op == 0x96 {
		k = vBytes
	}
	d.stack = append(d.stack, value{k: k, n: int64(d.intern(b))})
	return nil
}

// long decodes a little-endian two's complement integer (LONG1, LONG4).
func (d *decoder) long(b []byte) value {
	n := len(b)
	switch {
	case n == 0:
		return value{k: vInt}
	case n <= 8:
		var x uint64
		for i := n - 1; i >= 0; i-- {
			x = x<<8 | uint64(b[i])
		}
		if shift := uint(64 - 8*n); shift > 0 {
			return value{k: vInt, n: int64(x<<shift) >> shift}
		}
		return value{k: vInt, n: int64(x)}
	case n == 9 && b[8] == 0:
		return value{k: vUint, n: int64(binary.LittleEndian.Uint64(b))}
	}
	be := make([]byte, n)
	for i := range b {
		be[n-1-i] = b[i]
	}
	x := new(big.Int).SetBytes(be)
	if b[n-1]&0x80 != 0 {
		x.Sub(x, new(big.Int).Lsh(big.NewInt(1), uint(8*n)))
	}
	return d.bigValue(x)
}

// bigValue returns x as the smallest value kind that holds it.
func (d *decoder) bigValue(x *big.Int) value {
	if x.IsInt64() {
		return value{k: vInt, n: x.Int64()}
	}
	if x.IsUint64() {
		return value{k: vUint, n: int64(x.Uint64())}
	}
	d.bigs = append(d.bigs, x)
	return value{k: vBig, n: int64(len(d.bigs) - 1)}
}

// textNumber parses the argument of INT, LONG or FLOAT.
func (d *decoder) textNumber(op byte, b []byte) (value, bool) {
	s := strings.TrimSpace(string(b))
	switch op {
	case 'F':
		f, err := strconv.ParseFloat(s, 64)
		return value{k: vFloat, n: int64(math.Float64bits(f))}, err == nil
	case 'I':
		switch s {
		case "00":
			return value{k: vBool}, true
		case "01":
			return value{k: vBool, n: 1}, true
		}
	case 'L':
		s = strings.TrimSuffix(s, "L")
	}
	if len(s) > 4000 {
		return value{}, false
	}
	x, ok := new(big.Int).SetString(s, 10)
	if !ok {
		return value{}, false
	}
	return d.bigValue(x), true
}

// memoize stores v at memo index idx; a new slot beyond the memo's
// limits is an error, and so is a value memoized again right after it was
// memoized or taken from the memo, which CPython's pickler never writes (it
// memoizes each object once; MEMOIZE repeated cost 4 bytes of memo a byte
// of pickle, 400 MB for 97 KB of gzip).
func (d *decoder) memoize(at int64, op byte, idx uint64, v value) error {
	if d.prevMemo {
		return d.fail(at, op, "the value on top is memoized already")
	}
	d.memoTop = true
	if _, ok := d.memo.get(idx); !ok {
		if d.memo.n >= d.lim.memo {
			return d.over(at, int64(d.lim.memo), " slots", "a memo of %d slots", d.memo.n+1)
		}
		if !d.memo.dense(idx) && len(d.memo.sparse) >= d.lim.sparse {
			return d.over(at, int64(d.lim.sparse), " slots", "memo index %d, with %d others out of order,", idx, len(d.memo.sparse))
		}
	}
	var x uint32
	switch v.k {
	case vStr:
		if v.n < tagStr {
			x = tagStr | uint32(v.n)
		}
	case vSkip:
		x = tagSkip | uint32(v.n)
	case vCont:
		c := d.container(v)
		switch {
		case c == nil:
			x = tagSkip | uint32(pyDict)
		case c.role == roleEntry || c.role == roleSegment || c.role == roleBlock:
			// Converted and dropped when appended; a later reference
			// gets an opaque dict.
			x = tagSkip | uint32(c.kind)
		case c.role == roleFrames && v.n < memoPending:
			// The container until converted, then its stack id
			// (setConverted).
			x = tagSkip | memoPending | memoList | uint32(v.n)
			c.memo = idx + 1
		}
	case vFrameBuild:
		// The frame being read until converted (a list may hold one
		// frame dict twice), then its frame id (frames.go).
		if v.g == d.buildGen && v.n < memoList {
			x = tagSkip | memoPending | uint32(v.n)
			d.buildMemo[v.n] = idx + 1
		}
	}
	if x == 0 {
		if len(d.memo.vals) >= d.lim.memoVals {
			return d.over(at, int64(d.lim.memoVals), " values", "a memo of %d values other than strings and skipped containers", len(d.memo.vals)+1)
		}
		d.memo.vals = append(d.memo.vals, v)
		x = tagVal | uint32(len(d.memo.vals)-1)
	}
	d.memo.put(idx, x)
	return nil
}

// get pushes the value at memo index idx.
func (d *decoder) get(at int64, op byte, idx uint64) error {
	x, ok := d.memo.get(idx)
	if !ok {
		return d.fail(at, op, "memo %d not set", idx)
	}
	var v value
	switch x & tagMask {
	case tagStr:
		v = value{k: vStr, n: int64(x &^ tagMask)}
	case tagSkip:
		v = d.skipValue(idx, x&^tagMask)
	default:
		v = d.memo.vals[x&^tagMask]
	}
	d.stack = append(d.stack, v)
	d.memoTop = true
	return nil
}

// create returns a new list, dict or set whose role follows from where it
// is created (see context).
func (d *decoder) create(k pyKind) value {
	r := d.childRole(k)
	if r == 0 {
		return value{k: vSkip, n: int64(k)}
	}
	if r == roleFrame {
		return d.newFrame()
	}
	v := d.newContainer(k, r)
	if r == roleEntries {
		d.streamed = true
		d.entriesList = v
		d.entriesLists++
	}
	return v
}

// tuple returns a tuple (or frozenset) of items, kept when its context
// keeps values, else skipped.
func (d *decoder) tuple(k pyKind, items []value) value {
	if r := d.childRole(k); r != roleKeep {
		return value{k: vSkip, n: int64(k)}
	}
	v := d.newContainer(k, roleKeep)
	c := &d.conts[v.n]
	c.items = append(c.items, items...)
	c.n = len(items)
	return v
}

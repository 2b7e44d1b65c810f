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

// This file is a streaming decoder for the pickles of plain Python values
// that snapshots are (protocols 2 to 5, as CPython's pickler writes them),
// which walks a snapshot without building it: the entries of the chosen
// device trace are converted as each batch of them is appended to its list
// and then dropped, the final segments are kept in a compact form, the
// allocator settings in full, and everything else (stack frames, other
// devices' traces, external annotations) is only stepped over.
//
// A pickle is a program for a stack machine; the decoder runs it with
// values of 16 bytes and decides, when a list or dict is created, what it
// will become from where it will go (its role): the item of which list or
// the value of which key of which dict. CPython's pickler writes a
// container empty, memoizes it and then appends its items in batches
// (MARK items APPENDS), so the container being filled is always the one
// below the last mark, or just below the item for batches of one. A
// container created anywhere else (inside a tuple being built, or through
// the LIST and DICT opcodes) is kept whole where that is safe, or skipped.
//
// The memo keeps every memoized value that a later reference can need,
// small: a string as the index of its interned copy, a skipped container
// as its type alone, 4 bytes a slot. Trace entries are not memoized: a
// reference to an entry already converted gives a clear error rather than
// its value, which no snapshot needs.

// kind is the kind of a value on the decoder's stack.
type kind uint8

const (
	vNone  kind = iota + 1
	vBool       // n: 0 or 1
	vInt        // n: the int64
	vUint       // n: the bits of a uint64 above math.MaxInt64
	vBig        // n: index into decoder.bigs
	vFloat      // n: the float64's bits
	vStr        // n: string id
	vBytes      // n: string id of the bytes
	vCont       // n: container slot, g: its generation
	vSkip       // n: the skipped container's pyKind
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

// role says what a container becomes, and so what of it is kept.
type role uint8

const (
	roleKeep     role = iota + 1 // kept whole (allocator settings, odd shapes)
	roleRoot                     // the snapshot dict: three keys kept
	roleTraces                   // device_traces: only the item at the device kept
	roleEntries                  // the device's trace: items converted, not kept
	roleEntry                    // a trace entry: its five fields kept
	roleSegments                 // segments: items converted to snapSegment
	roleSegment                  // a segment: its fields kept
	roleBlocks                   // a segment's blocks: converted to snapBlock
	roleBlock                    // a block: its fields kept
)

// container is a list, dict, tuple or set that the decoder keeps, whole or
// in part by its role. items holds a list's items, or a dict's keys and
// values in turn.
type container struct {
	kind  pyKind
	role  role
	gen   uint32
	n     int     // items appended or keys set, kept or not
	items []value // kept items (dict: key, value, key, value...)
	dev   value   // roleTraces: the item at the device, k 0 if none yet
	segs  []snapSegment
	blks  []snapBlock
}

// String ids interned before decoding, so that roles and fields can be told
// by comparing ids.
const (
	sAction = iota
	sAddr
	sSize
	sStream
	sTimeUS
	numEntryKeys  // the entry fields are the ids below this
	sDeviceTraces = iota - 1
	sSegments
	sAllocatorSettings
	sAddress
	sTotalSize
	sSegmentType
	sIsExpandable
	sDevice
	sBlocks
	sRequestedSize
	sState
	sSmall
	sActiveAllocated
	sActivePendingFree
	// The actions, in actionOps order.
	sFirstAction
)

var knownStrings = []string{
	sAction: "action", sAddr: "addr", sSize: "size", sStream: "stream", sTimeUS: "time_us",
	sDeviceTraces: "device_traces", sSegments: "segments", sAllocatorSettings: "allocator_settings",
	sAddress: "address", sTotalSize: "total_size", sSegmentType: "segment_type",
	sIsExpandable: "is_expandable", sDevice: "device", sBlocks: "blocks",
	sRequestedSize: "requested_size", sState: "state", sSmall: "small",
	sActiveAllocated: "active_allocated", sActivePendingFree: "active_pending_free",
}

// entryFields are the fields of a trace entry that Import reads.
type entryFields struct {
	action, addr, size, stream, timeUS value
}

// snapSegment is a segment of the snapshot's final state, as reconstruct
// needs it.
type snapSegment struct {
	device     int64 // -1 if not given
	addr, size uint64
	stream     uint64
	small      bool // segment_type "small"
	expandable bool
	blocks     []snapBlock
	bad        string // why the segment cannot be used, "" if it can
}

// snapBlock is a block of a snapSegment.
type snapBlock struct {
	addr, size, requested uint64
	haveAddr              bool
	state                 blockState
}

type blockState uint8

const (
	blockOther blockState = iota
	blockInactive
	blockAllocated
	blockPendingFree
)

// pickleError is a problem in the pickle itself at byte Offset.
type pickleError struct {
	Offset int64
	Op     byte
	Msg    string
}

func (e *pickleError) Error() string { return fmt.Sprintf("opcode %#02x: %s", e.Op, e.Msg) }

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
// and reports whether the input had them.
func (in *input) more(n int) bool {
	if in.end-in.pos >= n {
		return true
	}
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
// 8 bytes and report whether the input had it.
func (in *input) u8() (uint64, bool) {
	if !in.more(1) {
		return 0, false
	}
	in.pos++
	return uint64(in.buf[in.pos-1]), true
}

func (in *input) u16() (uint64, bool) {
	if !in.more(2) {
		return 0, false
	}
	in.pos += 2
	return uint64(binary.LittleEndian.Uint16(in.buf[in.pos-2:])), true
}

func (in *input) u32() (uint64, bool) {
	if !in.more(4) {
		return 0, false
	}
	in.pos += 4
	return uint64(binary.LittleEndian.Uint32(in.buf[in.pos-4:])), true
}

func (in *input) u64() (uint64, bool) {
	if !in.more(8) {
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
// tag in the top two bits and a payload below.
type memoTable struct {
	chunks [][]uint32 // dense slots, memoChunk a chunk
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

func (m *memoTable) slot(idx uint64, create bool) *uint32 {
	c := idx / memoChunk
	if c < uint64(len(m.chunks)) {
		return &m.chunks[c][idx%memoChunk]
	}
	if create && c == uint64(len(m.chunks)) {
		m.chunks = append(m.chunks, make([]uint32, memoChunk))
		return &m.chunks[c][idx%memoChunk]
	}
	return nil
}

func (m *memoTable) get(idx uint64) (uint32, bool) {
	if p := m.slot(idx, false); p != nil && *p != 0 {
		return *p, true
	}
	x, ok := m.sparse[idx]
	return x, ok
}

func (m *memoTable) put(idx uint64, x uint32) {
	if p := m.slot(idx, true); p != nil {
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

// sink receives the entries of the device trace, in order, as the decoder
// converts them. index counts from 0.
type sink interface {
	entry(d *decoder, index int64, f *entryFields) error
}

// decoder runs a snapshot pickle.
type decoder struct {
	in     *input
	device int // the device trace to convert
	sink   sink
	// pauseAfterAppend makes run return after each batch of entries,
	// so that a reader can take them before the next.
	pauseAfterAppend bool
	// stopAtTraces makes run end when the device's entries are complete.
	stopAtTraces bool

	stack []value
	marks []int
	memo  memoTable

	strs  []string
	strID map[string]uint32
	bigs  []*big.Int

	conts []container
	free  []int32 // container slots to reuse

	proto    int
	rootMade bool
	frameEnd int64 // end offset of the last FRAME, 0 if none
	stopped  bool
	paused   bool
	root     value // the value STOP found, once stopped
	entries  int64 // entries converted so far
	entryErr error // the first entry error of the sink, with its index
	streamed bool  // a list with roleEntries was made
	// entriesList is the list with roleEntries; entriesLists counts them
	// (one in a pickle the decoder follows).
	entriesList  value
	entriesLists int
	devList      value         // the device's trace, once appended to device_traces
	pickle       *pickleStream // the stream in, for error messages
	scratch      []byte
	fields1      entryFields   // the entry being converted
	segments     []snapSegment // from roleSegments
	lastError    *pickleError
}

func newDecoder(r io.Reader, device int, s sink) *decoder {
	d := &decoder{in: newInput(r), device: device, sink: s, strID: map[string]uint32{}}
	for i, s := range knownStrings {
		d.strs = append(d.strs, s)
		d.strID[s] = uint32(i)
	}
	for i, a := range actionNames {
		if int(d.intern([]byte(a))) != sFirstAction+i {
			panic("pytorch: action ids out of order")
		}
	}
	return d
}

// intern returns the id of the string b.
func (d *decoder) intern(b []byte) uint32 {
	if id, ok := d.strID[string(b)]; ok {
		return id
	}
	id := uint32(len(d.strs))
	s := string(b)
	d.strs = append(d.strs, s)
	d.strID[s] = id
	return id
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
		d.conts = append(d.conts, container{})
		i = int32(len(d.conts) - 1)
	}
	c := &d.conts[i]
	c.gen++
	c.kind, c.role, c.n = kind, r, 0
	c.items = c.items[:0]
	c.dev = value{}
	c.segs, c.blks = nil, c.blks[:0]
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
	case vCont:
		if c := d.container(v); c != nil {
			return pyKindNames[c.kind]
		}
		return "value no longer kept"
	}
	return "value"
}

func (d *decoder) fail(at int64, op byte, format string, args ...any) error {
	return &pickleError{Offset: at, Op: op, Msg: fmt.Sprintf(format, args...)}
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
		if in.end-in.pos < 16 && !in.more(16) && in.pos == in.end {
			return d.eof()
		}
		at := in.offset()
		op := in.buf[in.pos]
		in.pos++
		var err error
		switch op {
		case 0x94: // MEMOIZE
			if len(d.stack) == 0 {
				return d.fail(at, op, "empty stack")
			}
			d.memoize(uint64(d.memo.n), d.stack[len(d.stack)-1])
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
			d.memoize(idx, d.stack[len(d.stack)-1])
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
				d.memoize(idx, d.stack[len(d.stack)-1])
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

// memoize stores v at memo index idx.
func (d *decoder) memoize(idx uint64, v value) {
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
		}
	}
	if x == 0 && len(d.memo.vals) < tagStr {
		d.memo.vals = append(d.memo.vals, v)
		x = tagVal | uint32(len(d.memo.vals)-1)
	}
	d.memo.put(idx, x)
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
		v = value{k: vSkip, n: int64(x &^ tagMask)}
	default:
		v = d.memo.vals[x&^tagMask]
	}
	d.stack = append(d.stack, v)
	return nil
}

// create returns a new list, dict or set whose role follows from where it
// is created (see context).
func (d *decoder) create(k pyKind) value {
	r := d.childRole(k)
	if r == 0 {
		return value{k: vSkip, n: int64(k)}
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

// childRole returns the role of a container of kind k about to be pushed,
// or 0 to skip it, from the container it will be added to. Python's
// pickler leaves three shapes, which the stack alone cannot always tell
// apart: a batch (the container below the last mark, with the items so
// far above it), one item for a list (the list at the top of the stack),
// and one item for a dict (the dict below a key at the top). Each shape
// that fits gives a role; the most useful wins (a role of the snapshot's
// structure over keeping, keeping over skipping), which is right for
// every way Python writes a snapshot and never loses a value that
// matters.
func (d *decoder) childRole(k pyKind) role {
	n := len(d.stack)
	if n == 0 && len(d.marks) == 0 {
		if !d.rootMade && k == pyDict {
			d.rootMade = true
			return roleRoot
		}
		return roleKeep
	}
	m := d.topMark()
	best, found := role(0), false
	consider := func(r role) {
		if !found || roleRank(r) > roleRank(best) {
			best = r
		}
		found = true
	}
	if len(d.marks) > 0 && m > 0 {
		pk, pc := d.kindOf(d.stack[m-1])
		pending := n - m
		switch pk {
		case pyDict:
			if pending%2 == 1 && isScalar(d.stack[n-1]) {
				consider(d.roleFor(pc, 0, d.stack[n-1], k))
			} else if pending%2 == 0 && k == pyTuple {
				consider(d.keyRole(pc))
			}
		case pyList, pySet:
			pos := pending
			if pc != nil {
				pos += pc.n
			}
			consider(d.roleFor(pc, pos, value{}, k))
		}
	}
	if n > m {
		top := d.stack[n-1]
		if tk, tc := d.kindOf(top); tk == pyList || tk == pySet {
			pos := 0
			if tc != nil {
				pos = tc.n
			}
			consider(d.roleFor(tc, pos, value{}, k))
		} else if n-2 >= m && isScalar(top) {
			if pk, pc := d.kindOf(d.stack[n-2]); pk == pyDict {
				consider(d.roleFor(pc, 0, top, k))
			}
		}
	}
	if found {
		return best
	}
	// Some other shape: inside a tuple being built, or items for LIST or
	// DICT. Keep it if what encloses it is kept or structural, so that no
	// value that matters is lost.
	for i := len(d.marks) - 1; i >= 0; i-- {
		mm := d.marks[i]
		if mm == 0 {
			break
		}
		below := d.stack[mm-1]
		if below.k == vSkip {
			return 0
		}
		if c := d.container(below); c != nil {
			switch c.role {
			case roleEntry, roleBlock:
				return 0
			}
			return roleKeep
		}
	}
	return roleKeep
}

// roleRank orders roles by how much choosing them keeps.
func roleRank(r role) int {
	switch r {
	case 0:
		return 0
	case roleKeep:
		return 1
	}
	return 2
}

func isScalar(v value) bool { return v.k != vCont && v.k != vSkip }

// kindOf returns the Python kind of a container value (0 for any other
// value) and its container, nil if it is skipped.
func (d *decoder) kindOf(v value) (pyKind, *container) {
	switch v.k {
	case vSkip:
		return pyKind(v.n), nil
	case vCont:
		if c := d.container(v); c != nil {
			return c.kind, c
		}
	}
	return 0, nil
}

// keyRole is the role of a container used as a dict key (only a tuple can
// be one).
func (d *decoder) keyRole(c *container) role {
	if c != nil && c.role == roleKeep {
		return roleKeep
	}
	return 0
}

// roleFor is the role of a container of kind k that becomes item pos of
// list c, or the value of key in dict c.
func (d *decoder) roleFor(c *container, pos int, key value, k pyKind) role {
	if c == nil {
		return 0
	}
	switch c.role {
	case roleKeep:
		return roleKeep
	case roleRoot:
		if key.k != vStr {
			return 0
		}
		switch key.n {
		case sDeviceTraces:
			if k == pyList {
				return roleTraces
			}
		case sSegments:
			if k == pyList {
				return roleSegments
			}
		case sAllocatorSettings:
			return roleKeep
		default:
			return 0
		}
		return roleKeep // a wrong type, reported by Import
	case roleTraces:
		if pos == d.device && k == pyList {
			return roleEntries
		}
		if pos == d.device {
			return roleKeep
		}
		return 0
	case roleEntries:
		if k == pyDict {
			return roleEntry
		}
		return 0
	case roleSegments:
		if k == pyDict {
			return roleSegment
		}
		return 0
	case roleSegment:
		if key.k == vStr && key.n == sBlocks && k == pyList {
			return roleBlocks
		}
		return 0
	case roleBlocks:
		if k == pyDict {
			return roleBlock
		}
		return 0
	}
	return 0
}

// appendItems appends items to the list (or set) target.
func (d *decoder) appendItems(at int64, op byte, target value, items []value) error {
	if target.k == vSkip {
		if pyKind(target.n) == pyDict || pyKind(target.n) == pyTuple {
			return d.fail(at, op, "append to a %s", pyKindNames[target.n])
		}
		return nil
	}
	c := d.container(target)
	if c == nil || (c.kind != pyList && c.kind != pySet) {
		return d.fail(at, op, "append to a %s", d.pyType(target))
	}
	switch c.role {
	case roleEntries:
		for _, v := range items {
			if err := d.entry(v); err != nil {
				return err
			}
			c.n++
		}
		if d.pauseAfterAppend {
			d.paused = true
		}
		return nil
	case roleTraces:
		for _, v := range items {
			if c.n == d.device {
				c.dev = v
				d.devList = v
				if d.stopAtTraces {
					d.stopped = true
				}
			}
			c.n++
		}
		return nil
	case roleSegments:
		for _, v := range items {
			d.segments = append(d.segments, d.segment(v))
			d.release(v)
			c.n++
		}
		return nil
	case roleBlocks:
		for _, v := range items {
			c.blks = append(c.blks, d.block(v))
			d.release(v)
			c.n++
		}
		return nil
	}
	c.items = append(c.items, items...)
	c.n += len(items)
	return nil
}

// setItems sets the keys and values in items (key, value, ...) in the dict
// target.
func (d *decoder) setItems(at int64, op byte, target value, items []value) error {
	if len(items)%2 != 0 {
		return d.fail(at, op, "odd number of items")
	}
	if target.k == vSkip {
		if pyKind(target.n) != pyDict {
			return d.fail(at, op, "set an item of a %s", pyKindNames[target.n])
		}
		return nil
	}
	c := d.container(target)
	if c == nil || c.kind != pyDict {
		return d.fail(at, op, "set an item of a %s", d.pyType(target))
	}
	for i := 0; i < len(items); i += 2 {
		key, val := items[i], items[i+1]
		c.n++
		keep := true
		switch c.role {
		case roleEntry:
			keep = key.k == vStr && key.n < numEntryKeys
		case roleRoot:
			keep = key.k == vStr && (key.n == sDeviceTraces || key.n == sSegments || key.n == sAllocatorSettings)
		case roleSegment:
			keep = key.k == vStr && (key.n == sAddress || key.n == sTotalSize || key.n == sStream || key.n == sSegmentType ||
				key.n == sIsExpandable || key.n == sDevice || key.n == sBlocks)
		case roleBlock:
			keep = key.k == vStr && (key.n == sAddress || key.n == sSize || key.n == sRequestedSize || key.n == sState)
		}
		if !keep {
			continue
		}
		d.setKey(c, key, val)
	}
	return nil
}

// setKey sets key to val in c, replacing an equal string key among the
// first ones (a dict's keys are unique; for long kept dicts of other keys
// the order of insertion is kept as is).
func (d *decoder) setKey(c *container, key, val value) {
	if key.k == vStr || key.k == vInt {
		for j := 0; j < len(c.items) && j < 128; j += 2 {
			if c.items[j] == key {
				c.items[j+1] = val
				return
			}
		}
	}
	c.items = append(c.items, key, val)
}

// entry converts the entry v of the device trace for the sink.
func (d *decoder) entry(v value) error {
	index := d.entries
	d.entries++
	if d.entryErr != nil {
		d.release(v)
		return nil
	}
	f := &d.fields1
	*f = entryFields{}
	err := d.fields(v, f)
	d.release(v)
	if err == nil && d.sink != nil {
		err = d.sink.entry(d, index, f)
	}
	if err != nil {
		d.entryErr = &entryError{index, err}
	}
	return nil
}

// entryError is an error in device trace entry Index.
type entryError struct {
	Index int64
	Err   error
}

func (e *entryError) Error() string { return fmt.Sprintf("entry %d: %v", e.Index, e.Err) }
func (e *entryError) Unwrap() error { return e.Err }

// fields reads the fields of the trace entry v into f.
func (d *decoder) fields(v value, f *entryFields) error {
	c := d.container(v)
	if c == nil || c.kind != pyDict {
		if v.k == vSkip && pyKind(v.n) == pyDict || v.k == vCont && c == nil {
			return errors.New("is a dict repeated through the pickle memo, which this importer does not follow")
		}
		return fmt.Errorf("is a %s, want a dict", d.pyType(v))
	}
	for i := 0; i+1 < len(c.items); i += 2 {
		key := c.items[i]
		if key.k != vStr {
			continue
		}
		switch key.n {
		case sAction:
			f.action = c.items[i+1]
		case sAddr:
			f.addr = c.items[i+1]
		case sSize:
			f.size = c.items[i+1]
		case sStream:
			f.stream = c.items[i+1]
		case sTimeUS:
			f.timeUS = c.items[i+1]
		}
	}
	return nil
}

// segment converts the segment dict v.
func (d *decoder) segment(v value) snapSegment {
	s := snapSegment{device: -1}
	c := d.container(v)
	if c == nil || c.kind != pyDict {
		s.bad = "a segment that is a " + d.pyType(v)
		return s
	}
	var haveAddr, haveSize bool
	for i := 0; i+1 < len(c.items); i += 2 {
		key, val := c.items[i], c.items[i+1]
		if key.k != vStr {
			continue
		}
		switch key.n {
		case sAddress:
			s.addr, haveAddr = d.uintOf(val)
		case sTotalSize:
			s.size, haveSize = d.uintOf(val)
		case sStream:
			if x, err := d.toStream(val); err == nil {
				s.stream = x
			}
		case sSegmentType:
			s.small = val.k == vStr && val.n == sSmall
		case sIsExpandable:
			s.expandable = val.k == vBool && val.n == 1
		case sDevice:
			if val.k == vInt {
				s.device = val.n
			}
		case sBlocks:
			bc := d.container(val)
			if bc == nil || bc.role != roleBlocks && bc.role != roleKeep {
				s.bad = "blocks that are not a list"
				continue
			}
			if bc.role == roleKeep {
				for _, b := range bc.items {
					s.blocks = append(s.blocks, d.block(b))
				}
			} else {
				s.blocks = append([]snapBlock(nil), bc.blks...)
			}
			d.release(val)
		}
	}
	if !haveAddr || !haveSize {
		s.bad = "a segment without address or total_size"
	}
	return s
}

// block converts the block dict v.
func (d *decoder) block(v value) snapBlock {
	var b snapBlock
	c := d.container(v)
	if c == nil || c.kind != pyDict {
		return b
	}
	for i := 0; i+1 < len(c.items); i += 2 {
		key, val := c.items[i], c.items[i+1]
		if key.k != vStr {
			continue
		}
		switch key.n {
		case sAddress:
			b.addr, b.haveAddr = d.uintOf(val)
		case sSize:
			b.size, _ = d.uintOf(val)
		case sRequestedSize:
			b.requested, _ = d.uintOf(val)
		case sState:
			switch {
			case val.k != vStr:
			case val.n == sActiveAllocated:
				b.state = blockAllocated
			case val.n == sActivePendingFree:
				b.state = blockPendingFree
			case d.strs[val.n] == "inactive":
				b.state = blockInactive
			}
		}
	}
	return b
}

func (d *decoder) uintOf(v value) (uint64, bool) {
	x, err := d.toUint64(v, "")
	return x, err == nil
}

// toUint64 converts a non-negative int to uint64.
func (d *decoder) toUint64(v value, field string) (uint64, error) {
	switch v.k {
	case vInt:
		if v.n < 0 {
			return 0, fmt.Errorf("%s %d is negative", field, v.n)
		}
		return uint64(v.n), nil
	case vUint:
		return uint64(v.n), nil
	case vBig:
		return 0, fmt.Errorf("%s %s does not fit in 64 bits unsigned", field, d.bigs[v.n])
	}
	return 0, fmt.Errorf("%s is a %s, want an int", field, d.pyType(v))
}

// toInt64 converts an int to int64.
func (d *decoder) toInt64(v value, field string) (int64, error) {
	switch v.k {
	case vInt:
		return v.n, nil
	case vUint:
		return 0, fmt.Errorf("%s %d does not fit in 64 bits signed", field, uint64(v.n))
	case vBig:
		return 0, fmt.Errorf("%s %s does not fit in 64 bits signed", field, d.bigs[v.n])
	}
	return 0, fmt.Errorf("%s is a %s, want an int", field, d.pyType(v))
}

// toStream converts a stream, which PyTorch writes as int64(cudaStream_t),
// back to its unsigned value.
func (d *decoder) toStream(v value) (uint64, error) {
	if v.k == vUint {
		return uint64(v.n), nil
	}
	n, err := d.toInt64(v, "stream")
	return uint64(n), err
}

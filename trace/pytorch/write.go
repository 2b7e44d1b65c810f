package pytorch

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/gpualloc/allocsim/trace"
)

// TraceEntry is one entry of a snapshot's device trace, as the snapshot
// writer takes it: Action is one of alloc, free_requested, free_completed,
// segment_alloc, segment_free, segment_map, segment_unmap, snapshot, oom.
// Addr is the block's or segment's address (not written for oom, whose
// DeviceFree, the device's free bytes, is written as "device_free"
// instead), Size the requested bytes (alloc, free_*) or the segment's
// bytes (segment_*), Stream the raw cudaStream_t value (written as a
// signed 64-bit integer, as PyTorch does) and TimeUS the time in
// microseconds.
type TraceEntry struct {
	Action     string
	Addr       uint64
	Size       uint64
	Stream     uint64
	TimeUS     int64
	DeviceFree uint64
	// Frames is the call stack written as the entry's "frames",
	// innermost first: for alloc, free_requested and free_completed the
	// block's malloc's, as PyTorch records them; empty if none.
	Frames []trace.Frame
}

// Segment is one segment of a snapshot's final allocator state: a device
// allocation of TotalSize bytes at Address, made on Stream, whose Blocks
// tile it from its first byte to its last in address order. An expandable
// segment (IsExpandable) is a run of mapped pages of a reserved range.
type Segment struct {
	Device       int
	Address      uint64
	TotalSize    uint64
	Stream       uint64
	SegmentType  string // "small" or "large"
	IsExpandable bool
	// PoolID is the segment_pool_id: (0, 0) for the default pools.
	PoolID [2]uint64
	// Frames is the stack of the malloc that allocated the segment.
	Frames []trace.Frame
	Blocks []Block
}

// Block is a block of a Segment: Size bytes, of which RequestedSize were
// asked for, in State "active_allocated", "active_pending_free" (freed by
// the program, waiting on another stream) or "inactive" (free).
type Block struct {
	Size          uint64
	RequestedSize uint64
	State         string
	// Frames is the stack of the block's malloc (an allocated or pending
	// block's), innermost first.
	Frames []trace.Frame
}

// Block states of a snapshot's segments.
const (
	StateActiveAllocated   = "active_allocated"
	StateActivePendingFree = "active_pending_free"
	StateInactive          = "inactive"
)

// ErrBadSnapshot is wrapped by the errors of a SnapshotWriter given
// values that PyTorch's memory_viz would not read: an unknown action or
// block state, or blocks that do not tile their segment.
var ErrBadSnapshot = errors.New("pytorch: bad snapshot value")

// entryBatch is how many trace entries one APPENDS opcode adds, as
// Python's pickler batches them.
const entryBatch = 1000

// SnapshotWriter writes a PyTorch memory snapshot, the pickle that
// torch.cuda.memory._dump_snapshot writes and that PyTorch's memory_viz
// (torch.cuda._memory_viz, pytorch.org/memory_viz) reads, for one device:
// a dict of "device_traces" (the entries given to Add, in order),
// "segments" (the final state given to Close), "allocator_settings" and
// "external_annotations". The entries are streamed to the writer as they
// are added, so memory stays constant however long the trace.
//
// The pickle is protocol 4 without frames (framing is optional to
// unpicklers) and holds only dicts, lists, strings and integers. Import
// reads it back.
type SnapshotWriter struct {
	p      pickler
	device int
	batch  int // entries in the open APPENDS batch
	n      int64
	closed bool
}

// NewSnapshotWriter starts a snapshot of device (its index in
// device_traces; lower devices get empty traces) on w. Nothing is
// complete until Close.
func NewSnapshotWriter(w io.Writer, device int) *SnapshotWriter {
	s := &SnapshotWriter{p: pickler{w: bufio.NewWriterSize(w, 1<<16), memo: map[string]uint32{},
		frameMemo: map[trace.Frame]uint32{}, listMemo: map[listKey]listMemoized{}}, device: max(device, 0)}
	p := &s.p
	p.op(opProto, 4)
	p.op(opEmptyDict)
	p.str("device_traces")
	p.op(opEmptyList)
	for range s.device {
		p.op(opEmptyList, opAppend)
	}
	p.op(opEmptyList) // this device's entries; appended to the outer list at Close
	return s
}

// Replaced returns the number of strings written so far (frame names and
// file names, settings) that were not valid UTF-8: each was written with
// U+FFFD in place of each run of bad bytes, as Python's unpickler takes
// only UTF-8. A caller says so to its user once.
func (s *SnapshotWriter) Replaced() int { return s.p.replaced }

// validActions are the trace entry actions memory_viz knows.
var validActions = map[string]bool{
	"alloc": true, "free_requested": true, "free_completed": true,
	"segment_alloc": true, "segment_free": true, "segment_map": true, "segment_unmap": true,
	"snapshot": true, "oom": true,
}

// Add writes one trace entry. It returns an error wrapping ErrBadSnapshot
// for an unknown action, and any error of the underlying writer.
func (s *SnapshotWriter) Add(e TraceEntry) error {
	if s.closed {
		return errors.New("pytorch: snapshot writer closed")
	}
	if !validActions[e.Action] {
		return fmt.Errorf("%w: trace entry %d: unknown action %q", ErrBadSnapshot, s.n, e.Action)
	}
	p := &s.p
	if s.batch == 0 {
		p.op(opMark)
	}
	p.op(opEmptyDict, opMark)
	p.str("action")
	p.str(e.Action)
	if e.Action == "oom" {
		p.str("device_free")
		p.uint(e.DeviceFree)
	} else {
		p.str("addr")
		p.uint(e.Addr)
	}
	p.str("size")
	p.uint(e.Size)
	p.str("stream")
	p.int(int64(e.Stream))
	p.str("time_us")
	p.int(e.TimeUS)
	if len(e.Frames) > 0 {
		p.str("frames")
		p.frames(e.Frames)
	}
	p.op(opSetItems)
	s.n++
	s.batch++
	if s.batch == entryBatch {
		p.op(opAppends)
		s.batch = 0
	}
	return p.err
}

// Entries returns the number of trace entries added.
func (s *SnapshotWriter) Entries() int64 { return s.n }

// Close writes the final segments (each with its blocks' addresses, and
// the allocated, active and requested sums PyTorch reports), the allocator
// settings (a dict of strings, sorted by key) and an empty list of
// external annotations, and ends the pickle. It does not close the
// underlying writer. It returns an error wrapping ErrBadSnapshot for a
// segment whose blocks do not tile it or for an unknown block state.
func (s *SnapshotWriter) Close(segments []Segment, settings map[string]string) error {
	if s.closed {
		return errors.New("pytorch: snapshot writer closed")
	}
	s.closed = true
	p := &s.p
	if s.batch > 0 {
		p.op(opAppends)
	}
	p.op(opAppend, opSetItem) // this device's list into device_traces; device_traces into the dict

	p.str("segments")
	p.op(opEmptyList)
	for i, seg := range segments {
		if err := writeSegment(p, seg); err != nil {
			return fmt.Errorf("segment %d: %w", i, err)
		}
		p.op(opAppend)
	}
	p.op(opSetItem)

	p.str("allocator_settings")
	p.op(opEmptyDict)
	keys := make([]string, 0, len(settings))
	for k := range settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		p.str(k)
		p.str(settings[k])
		p.op(opSetItem)
	}
	p.op(opSetItem)

	p.str("external_annotations")
	p.op(opEmptyList, opSetItem, opStop)
	if p.err != nil {
		return p.err
	}
	return p.w.Flush()
}

func writeSegment(p *pickler, seg Segment) error {
	var covered, allocated, active, requested uint64
	for _, b := range seg.Blocks {
		switch b.State {
		case StateActiveAllocated:
			allocated += b.Size
			active += b.Size
			requested += b.RequestedSize
		case StateActivePendingFree:
			active += b.Size
			requested += b.RequestedSize
		case StateInactive:
		default:
			return fmt.Errorf("%w: segment at %#x: unknown block state %q", ErrBadSnapshot, seg.Address, b.State)
		}
		if b.Size == 0 {
			return fmt.Errorf("%w: segment at %#x: a block of 0 bytes", ErrBadSnapshot, seg.Address)
		}
		covered += b.Size
	}
	if covered != seg.TotalSize {
		return fmt.Errorf("%w: segment at %#x of %d bytes: its blocks cover %d bytes", ErrBadSnapshot, seg.Address, seg.TotalSize, covered)
	}
	segType := seg.SegmentType
	if segType == "" {
		segType = "large"
	}
	p.op(opEmptyDict, opMark)
	p.str("device")
	p.int(int64(seg.Device))
	p.str("address")
	p.uint(seg.Address)
	p.str("total_size")
	p.uint(seg.TotalSize)
	p.str("allocated_size")
	p.uint(allocated)
	p.str("active_size")
	p.uint(active)
	p.str("requested_size")
	p.uint(requested)
	p.str("stream")
	p.int(int64(seg.Stream))
	p.str("segment_type")
	p.str(segType)
	p.str("is_expandable")
	if seg.IsExpandable {
		p.op(opNewTrue)
	} else {
		p.op(opNewFalse)
	}
	p.str("segment_pool_id")
	p.uint(seg.PoolID[0])
	p.uint(seg.PoolID[1])
	p.op(opTuple2)
	p.str("frames")
	p.frames(seg.Frames)
	p.str("blocks")
	p.op(opEmptyList)
	if len(seg.Blocks) > 0 {
		p.op(opMark)
		addr := seg.Address
		for _, b := range seg.Blocks {
			p.op(opEmptyDict, opMark)
			p.str("address")
			p.uint(addr)
			p.str("size")
			p.uint(b.Size)
			p.str("requested_size")
			p.uint(b.RequestedSize)
			p.str("state")
			p.str(b.State)
			p.str("frames")
			p.frames(b.Frames)
			p.op(opSetItems)
			addr += b.Size
		}
		p.op(opAppends)
	}
	p.op(opSetItems)
	return nil
}

// Pickle opcodes (Python's Lib/pickle.py names).
const (
	opMark            = '('
	opStop            = '.'
	opBinInt          = 'J'
	opBinInt1         = 'K'
	opBinInt2         = 'M'
	opBinUnicode      = 'X'
	opAppend          = 'a'
	opAppends         = 'e'
	opBinGet          = 'h'
	opLongBinGet      = 'j'
	opEmptyList       = ']'
	opEmptyDict       = '}'
	opSetItem         = 's'
	opSetItems        = 'u'
	opProto           = 0x80
	opNewTrue         = 0x88
	opNewFalse        = 0x89
	opTuple2          = 0x86
	opLong1           = 0x8a
	opShortBinUnicode = 0x8c
	opMemoize         = 0x94
)

// maxMemo bounds the strings a pickler memoizes; later new strings are
// written in full each time.
const maxMemo = 1 << 16

// maxMemoLen is the longest string a pickler memoizes.
const maxMemoLen = 64

// maxMemoFrames bounds the frame dicts a pickler memoizes, and the frames
// of the frames lists it memoizes (it keeps a copy of each list); later
// new ones are written in full each time.
const maxMemoFrames = 1 << 20

// pickler writes pickle opcodes of plain values to w, remembering the
// first error. Short strings (dict keys, actions, states) are memoized on
// first use and fetched from the memo afterwards, which keeps a trace of a
// million entries to tens of bytes an entry; so are frame dicts and frames
// lists (frames).
type pickler struct {
	w    *bufio.Writer
	memo map[string]uint32
	// frameMemo holds the memo index of each frame dict written, listMemo
	// that of each frames list, by its first frame's address and length,
	// with a copy of its frames; listFrames counts the frames copied.
	frameMemo  map[trace.Frame]uint32
	listMemo   map[listKey]listMemoized
	listFrames int
	next       uint32 // the next memo index
	replaced   int    // the strings written with U+FFFD for invalid UTF-8 (str)
	err        error
	buf        [16]byte
}

type listKey struct {
	first *trace.Frame
	n     int
}

type listMemoized struct {
	idx    uint32
	frames []trace.Frame
}

// memoize memoizes the value just written and returns its memo index.
func (p *pickler) memoize() uint32 {
	p.op(opMemoize)
	p.next++
	return p.next - 1
}

// frames writes a list of frame dicts {"name", "filename", "line"} as
// PyTorch's pickle of a snapshot recorded with stacks does: each frame
// dict once, and again through the memo wherever a list holds it, and a
// list written before (the same slice, with the same frames: as Add and
// Close are given the one slice of a stack again) through the memo too.
// An empty list is a new one each time.
func (p *pickler) frames(fs []trace.Frame) {
	if len(fs) == 0 {
		p.op(opEmptyList)
		return
	}
	key := listKey{&fs[0], len(fs)}
	if m, ok := p.listMemo[key]; ok && slices.Equal(m.frames, fs) {
		p.get(m.idx)
		return
	}
	p.op(opEmptyList)
	idx := p.memoize()
	if p.listFrames+len(fs) <= maxMemoFrames {
		p.listMemo[key] = listMemoized{idx, slices.Clone(fs)}
		p.listFrames += len(fs)
	}
	p.op(opMark)
	for _, f := range fs {
		if idx, ok := p.frameMemo[f]; ok {
			p.get(idx)
			continue
		}
		p.op(opEmptyDict)
		if len(p.frameMemo) < maxMemoFrames {
			p.frameMemo[f] = p.memoize()
		}
		p.op(opMark)
		p.str("name")
		p.str(f.Name)
		p.str("filename")
		p.str(f.File)
		p.str("line")
		p.int(f.Line)
		p.op(opSetItems)
	}
	p.op(opAppends)
}

// get fetches memo index idx.
func (p *pickler) get(idx uint32) {
	if idx < 256 {
		p.op(opBinGet, byte(idx))
		return
	}
	binary.LittleEndian.PutUint32(p.buf[:4], idx)
	p.op(opLongBinGet)
	p.bytes(p.buf[:4])
}

func (p *pickler) op(ops ...byte) {
	if p.err != nil {
		return
	}
	_, p.err = p.w.Write(ops)
}

func (p *pickler) bytes(b []byte) {
	if p.err != nil {
		return
	}
	_, p.err = p.w.Write(b)
}

// str writes s as a Python str. A string that is not UTF-8 (Python's
// unpickler refuses it, and with it the whole snapshot) is written with
// U+FFFD in place of each run of bad bytes, and counted in replaced.
func (p *pickler) str(s string) {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
		p.replaced++
	}
	if idx, ok := p.memo[s]; ok {
		p.get(idx)
		return
	}
	if len(s) < 256 {
		p.op(opShortBinUnicode, byte(len(s)))
	} else {
		binary.LittleEndian.PutUint32(p.buf[:4], uint32(len(s)))
		p.op(opBinUnicode)
		p.bytes(p.buf[:4])
	}
	if p.err == nil {
		_, p.err = p.w.WriteString(s)
	}
	if len(s) <= maxMemoLen && len(p.memo) < maxMemo {
		p.memo[s] = p.memoize()
	}
}

func (p *pickler) int(v int64) {
	switch {
	case v >= 0 && v < 1<<8:
		p.op(opBinInt1, byte(v))
	case v >= 0 && v < 1<<16:
		p.op(opBinInt2, byte(v), byte(v>>8))
	case v >= math.MinInt32 && v <= math.MaxInt32:
		binary.LittleEndian.PutUint32(p.buf[:4], uint32(int32(v)))
		p.op(opBinInt)
		p.bytes(p.buf[:4])
	default:
		// LONG1: the shortest little-endian two's complement.
		binary.LittleEndian.PutUint64(p.buf[:8], uint64(v))
		n := 8
		for n > 1 {
			top, next := p.buf[n-1], p.buf[n-2]
			if (top == 0 && next < 0x80) || (top == 0xff && next >= 0x80) {
				n--
				continue
			}
			break
		}
		p.op(opLong1, byte(n))
		p.bytes(p.buf[:n])
	}
}

func (p *pickler) uint(v uint64) {
	if v <= math.MaxInt64 {
		p.int(int64(v))
		return
	}
	// Above 2^63: nine bytes, the last a zero sign byte.
	binary.LittleEndian.PutUint64(p.buf[:8], v)
	p.buf[8] = 0
	p.op(opLong1, 9)
	p.bytes(p.buf[:9])
}

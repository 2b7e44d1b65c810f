package pytorch

import (
	"fmt"
	"io"
	"math/big"

	"github.com/gpualloc/allocsim/trace"
)

// This file is a streaming decoder for the pickles of plain Python values
// that snapshots are (protocols 2 to 5, as CPython's pickler writes them),
// which walks a snapshot without building it: the entries of the chosen
// device trace are converted as each batch of them is appended to its list
// and then dropped, the final segments are kept in a compact form, the
// allocator settings in full, and everything else (stack frames, other
// devices' traces, external annotations) is only stepped over; the stack
// frames of the entries and blocks are kept as stacks when asked
// (frames.go).
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
//
// The decoder is in four files: this one (the decoder and its state),
// pickle.go (the pickle machine: values, input, memo, opcodes), schema.go
// (the snapshot's roles, key strings and final-state segments) and
// entries.go (the fields of entries, segments and blocks).

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
	lim          limits
	at           int64 // the pickle offset of the opcode being run
	limitErr     error // a limit gone over by the opcode being run
	strBytes     int64 // d.strs' bytes, plus 64 a string
	markSteps    int64 // marks looked through by childRole, for a test
	// memoTop: the opcode run memoized the value on top or took it from
	// the memo; prevMemo: the one before did.
	memoTop, prevMemo bool
	fields1           entryFields   // the entry being converted
	segments          []snapSegment // from roleSegments

	// seen, if not nil, takes the stack frames of every entry and block
	// (a snapshot shares frame dicts and frames lists between them, and
	// the pickle refers to them again through its memo, so every one is
	// read); stacks keeps those that the events name (kept, frames.go):
	// the mallocs' with entryFrames, the final segments' blocks' with
	// blockFrames. frameIDs holds the frame ids in seen by the decoder's
	// strings, toKept the id in stacks of each stack of seen (0 if none
	// yet).
	seen, stacks             *trace.Stacks
	entryFrames, blockFrames bool
	frameIDs                 map[frameKey]uint32
	toKept                   []uint32
	fids                     []uint32
	// entryStack is the stack in seen of the entry converted last, 0 if
	// none; stackQueries caches what stackHolds found.
	entryStack   uint32
	stackQueries map[stackQuery]bool
	// building holds the frame dicts being read (vFrameBuild values of
	// generation buildGen), buildMemo 1 + the memo index of each, 0 if
	// none.
	building  []frameKey
	buildMemo []uint64
	buildGen  uint32
}

// readFrames makes d keep the frames of the entries and of the final
// blocks, as asked, in st.
func (d *decoder) readFrames(st *trace.Stacks, entries, blocks bool) {
	d.stacks, d.entryFrames, d.blockFrames = st, entries, blocks
	if d.frameIDs == nil {
		d.frameIDs = map[frameKey]uint32{}
		d.seen = trace.NewStacks()
	}
}

func newDecoder(r io.Reader, device int, s sink) *decoder {
	d := &decoder{in: newInput(r), device: device, sink: s, strID: map[string]uint32{}, lim: defaultLimits}
	for i, s := range knownStrings {
		d.strs = append(d.strs, s)
		d.strID[s] = uint32(i)
		d.strBytes += int64(len(s)) + 64
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
	if d.strBytes += int64(len(b)) + 64; d.strBytes > d.lim.strs {
		d.overLater(d.lim.strs, " bytes", "%d distinct strings of %d bytes in all (counting 64 more for each)", len(d.strs)+1, d.strBytes)
	}
	id := uint32(len(d.strs))
	s := string(b)
	d.strs = append(d.strs, s)
	d.strID[s] = id
	return id
}

func (d *decoder) fail(at int64, op byte, format string, args ...any) error {
	return &pickleError{Offset: at, Op: op, Msg: fmt.Sprintf(format, args...)}
}

package trace

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"

	"github.com/vmihailenco/msgpack/v5"
)

// The native file format:
//
//	magic    "GPUTRACE" (8 bytes)
//	version  uvarint (Version)
//	frames   each: kind (1 byte), payload length (uvarint), payload,
//	         CRC-32C of the payload (4 bytes, little endian)
//
// The first frame ('H') holds the Header as a msgpack map. Event frames
// ('E') hold a msgpack uint count and then that many events, each a msgpack
// array [op, time delta, address delta, size, stream, kind, thread, label,
// pool, restore (1, or 0 when a stack follows), stack] with trailing zero
// fields left out (label "" is zero); the time and
// address deltas are signed differences from the previous event's (starting
// from 0). Stack frames ('S', since version 3) carry the stack table
// (Stacks) as it grows: before the first event frame that names a new
// stack, a msgpack array [first frame id, [[name, file, line], ...],
// first stack id, [[frame id, ...], ...]] of the frames and stacks added
// since the last stack frame, each list numbered on from the ones before.
// Version 1, which had no pool, is read as well: its arrays end at
// the label, and its events are all of the default pools; version 2's end
// at the restore flag and have no stack frames. The last frame
// ('T') is the trailer, a msgpack map {"events": total events, "crc32c": the
// CRC-32C of every event frame's payload in order (from version 3, every
// event and stack frame's)}, after which the file
// must end. So truncation anywhere and corruption of any byte are detected.

// Magic is the first 8 bytes of a native trace file.
const Magic = "GPUTRACE"

const (
	frameHeader  = 'H'
	frameEvents  = 'E'
	frameTrailer = 'T'
	frameStacks  = 'S'

	// frameTarget is the payload size at which the Writer ends a frame.
	frameTarget = 64 << 10
	// maxFrame bounds a frame's payload; a larger length is corruption.
	maxFrame = 64 << 20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Errors a Reader returns, wrapped in a *FormatError; match with errors.Is.
var (
	ErrBadMagic           = errors.New("not a native trace (bad magic)")
	ErrUnsupportedVersion = errors.New("unsupported format version")
	ErrTruncated          = errors.New("truncated")
	ErrChecksum           = errors.New("checksum mismatch")
	ErrCorrupt            = errors.New("corrupt")
)

// FormatError is an error in the bytes of a native trace file.
type FormatError struct {
	File   string // file name, "" if unknown
	Offset int64  // byte offset of the frame or field at fault
	Event  int64  // index of the event at fault, -1 if none
	Err    error  // one of the Err* sentinels, possibly wrapped
}

func (e *FormatError) Error() string {
	where := fmt.Sprintf("byte offset %d", e.Offset)
	if e.Event >= 0 {
		where += fmt.Sprintf(" (event %d)", e.Event)
	}
	if e.File != "" {
		return fmt.Sprintf("%s: %s: %v", e.File, where, e.Err)
	}
	return fmt.Sprintf("%s: %v", where, e.Err)
}

func (e *FormatError) Unwrap() error { return e.Err }

// trailer is the last frame's payload.
type trailer struct {
	Events uint64 `msgpack:"events"`
	CRC    uint32 `msgpack:"crc32c"`
}

// Writer writes a native trace. Events are buffered into frames; Close
// writes the last frame and the trailer and must be called for the file to
// be readable.
type Writer struct {
	w       io.Writer
	buf     bytes.Buffer // current frame's events
	enc     *msgpack.Encoder
	inFrame uint64
	events  uint64
	crc     uint32
	prevT   int64
	prevA   uint64
	err     error
	closed  bool
	// stacks is the table the events' stacks name (SetStacks); the
	// frames and stacks below the counts were written.
	stacks                       *Stacks
	framesWritten, stacksWritten int
}

// SetStacks gives the writer the table that the events' Stack ids name;
// the writer writes its stacks as the events that name them are written.
// An event with a stack needs it.
func (w *Writer) SetStacks(s *Stacks) { w.stacks = s }

// NewWriter writes the magic, version and header h to w and returns a
// Writer for the events. h.Version is set to Version.
func NewWriter(w io.Writer, h Header) (*Writer, error) {
	h.Version = Version
	tw := &Writer{w: w}
	tw.enc = msgpack.NewEncoder(&tw.buf)
	var head [8 + binary.MaxVarintLen64]byte
	copy(head[:], Magic)
	n := binary.PutUvarint(head[8:], Version)
	if _, err := w.Write(head[:8+n]); err != nil {
		return nil, err
	}
	// Map keys sorted, so that the same trace is the same bytes.
	var hbuf bytes.Buffer
	he := msgpack.NewEncoder(&hbuf)
	he.SetSortMapKeys(true)
	if err := he.Encode(&h); err != nil {
		return nil, err
	}
	hb := hbuf.Bytes()
	if err := tw.writeFrame(frameHeader, hb); err != nil {
		return nil, err
	}
	return tw, nil
}

func (w *Writer) writeFrame(kind byte, payload []byte) error {
	var pre [1 + binary.MaxVarintLen64]byte
	pre[0] = kind
	n := binary.PutUvarint(pre[1:], uint64(len(payload)))
	var sum [4]byte
	binary.LittleEndian.PutUint32(sum[:], crc32.Checksum(payload, castagnoli))
	for _, b := range [][]byte{pre[:1+n], payload, sum[:]} {
		if _, err := w.w.Write(b); err != nil {
			return err
		}
	}
	return nil
}

// Write appends one event. It returns an error if ev.Op is invalid or the
// underlying writer failed.
func (w *Writer) Write(ev Event) error {
	if w.err != nil {
		return w.err
	}
	if w.closed {
		return errors.New("trace: write after close")
	}
	if !ev.Op.Valid() {
		return fmt.Errorf("trace: event %d: invalid op %d", w.events, ev.Op)
	}
	fields := [...]uint64{
		uint64(ev.Op),
		uint64(ev.Time - w.prevT),
		ev.Addr - w.prevA,
		ev.Size,
		ev.Stream,
		uint64(ev.Kind),
		ev.Thread,
	}
	if ev.Stack != 0 && int(ev.Stack) > w.stacks.Len() {
		return fmt.Errorf("trace: event %d: stack %d is not in the writer's stack table (%d stacks)", w.events, ev.Stack, w.stacks.Len())
	}
	n := len(fields)
	switch {
	case ev.Stack != 0:
		n += 4
	case ev.Restore:
		n += 3
	case ev.Pool != 0:
		n += 2
	case ev.Label != "":
		n++
	default:
		for n > 1 && fields[n-1] == 0 {
			n--
		}
	}
	w.enc.EncodeArrayLen(n)
	for k := 0; k < n && k < len(fields); k++ {
		if k == 1 || k == 2 {
			w.enc.EncodeInt(int64(fields[k]))
		} else {
			w.enc.EncodeUint(fields[k])
		}
	}
	if n > len(fields) {
		w.enc.EncodeString(ev.Label)
	}
	if n > len(fields)+1 {
		w.enc.EncodeUint(uint64(ev.Pool))
	}
	if ev.Restore {
		w.enc.EncodeUint(1)
	} else if n > len(fields)+2 {
		w.enc.EncodeUint(0)
	}
	if n > len(fields)+3 {
		w.enc.EncodeUint(uint64(ev.Stack))
	}
	w.prevT, w.prevA = ev.Time, ev.Addr
	w.inFrame++
	w.events++
	if w.buf.Len() >= frameTarget {
		w.err = w.flush()
	}
	return w.err
}

func (w *Writer) flush() error {
	if w.inFrame == 0 {
		return nil
	}
	if err := w.flushStacks(); err != nil {
		return err
	}
	var cnt bytes.Buffer
	msgpack.NewEncoder(&cnt).EncodeUint(w.inFrame)
	payload := append(cnt.Bytes(), w.buf.Bytes()...)
	w.crc = crc32.Update(w.crc, castagnoli, payload)
	w.buf.Reset()
	w.inFrame = 0
	return w.writeFrame(frameEvents, payload)
}

// flushStacks writes a stack frame of the frames and stacks added to the
// table since the last one, if any.
func (w *Writer) flushStacks() error {
	st := w.stacks
	if st.Len() == w.stacksWritten && st.NumFrames() == w.framesWritten {
		return nil
	}
	var b bytes.Buffer
	e := msgpack.NewEncoder(&b)
	e.EncodeArrayLen(4)
	e.EncodeUint(uint64(w.framesWritten))
	e.EncodeArrayLen(st.NumFrames() - w.framesWritten)
	for f := w.framesWritten; f < st.NumFrames(); f++ {
		fr := st.Frame(uint32(f))
		e.EncodeArrayLen(3)
		e.EncodeString(fr.Name)
		e.EncodeString(fr.File)
		e.EncodeInt(fr.Line)
	}
	e.EncodeUint(uint64(w.stacksWritten + 1))
	e.EncodeArrayLen(st.Len() - w.stacksWritten)
	for id := w.stacksWritten + 1; id <= st.Len(); id++ {
		fids := st.FrameIDs(uint32(id))
		e.EncodeArrayLen(len(fids))
		for _, f := range fids {
			e.EncodeUint(uint64(f))
		}
	}
	w.framesWritten, w.stacksWritten = st.NumFrames(), st.Len()
	w.crc = crc32.Update(w.crc, castagnoli, b.Bytes())
	return w.writeFrame(frameStacks, b.Bytes())
}

// Close writes the buffered events and the trailer. It does not close the
// underlying writer.
func (w *Writer) Close() error {
	if w.closed {
		return w.err
	}
	w.closed = true
	if w.err != nil {
		return w.err
	}
	if err := w.flush(); err != nil {
		w.err = err
		return err
	}
	tb, err := msgpack.Marshal(&trailer{Events: w.events, CRC: w.crc})
	if err != nil {
		return err
	}
	w.err = w.writeFrame(frameTrailer, tb)
	return w.err
}

// Events returns the number of events written so far.
func (w *Writer) Events() uint64 { return w.events }

// Reader reads a native trace as a stream of events; it holds one frame in
// memory at a time.
type Reader struct {
	name      string
	version   int // the file's format version
	maxFields int // the fields an event of that version has at most
	r         *bufio.Reader
	off       int64 // bytes consumed from r
	header    Header

	frame    []byte
	frameOff int64 // file offset of the current frame's payload
	dec      *msgpack.Decoder
	br       bytes.Reader
	left     uint64 // events left in the current frame
	events   int64  // events returned so far
	crc      uint32
	prevT    int64
	prevA    uint64
	done     bool
	stacks   *Stacks // from the stack frames; nil before version 3
}

var _ StackSource = (*Reader)(nil)

// Stacks returns the stack table read so far: every stack that an event
// already returned names. For a trace of version 3 it is one table from
// the start, empty until the first stack frame, and grows as the events
// are read; it is nil for versions 1 and 2, which hold no stacks.
func (r *Reader) Stacks() *Stacks { return r.stacks }

// NewReader checks the magic and version of the trace in r and reads its
// header. name is used in errors. It returns a *FormatError wrapping
// ErrBadMagic, ErrUnsupportedVersion, ErrTruncated, ErrChecksum or
// ErrCorrupt.
func NewReader(r io.Reader, name string) (*Reader, error) {
	tr := &Reader{name: name, r: bufio.NewReaderSize(r, 256<<10)}
	tr.dec = msgpack.NewDecoder(&tr.br)
	var magic [8]byte
	n, err := io.ReadFull(tr.r, magic[:])
	switch {
	case n == 0:
		return nil, tr.errAt(0, -1, fmt.Errorf("%w: empty file", ErrTruncated))
	case string(magic[:n]) != Magic[:n]:
		return nil, tr.errAt(0, -1, ErrBadMagic)
	case err != nil:
		return nil, tr.errAt(int64(n), -1, fmt.Errorf("%w: the file ends inside the magic", ErrTruncated))
	}
	tr.off = 8
	v, err := tr.uvarint()
	if err != nil {
		return nil, err
	}
	if v < 1 || v > Version {
		return nil, tr.errAt(8, -1, fmt.Errorf("%w %d (this build reads versions 1 to %d)", ErrUnsupportedVersion, v, Version))
	}
	tr.version = int(v)
	tr.maxFields = 8 // op .. label
	if v >= 2 {
		tr.maxFields = 10 // pool, restore
	}
	if v >= 3 {
		tr.maxFields = 11 // stack
		// The table exists from the start and grows as stack frames are
		// read, so that a caller that takes it once, before the events
		// (a writer's SetStacks, --viz, --sites), sees every stack.
		tr.stacks = NewStacks()
	}
	kind, payload, err := tr.readFrame()
	if err != nil {
		return nil, err
	}
	if kind != frameHeader {
		return nil, tr.errAt(tr.frameOff, -1, fmt.Errorf("%w: first frame is %q, want the header", ErrCorrupt, kind))
	}
	if err := msgpack.Unmarshal(payload, &tr.header); err != nil {
		return nil, tr.errAt(tr.frameOff, -1, fmt.Errorf("%w: header: %v", ErrCorrupt, err))
	}
	if tr.header.Version != tr.version {
		// The Writer puts the version in both: a changed version byte
		// would read the events with another version's fields.
		return nil, tr.errAt(8, -1, fmt.Errorf("%w: format version %d, but the header says %d", ErrCorrupt, tr.version, tr.header.Version))
	}
	return tr, nil
}

func (r *Reader) errAt(off, ev int64, err error) error {
	return &FormatError{File: r.name, Offset: off, Event: ev, Err: err}
}

func (r *Reader) uvarint() (uint64, error) {
	start := r.off
	v, err := binary.ReadUvarint(byteCounter{r})
	if err != nil {
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return 0, r.errAt(start, -1, ErrTruncated)
		}
		return 0, r.errAt(start, -1, fmt.Errorf("%w: %v", ErrCorrupt, err))
	}
	return v, nil
}

type byteCounter struct{ r *Reader }

func (b byteCounter) ReadByte() (byte, error) {
	c, err := b.r.r.ReadByte()
	if err == nil {
		b.r.off++
	}
	return c, err
}

// readFrame reads the next frame and checks its CRC.
func (r *Reader) readFrame() (byte, []byte, error) {
	start := r.off
	kind, err := r.r.ReadByte()
	if err != nil {
		if err == io.EOF {
			return 0, nil, r.errAt(start, r.events, fmt.Errorf("%w: the file ends before its trailer", ErrTruncated))
		}
		return 0, nil, r.errAt(start, r.events, err)
	}
	r.off++
	if kind != frameHeader && kind != frameEvents && kind != frameTrailer && (kind != frameStacks || r.version < 3) {
		return 0, nil, r.errAt(start, r.events, fmt.Errorf("%w: unknown frame kind %#x", ErrCorrupt, kind))
	}
	n, err := r.uvarint()
	if err != nil {
		return 0, nil, err
	}
	if n > maxFrame {
		return 0, nil, r.errAt(start, r.events, fmt.Errorf("%w: frame length %d", ErrCorrupt, n))
	}
	if uint64(cap(r.frame)) < n+4 {
		r.frame = make([]byte, n+4)
	}
	buf := r.frame[:n+4]
	got, err := io.ReadFull(r.r, buf)
	r.off += int64(got)
	if err != nil {
		return 0, nil, r.errAt(start, r.events, fmt.Errorf("%w: frame of %d bytes cut after %d", ErrTruncated, n+4, got))
	}
	payload := buf[:n]
	if crc32.Checksum(payload, castagnoli) != binary.LittleEndian.Uint32(buf[n:]) {
		return 0, nil, r.errAt(start, r.events, fmt.Errorf("%w in frame", ErrChecksum))
	}
	r.frameOff = start
	return kind, payload, nil
}

// Header returns the trace's header.
func (r *Reader) Header() Header { return r.header }

// Next returns the next event, or io.EOF after the last one once the
// trailer has confirmed the event count and checksum. Other errors are
// *FormatError values and final.
func (r *Reader) Next() (Event, error) {
	for r.left == 0 {
		if r.done {
			return Event{}, io.EOF
		}
		if err := r.nextFrame(); err != nil {
			return Event{}, err
		}
	}
	ev, err := r.decodeEvent()
	if err != nil {
		r.done, r.left = true, 0
		return Event{}, r.errAt(r.frameOff, r.events, fmt.Errorf("%w: %v", ErrCorrupt, err))
	}
	r.left--
	r.events++
	return ev, nil
}

func (r *Reader) nextFrame() error {
	if r.br.Len() > 0 {
		return r.errAt(r.frameOff, r.events, fmt.Errorf("%w: %d bytes after the frame's events", ErrCorrupt, r.br.Len()))
	}
	kind, payload, err := r.readFrame()
	if err != nil {
		r.done = true
		return err
	}
	switch kind {
	case frameEvents:
		r.crc = crc32.Update(r.crc, castagnoli, payload)
		r.br.Reset(payload)
		r.dec.Reset(&r.br)
		n, err := r.dec.DecodeUint64()
		if err != nil || n == 0 {
			r.done = true
			return r.errAt(r.frameOff, r.events, fmt.Errorf("%w: bad event count in frame", ErrCorrupt))
		}
		r.left = n
		return nil
	case frameStacks:
		r.crc = crc32.Update(r.crc, castagnoli, payload)
		if err := r.readStacks(payload); err != nil {
			r.done = true
			return r.errAt(r.frameOff, r.events, fmt.Errorf("%w: stack frame: %v", ErrCorrupt, err))
		}
		return nil
	case frameTrailer:
		r.done = true
		var t trailer
		if err := msgpack.Unmarshal(payload, &t); err != nil {
			return r.errAt(r.frameOff, r.events, fmt.Errorf("%w: trailer: %v", ErrCorrupt, err))
		}
		if t.Events != uint64(r.events) {
			return r.errAt(r.frameOff, r.events, fmt.Errorf("%w: trailer says %d events, the file holds %d", ErrCorrupt, t.Events, r.events))
		}
		if t.CRC != r.crc {
			return r.errAt(r.frameOff, r.events, fmt.Errorf("%w: events checksum %#08x, trailer says %#08x", ErrChecksum, r.crc, t.CRC))
		}
		if _, err := r.r.ReadByte(); err != io.EOF {
			return r.errAt(r.off, r.events, fmt.Errorf("%w: data after the trailer", ErrCorrupt))
		}
		return nil
	default:
		r.done = true
		return r.errAt(r.frameOff, r.events, fmt.Errorf("%w: a second header frame", ErrCorrupt))
	}
}

// readStacks adds the frames and stacks of a stack frame's payload to the
// table.
func (r *Reader) readStacks(payload []byte) error {
	if r.stacks == nil {
		r.stacks = NewStacks()
	}
	st := r.stacks
	br := bytes.NewReader(payload)
	d := msgpack.NewDecoder(br)
	if n, err := d.DecodeArrayLen(); err != nil || n != 4 {
		return fmt.Errorf("want an array of 4")
	}
	first, err := d.DecodeUint64()
	if err != nil || first != uint64(st.NumFrames()) {
		return fmt.Errorf("frames start at %d, want %d", first, st.NumFrames())
	}
	nf, err := d.DecodeArrayLen()
	if err != nil || nf < 0 {
		return fmt.Errorf("bad frame list")
	}
	for k := 0; k < nf; k++ {
		if n, err := d.DecodeArrayLen(); err != nil || n != 3 {
			return fmt.Errorf("frame %d is not [name, file, line]", first+uint64(k))
		}
		var f Frame
		if f.Name, err = d.DecodeString(); err != nil {
			return err
		}
		if f.File, err = d.DecodeString(); err != nil {
			return err
		}
		if f.Line, err = d.DecodeInt64(); err != nil {
			return err
		}
		if st.AddFrame(f) != uint32(first)+uint32(k) {
			return fmt.Errorf("frame %d repeats an earlier one", first+uint64(k))
		}
	}
	firstStack, err := d.DecodeUint64()
	if err != nil || firstStack != uint64(st.Len()+1) {
		return fmt.Errorf("stacks start at %d, want %d", firstStack, st.Len()+1)
	}
	ns, err := d.DecodeArrayLen()
	if err != nil || ns < 0 {
		return fmt.Errorf("bad stack list")
	}
	var fids []uint32
	for k := 0; k < ns; k++ {
		n, err := d.DecodeArrayLen()
		if err != nil || n <= 0 {
			return fmt.Errorf("stack %d is not a list of frames", firstStack+uint64(k))
		}
		fids = fids[:0]
		for j := 0; j < n; j++ {
			f, err := d.DecodeUint64()
			if err != nil || f >= uint64(st.NumFrames()) {
				return fmt.Errorf("stack %d names an unknown frame", firstStack+uint64(k))
			}
			fids = append(fids, uint32(f))
		}
		if st.Add(fids) != uint32(firstStack)+uint32(k) {
			return fmt.Errorf("stack %d repeats an earlier one", firstStack+uint64(k))
		}
	}
	if br.Len() > 0 {
		return fmt.Errorf("%d bytes after the stacks", br.Len())
	}
	return nil
}

func (r *Reader) decodeEvent() (Event, error) {
	n, err := r.dec.DecodeArrayLen()
	if err != nil {
		return Event{}, err
	}
	if n < 1 || n > r.maxFields {
		return Event{}, fmt.Errorf("event has %d fields (version %d has at most %d)", n, r.version, r.maxFields)
	}
	var ev Event
	for k := 0; k < n; k++ {
		switch k {
		case 0:
			v, err := r.dec.DecodeUint64()
			if err != nil {
				return ev, err
			}
			ev.Op = Op(v)
			if v > 255 || !ev.Op.Valid() || ev.Op == OpPoolRelease && r.version < 2 {
				return ev, fmt.Errorf("invalid op %d", v)
			}
		case 1, 2:
			v, err := r.dec.DecodeInt64()
			if err != nil {
				return ev, err
			}
			if k == 1 {
				ev.Time = r.prevT + v
			} else {
				ev.Addr = r.prevA + uint64(v)
			}
		case 3, 4, 5, 6:
			v, err := r.dec.DecodeUint64()
			if err != nil {
				return ev, err
			}
			switch k {
			case 3:
				ev.Size = v
			case 4:
				ev.Stream = v
			case 5:
				if v >= uint64(numKinds) {
					return ev, fmt.Errorf("invalid memory kind %d", v)
				}
				ev.Kind = Kind(v)
			case 6:
				ev.Thread = v
			}
		case 7:
			s, err := r.dec.DecodeString()
			if err != nil {
				return ev, err
			}
			ev.Label = s
		case 8:
			v, err := r.dec.DecodeUint64()
			if err != nil {
				return ev, err
			}
			if v > math.MaxUint32 || v == 0 && n == 9 {
				return ev, fmt.Errorf("invalid pool %d", v)
			}
			ev.Pool = uint32(v)
		case 9:
			v, err := r.dec.DecodeUint64()
			if err != nil {
				return ev, err
			}
			if v > 1 || v == 0 && n == 10 {
				return ev, fmt.Errorf("invalid restore flag %d", v)
			}
			ev.Restore = v == 1
		case 10:
			v, err := r.dec.DecodeUint64()
			if err != nil {
				return ev, err
			}
			if v == 0 || v > uint64(r.stacks.Len()) {
				return ev, fmt.Errorf("stack %d is not in the trace's stack table (%d stacks)", v, r.stacks.Len())
			}
			ev.Stack = uint32(v)
		}
	}
	if n <= 1 {
		ev.Time = r.prevT
	}
	if n <= 2 {
		ev.Addr = r.prevA
	}
	r.prevT, r.prevA = ev.Time, ev.Addr
	return ev, nil
}

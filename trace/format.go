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
// pool, restore (1 or absent)] with trailing zero fields left out (label ""
// is zero); the time and
// address deltas are signed differences from the previous event's (starting
// from 0). Version 1, which had no pool, is read as well: its arrays end at
// the label, and its events are all of the default pools. The last frame
// ('T') is the trailer, a msgpack map {"events": total events, "crc32c": the
// CRC-32C of every event frame's payload in order}, after which the file
// must end. So truncation anywhere and corruption of any byte are detected.

// Magic is the first 8 bytes of a native trace file.
const Magic = "GPUTRACE"

const (
	frameHeader  = 'H'
	frameEvents  = 'E'
	frameTrailer = 'T'

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
}

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
	n := len(fields)
	switch {
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
	var cnt bytes.Buffer
	msgpack.NewEncoder(&cnt).EncodeUint(w.inFrame)
	payload := append(cnt.Bytes(), w.buf.Bytes()...)
	w.crc = crc32.Update(w.crc, castagnoli, payload)
	w.buf.Reset()
	w.inFrame = 0
	return w.writeFrame(frameEvents, payload)
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
}

var _ Source = (*Reader)(nil)

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
	if kind != frameHeader && kind != frameEvents && kind != frameTrailer {
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
			if v != 1 {
				return ev, fmt.Errorf("invalid restore flag %d", v)
			}
			ev.Restore = true
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

package xspace

import (
	"bufio"
	"errors"
	"fmt"
	"io"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/gpualloc/allocsim/trace"
)

// wire reads protobuf wire data from a stream, front to back, counting the
// bytes it has consumed. A field's length is checked against the bytes
// left in the message that holds it before anything is read or skipped, so
// a damaged length is an error at its offset, never an allocation.
type wire struct {
	name string    // file name, for errors
	gz   bool      // the offsets are those of the decompressed stream
	src  io.Reader // what br reads
	seek io.Seeker // src itself, for skipping without reading; nil for a gzip stream
	br   *bufio.Reader
	off  int64 // bytes consumed
}

func newWire(src io.Reader, seek io.Seeker, name string, gz bool) *wire {
	return &wire{name: name, gz: gz, src: src, seek: seek, br: bufio.NewReaderSize(src, 64<<10)}
}

// errorAt returns a *trace.FormatError at byte offset off whose Err wraps
// sentinel with the message.
func (w *wire) errorAt(off int64, sentinel error, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	if w.gz {
		msg += " (offsets in the decompressed XSpace)"
	}
	return &trace.FormatError{File: w.name, Offset: off, Event: -1, Err: fmt.Errorf("%w: %s", sentinel, msg)}
}

// readErr turns a read error at offset off into a FormatError: the end of
// the input is ErrTruncated, anything else (a gzip checksum, an I/O error)
// is kept.
func (w *wire) readErr(off int64, err error, what string) error {
	if w.gz && errors.Is(err, io.ErrUnexpectedEOF) {
		return w.errorAt(off, trace.ErrTruncated, "the gzip stream ends early (in %s)", what)
	}
	if err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF) {
		return w.errorAt(off, trace.ErrTruncated, "the input ends inside %s", what)
	}
	return &trace.FormatError{File: w.name, Offset: off, Event: -1, Err: err}
}

// What a varint is, for errors.
const (
	varTag    = iota // a field's tag
	varLength        // the length of field num
	varValue         // the value of field num
)

func describe(role int, num protowire.Number) string {
	switch role {
	case varTag:
		return "a field tag"
	case varLength:
		return fmt.Sprintf("the length of field %d", num)
	}
	return fmt.Sprintf("field %d", num)
}

// varint reads a base-128 varint, of role for field num, in a message that
// ends at end (-1: the input's end).
func (w *wire) varint(role int, num protowire.Number, end int64) (uint64, error) {
	at := w.off
	b, err := w.br.Peek(binary10)
	if len(b) == 0 {
		return 0, w.readErr(at, err, describe(role, num))
	}
	v, n := protowire.ConsumeVarint(b)
	if n < 0 {
		if len(b) < binary10 && err != nil {
			// A varint cut by the end of the input.
			return 0, w.readErr(at, err, describe(role, num))
		}
		return 0, w.errorAt(at, trace.ErrCorrupt, "%s: %v", describe(role, num), protowire.ParseError(n))
	}
	if end >= 0 && w.off+int64(n) > end {
		return 0, w.errorAt(at, trace.ErrTruncated, "%s runs past the end of its message at byte %d", describe(role, num), end)
	}
	w.br.Discard(n)
	w.off += int64(n)
	return v, nil
}

// binary10 is the longest varint, in bytes.
const binary10 = 10

// field is a field's tag as read by next, with where it began.
type field struct {
	num protowire.Number
	typ protowire.Type
	at  int64 // offset of the tag
}

// next reads the tag of the next field of a message that ends at end; it
// reports false at the message's end. At top level (end < 0: the length of
// the input is unknown, a gzip stream) the end of the input ends it.
func (w *wire) next(end int64) (field, bool, error) {
	f := field{at: w.off}
	if end >= 0 && w.off >= end {
		return f, false, nil
	}
	if end < 0 {
		if _, err := w.br.Peek(1); err == io.EOF {
			return f, false, nil
		}
	}
	v, err := w.varint(varTag, 0, end)
	if err != nil {
		return f, false, err
	}
	f.num, f.typ = protowire.DecodeTag(v)
	if !f.num.IsValid() {
		return f, false, w.errorAt(f.at, trace.ErrCorrupt, "field tag %#x: invalid field number %d", v, f.num)
	}
	switch f.typ {
	case protowire.VarintType, protowire.Fixed32Type, protowire.Fixed64Type, protowire.BytesType:
	default:
		// Groups (3, 4) are not in the XSpace schema, and 6, 7 are no wire type.
		return f, false, w.errorAt(f.at, trace.ErrCorrupt, "field %d has wire type %d, which no XSpace field has", f.num, f.typ)
	}
	return f, true, nil
}

// length reads the length of the bytes field f of a message that ends at
// end, checks that the message holds that many bytes, and returns the
// offset where the field's bytes end. in names the message for errors.
func (w *wire) length(f field, end int64, in string) (int64, error) {
	n, err := w.varint(varLength, f.num, end)
	if err != nil {
		return 0, err
	}
	if left := end - w.off; end >= 0 && n > uint64(left) {
		return 0, w.errorAt(f.at, trace.ErrTruncated, "field %d claims %d bytes, %s has %d left", f.num, n, in, left)
	}
	if n > 1<<62 {
		return 0, w.errorAt(f.at, trace.ErrCorrupt, "field %d claims %d bytes", f.num, n)
	}
	return w.off + int64(n), nil
}

// skip skips the value of field f, whose tag was just read, in a message
// that ends at end.
func (w *wire) skip(f field, end int64) error {
	switch f.typ {
	case protowire.VarintType:
		_, err := w.varint(varValue, f.num, end)
		return err
	case protowire.Fixed32Type:
		return w.skipTo(w.off+4, end, f)
	case protowire.Fixed64Type:
		return w.skipTo(w.off+8, end, f)
	}
	stop, err := w.length(f, end, "its message")
	if err != nil {
		return err
	}
	return w.skipTo(stop, end, f)
}

// skipTo moves to offset stop (not past end, the end of f's message),
// seeking over what is not buffered when the input is a file.
func (w *wire) skipTo(stop, end int64, f field) error {
	if end >= 0 && stop > end {
		return w.errorAt(f.at, trace.ErrTruncated, "field %d runs past the end of its message at byte %d", f.num, end)
	}
	n := stop - w.off
	if n <= 0 {
		return nil
	}
	if buf := int64(w.br.Buffered()); n > buf && w.seek != nil {
		// The file is at w.off+buf; go to stop and read from there.
		if _, err := w.seek.Seek(n-buf, io.SeekCurrent); err != nil {
			return &trace.FormatError{File: w.name, Offset: f.at, Event: -1, Err: err}
		}
		w.br.Reset(w.src)
		w.off = stop
		return nil
	}
	got, err := w.br.Discard(int(n))
	w.off += int64(got)
	if err != nil {
		return w.readErr(f.at, err, describe(varValue, f.num))
	}
	return nil
}

// bytes reads the bytes field f of a message that ends at end: its value
// when it is at most limit bytes long, else nil (skipped, and reported
// false), so that a long string is never held.
func (w *wire) bytes(f field, end int64, limit int) ([]byte, bool, error) {
	if f.typ != protowire.BytesType {
		return nil, false, w.errorAt(f.at, trace.ErrCorrupt, "field %d has wire type %d, want bytes (2)", f.num, f.typ)
	}
	stop, err := w.length(f, end, "its message")
	if err != nil {
		return nil, false, err
	}
	n := stop - w.off
	if n > int64(limit) {
		return nil, false, w.skipTo(stop, end, f)
	}
	b := make([]byte, n)
	got, err := io.ReadFull(w.br, b)
	w.off += int64(got)
	if err != nil {
		return nil, false, w.readErr(f.at, err, describe(varValue, f.num))
	}
	return b, true, nil
}

// uint reads the integer field f: a varint, or a fixed64 or fixed32
// (the bits of a double_value are taken as they are; no field this
// package reads is one).
func (w *wire) uint(f field, end int64) (uint64, error) {
	switch f.typ {
	case protowire.VarintType:
		return w.varint(varValue, f.num, end)
	case protowire.Fixed64Type, protowire.Fixed32Type:
		size := 8
		if f.typ == protowire.Fixed32Type {
			size = 4
		}
		if end >= 0 && w.off+int64(size) > end {
			return 0, w.errorAt(f.at, trace.ErrTruncated, "field %d runs past the end of its message at byte %d", f.num, end)
		}
		var b [8]byte
		got, err := io.ReadFull(w.br, b[:size])
		w.off += int64(got)
		if err != nil {
			return 0, w.readErr(f.at, err, describe(varValue, f.num))
		}
		if size == 4 {
			v, _ := protowire.ConsumeFixed32(b[:4])
			return uint64(v), nil
		}
		v, _ := protowire.ConsumeFixed64(b[:8])
		return v, nil
	}
	return 0, w.errorAt(f.at, trace.ErrCorrupt, "field %d has wire type %d, want an integer", f.num, f.typ)
}

// enter reads the length of the message field f in a message that ends at
// end and returns where the inner message ends.
func (w *wire) enter(f field, end int64) (int64, error) {
	return w.enterIn(f, end, "its message")
}

// enterIn is enter, the outer message named in for errors.
func (w *wire) enterIn(f field, end int64, in string) (int64, error) {
	if f.typ != protowire.BytesType {
		return 0, w.errorAt(f.at, trace.ErrCorrupt, "field %d has wire type %d, want a message (2)", f.num, f.typ)
	}
	return w.length(f, end, in)
}

package pytorch

import (
	"encoding/binary"
	"fmt"
	"io"
)

// scanPickle walks the opcodes of the pickle in b (as Python's
// pickletools.genops does) up to its STOP, without building any value. It
// checks that every opcode is known and that no length-prefixed argument
// (a frame, a string, a long) runs past the end of b, so that the decoder,
// which allocates a declared length before reading it, never allocates more
// than the input holds. It returns the offset just past the STOP.
//
// A pickle that ends before its STOP gives an error wrapping
// io.ErrUnexpectedEOF; an unknown opcode a plain error; both with the byte
// offset of the offending opcode.
func scanPickle(b []byte) (int, error) {
	n := len(b)
	i := 0
	for i < n {
		at := i
		op := b[i]
		i++
		need := func(k uint64) error {
			if k > uint64(n-i) {
				return &scanError{at, op, io.ErrUnexpectedEOF}
			}
			i += int(k)
			return nil
		}
		var err error
		switch op {
		case '.': // STOP
			return i, nil
		case '(', '0', '1', '2', 'N', 'R', 'a', 'b', 'd', '}', 'e', 'l', ']',
			'o', 's', 't', ')', 'u', 'Q', 0x81, 0x85, 0x86, 0x87, 0x88, 0x89,
			0x8f, 0x90, 0x91, 0x92, 0x93, 0x94, 0x97, 0x98:
			// No argument.
		case 'K', 'h', 'q', 0x80, 0x82: // BININT1 BINGET BINPUT PROTO EXT1
			err = need(1)
		case 'M', 0x83: // BININT2 EXT2
			err = need(2)
		case 'J', 'j', 'r', 0x84: // BININT LONG_BINGET LONG_BINPUT EXT4
			err = need(4)
		case 'G': // BINFLOAT
			err = need(8)
		case 0x95: // FRAME: the frame's opcodes follow, but must fit
			if err = need(8); err == nil {
				if binary.LittleEndian.Uint64(b[i-8:]) > uint64(n-i) {
					err = &scanError{at, op, io.ErrUnexpectedEOF}
				}
			}
		case 'I', 'L', 'F', 'S', 'V', 'g', 'p', 'P': // one text line
			err = skipLine(b, &i, at, op)
		case 'c', 'i': // GLOBAL INST: two text lines
			if err = skipLine(b, &i, at, op); err == nil {
				err = skipLine(b, &i, at, op)
			}
		case 'U', 'C', 0x8c, 0x8a: // 1-byte length
			if err = need(1); err == nil {
				err = need(uint64(b[i-1]))
			}
		case 'T', 'B', 'X', 0x8b: // 4-byte length (BINSTRING and LONG4 signed)
			if err = need(4); err == nil {
				k := binary.LittleEndian.Uint32(b[i-4:])
				if (op == 'T' || op == 0x8b) && int32(k) < 0 {
					return at, &scanError{at, op, fmt.Errorf("negative length %d", int32(k))}
				}
				if op == 0x8b && k > maxLong4 {
					// The decoder takes time quadratic in the length.
					return at, &scanError{at, op, fmt.Errorf("an int of %d bytes", k)}
				}
				err = need(uint64(k))
			}
		case 0x8d, 0x8e, 0x96: // 8-byte length
			if err = need(8); err == nil {
				err = need(binary.LittleEndian.Uint64(b[i-8:]))
			}
		default:
			return at, &scanError{at, op, errUnknownOpcode}
		}
		if err != nil {
			return at, err
		}
	}
	return n, &scanError{n, 0, io.ErrUnexpectedEOF}
}

func skipLine(b []byte, i *int, at int, op byte) error {
	for j := *i; j < len(b); j++ {
		if b[j] == '\n' {
			*i = j + 1
			return nil
		}
	}
	return &scanError{at, op, io.ErrUnexpectedEOF}
}

var errUnknownOpcode = fmt.Errorf("unknown opcode")

// maxLong4 is the longest LONG4 integer, in bytes, that scanPickle lets
// through. Python writes LONG4 only for ints of more than 255 bytes, which
// no snapshot holds.
const maxLong4 = 1024

// scanError is a problem found by scanPickle at byte Offset of the pickle.
type scanError struct {
	Offset int
	Op     byte
	Err    error
}

func (e *scanError) Error() string {
	if e.Err == io.ErrUnexpectedEOF {
		return e.Err.Error()
	}
	return fmt.Sprintf("opcode %#02x: %v", e.Op, e.Err)
}

func (e *scanError) Unwrap() error { return e.Err }

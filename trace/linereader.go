package trace

import (
	"bytes"
	"fmt"
	"io"
)

// MaxLineBytes is the longest line, without its newline, that a
// LineReader passes: 16 MiB, where the longest line of the real traces of
// the text formats (a text-form header of a JAX trace) is 18 KB. A parser
// holds a line whole (bufio.Scanner, encoding/csv), so that without a
// bound a file of one line without a newline would be held whole.
const MaxLineBytes = 16 << 20

// LineReader reads a text file (the text form, an RMM log, a MiniMalloc
// CSV, a CuPy log) for a parser that cannot tell a file cut short from a
// whole one and holds a line whole: it refuses a NUL byte, which no text
// file holds, and a line longer than MaxLineBytes, with a *SyntaxError
// naming the line and byte offset, and Complete says whether the file
// ended with a whole line.
type LineReader struct {
	r     io.Reader
	name  string
	off   int64 // bytes read
	lines int   // newlines read
	col   int   // bytes read since the last newline
	last  byte  // the last byte read
	err   error // the *SyntaxError returned, once
}

// NewLineReader returns a LineReader over r; name is the file's, for errors.
func NewLineReader(r io.Reader, name string) *LineReader {
	return &LineReader{r: r, name: name}
}

// Read reads from the underlying reader; a NUL byte or a line longer than
// MaxLineBytes ends the data with a *SyntaxError.
func (l *LineReader) Read(p []byte) (int, error) {
	n, err := l.r.Read(p)
	nul := bytes.IndexByte(p[:n], 0)
	if nul >= 0 {
		n = nul
	}
	// The lines of p[:n], the first continuing the line read before.
	for k, col := 0, l.col; k < n; {
		seg := bytes.IndexByte(p[k:n], '\n')
		if seg < 0 {
			seg = n - k
		}
		if col+seg > MaxLineBytes {
			cut := k + MaxLineBytes - col
			l.count(p[:cut])
			return cut, l.fail(&SyntaxError{File: l.name, Line: l.lines + 1, Msg: fmt.Sprintf("a line longer than %d bytes (the limit) at byte offset %d: no text trace has one", MaxLineBytes, l.off)})
		}
		k, col = k+seg+1, 0
	}
	l.count(p[:n])
	if nul >= 0 {
		return n, l.fail(&SyntaxError{File: l.name, Line: l.lines + 1, Msg: fmt.Sprintf("a NUL byte at byte offset %d: binary data, not text", l.off)})
	}
	return n, err
}

func (l *LineReader) fail(err *SyntaxError) error {
	l.err = err
	return err
}

// Err returns the *SyntaxError that Read returned (a NUL byte, an overlong
// line), nil if none: a parser that holds the line cut short by it asks,
// so as to report it rather than the cut line.
func (l *LineReader) Err() error {
	if l.err == nil {
		return nil
	}
	return l.err
}

func (l *LineReader) count(b []byte) {
	if len(b) == 0 {
		return
	}
	l.off += int64(len(b))
	if nl := bytes.LastIndexByte(b, '\n'); nl >= 0 {
		l.lines += bytes.Count(b, []byte{'\n'})
		l.col = len(b) - nl - 1
	} else {
		l.col += len(b)
	}
	l.last = b[len(b)-1]
}

// Complete returns a *SyntaxError when the data read so far is not empty
// and does not end with a newline: a file cut inside its last line reads
// as a whole one without it (a number cut short is still a number).
func (l *LineReader) Complete() error {
	if l.off == 0 || l.last == '\n' {
		return nil
	}
	return &SyntaxError{File: l.name, Line: l.lines + 1, Msg: fmt.Sprintf("the last line has no newline: the file ends inside it at byte offset %d (cut short?)", l.off)}
}

package trace

import (
	"bytes"
	"fmt"
	"io"
)

// LineReader reads a text file (the text form, an RMM log, a MiniMalloc
// CSV) for a parser that cannot tell a file cut short from a whole one: it
// refuses a NUL byte, which no text file holds, with a *SyntaxError naming
// its line and byte offset, and Complete says whether the file ended with
// a whole line.
type LineReader struct {
	r     io.Reader
	name  string
	off   int64 // bytes read
	lines int   // newlines read
	last  byte  // the last byte read
}

// NewLineReader returns a LineReader over r; name is the file's, for errors.
func NewLineReader(r io.Reader, name string) *LineReader {
	return &LineReader{r: r, name: name}
}

// Read reads from the underlying reader; a NUL byte ends the data with a
// *SyntaxError.
func (l *LineReader) Read(p []byte) (int, error) {
	n, err := l.r.Read(p)
	if i := bytes.IndexByte(p[:n], 0); i >= 0 {
		l.count(p[:i])
		return i, &SyntaxError{File: l.name, Line: l.lines + 1, Msg: fmt.Sprintf("a NUL byte at byte offset %d: binary data, not text", l.off)}
	}
	l.count(p[:n])
	return n, err
}

func (l *LineReader) count(b []byte) {
	if len(b) == 0 {
		return
	}
	l.off += int64(len(b))
	l.lines += bytes.Count(b, []byte{'\n'})
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

package kineto

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
)

// The limits of the JSON reader, far above what Kineto writes, so that a
// file cannot make the reader hold more than its memory events: the
// longest string and the deepest nesting of the real traces of
// testdata/profiler are 5,050 bytes (a call stack) and 6 levels.
const (
	// MaxString is the longest JSON string (its bytes between the
	// quotes, escapes as written) or number that Import reads: 16 MiB.
	MaxString = 16 << 20
	// MaxDepth is the deepest nesting of arrays and objects that Import
	// reads, the trace's own object counting as one: 1000.
	MaxDepth = 1000
	// maxKept bounds the bytes kept of a value that Import reads (an
	// event's name, ts, tid and args fields, baseTimeNanoseconds): a
	// longer one is no such field, and is refused (or, for tid, read as
	// unknown) without being held.
	maxKept = 4 << 10
	// maxMeta bounds the bytes kept of a member of the top-level object
	// copied to Metadata (trace_id, ...): a longer one is left out.
	maxMeta = 64 << 10
	// maxProps bounds the bytes kept of deviceProperties, informative
	// only: a longer one is left out.
	maxProps = 1 << 20
)

// capture keeps the raw bytes of a value as it is read, up to limit; a nil
// capture keeps nothing.
type capture struct {
	b     []byte
	limit int
	cut   bool // the value was longer than limit
}

func (c *capture) add(p []byte) {
	if c == nil || c.cut && len(p) > 0 {
		return
	}
	if room := c.limit - len(c.b); len(p) > room {
		p, c.cut = p[:room], true
	}
	c.b = append(c.b, p...)
}

func (c *capture) reset(limit int) { c.b, c.limit, c.cut = c.b[:0], limit, false }

// fill reads more input into the buffer when it is used up, and reports
// whether there is a byte to read.
func (d *decoder) fill() bool {
	if d.pos < d.end {
		return true
	}
	if d.rerr != nil {
		return false
	}
	d.base += int64(d.end)
	d.pos, d.end = 0, 0
	for d.end == 0 && d.rerr == nil {
		d.end, d.rerr = d.r.Read(d.buf)
	}
	return d.end > 0
}

// off returns the byte offset of the next byte of the JSON.
func (d *decoder) off() int64 { return d.base + int64(d.pos) }

// inputError is the error for the end of the input inside a value: a
// truncated trace, a damaged gzip stream, or a read error.
func (d *decoder) inputError() error {
	switch {
	case d.rerr == io.EOF:
		return fmt.Errorf("%s: truncated trace at %s: %w", d.name, d.where(d.off()), io.ErrUnexpectedEOF)
	case d.compressed:
		return gzipError(d.name, d.off(), d.rerr)
	}
	return fmt.Errorf("%s: at %s: %v", d.name, d.where(d.off()), d.rerr)
}

// syntax is the error for the byte c at the reader's offset, found where
// context says (encoding/json's words).
func (d *decoder) syntax(c byte, context string) error {
	return fmt.Errorf("%s: bad JSON at %s: invalid character %s %s", d.name, d.where(d.off()), quoteChar(c), context)
}

// quoteChar quotes a byte as encoding/json's errors do.
func quoteChar(c byte) string {
	switch c {
	case '\'':
		return `'\''`
	case '"':
		return `'"'`
	}
	s := strconv.Quote(string(rune(c)))
	return "'" + s[1:len(s)-1] + "'"
}

// limitError is the error for a value over one of the reader's limits,
// which starts at byte off.
func (d *decoder) limitError(off int64, format string, args ...any) error {
	return fmt.Errorf("%s: %w: %s at %s", d.name, ErrLimit, fmt.Sprintf(format, args...), d.where(off))
}

// space skips white space, kept in c, and returns the next byte, which is
// not read; at the end of the input it returns ok false.
func (d *decoder) space(c *capture) (b byte, ok bool) {
	for d.fill() {
		i := d.pos
		for i < d.end {
			switch d.buf[i] {
			case ' ', '\t', '\n', '\r':
				i++
				continue
			}
			break
		}
		c.add(d.buf[d.pos:i])
		d.pos = i
		if i < d.end {
			return d.buf[i], true
		}
	}
	return 0, false
}

// next returns the next byte past white space (kept in c), not read; the
// end of the input there is an error.
func (d *decoder) next(c *capture) (byte, error) {
	b, ok := d.space(c)
	if !ok {
		return 0, d.inputError()
	}
	return b, nil
}

// take reads the byte at the offset, kept in c.
func (d *decoder) take(c *capture) {
	c.add(d.buf[d.pos : d.pos+1])
	d.pos++
}

// expect reads the next byte past white space, which must be want; else
// the error says it was found where context says.
func (d *decoder) expect(c *capture, want byte, context string) error {
	b, err := d.next(c)
	if err != nil {
		return err
	}
	if b != want {
		return d.syntax(b, context)
	}
	d.take(c)
	return nil
}

// push enters an array or an object whose first byte open is at the
// offset, read.
func (d *decoder) push(c *capture, open byte) error {
	if len(d.stack) >= MaxDepth {
		return d.limitError(d.off(), "arrays and objects nested deeper than %d", MaxDepth)
	}
	d.stack = append(d.stack, open)
	d.take(c)
	return nil
}

// kindAt names the kind of the value that starts with b, "" if none does.
func kindAt(b byte) string {
	switch {
	case b == '{':
		return "object"
	case b == '[':
		return "array"
	case b == '"':
		return "string"
	case b == '-' || b >= '0' && b <= '9':
		return "number"
	case b == 't' || b == 'f':
		return "boolean"
	case b == 'n':
		return "null"
	}
	return ""
}

// str reads a string, from its opening quote at the offset, kept in c.
func (d *decoder) str(c *capture) error {
	start := d.off()
	d.take(c)
	n := 0
	for {
		if !d.fill() {
			return d.inputError()
		}
		i := d.pos
		for i < d.end {
			b := d.buf[i]
			if b == '"' || b == '\\' || b < 0x20 {
				break
			}
			i++
		}
		n += i - d.pos
		c.add(d.buf[d.pos:i])
		d.pos = i
		if n > MaxString {
			return d.limitError(start, "a string longer than %d bytes", MaxString)
		}
		if i == d.end {
			continue
		}
		switch b := d.buf[i]; {
		case b == '"':
			d.take(c)
			return nil
		case b < 0x20:
			return d.syntax(b, "in string literal")
		}
		// An escape.
		d.take(c)
		n++
		if !d.fill() {
			return d.inputError()
		}
		switch b := d.buf[d.pos]; b {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			d.take(c)
			n++
		case 'u':
			d.take(c)
			n++
			for k := 0; k < 4; k++ {
				if !d.fill() {
					return d.inputError()
				}
				h := d.buf[d.pos]
				if !(h >= '0' && h <= '9' || h >= 'a' && h <= 'f' || h >= 'A' && h <= 'F') {
					return d.syntax(h, "in \\u hexadecimal character escape")
				}
				d.take(c)
				n++
			}
		default:
			return d.syntax(b, "in string escape code")
		}
	}
}

// digits reads decimal digits, kept in c, counting them into *n, and
// returns how many it read; the end of the input ends them.
func (d *decoder) digits(c *capture, n *int) int {
	k := 0
	for d.fill() {
		i := d.pos
		for i < d.end && d.buf[i] >= '0' && d.buf[i] <= '9' {
			i++
		}
		k += i - d.pos
		c.add(d.buf[d.pos:i])
		d.pos = i
		if i < d.end || *n+k > MaxString {
			break
		}
	}
	*n += k
	return k
}

// number reads a number, from its first byte at the offset, kept in c.
// The byte after it is left to the caller, which tells a number cut by the
// end of the input in an array or object from one at the end of the file.
func (d *decoder) number(c *capture) error {
	start := d.off()
	n := 0
	// need reads at least one digit, found where context says.
	need := func(context string) error {
		if !d.fill() {
			return d.inputError()
		}
		if b := d.buf[d.pos]; b < '0' || b > '9' {
			return d.syntax(b, context)
		}
		d.digits(c, &n)
		return nil
	}
	if d.buf[d.pos] == '-' {
		d.take(c)
		n++
		if !d.fill() {
			return d.inputError()
		}
		if d.buf[d.pos] == '0' {
			d.take(c)
			n++
		} else if err := need("in numeric literal"); err != nil {
			return err
		}
	} else if d.buf[d.pos] == '0' {
		d.take(c)
		n++
	} else {
		d.digits(c, &n)
	}
	if n > MaxString {
		return d.limitError(start, "a number longer than %d bytes", MaxString)
	}
	if d.fill() && d.buf[d.pos] == '.' {
		d.take(c)
		n++
		if err := need("after decimal point in numeric literal"); err != nil {
			return err
		}
	}
	if d.fill() && (d.buf[d.pos] == 'e' || d.buf[d.pos] == 'E') {
		d.take(c)
		n++
		if d.fill() && (d.buf[d.pos] == '+' || d.buf[d.pos] == '-') {
			d.take(c)
			n++
		}
		if err := need("in exponent of numeric literal"); err != nil {
			return err
		}
	}
	if n > MaxString {
		return d.limitError(start, "a number longer than %d bytes", MaxString)
	}
	return nil
}

// literal reads true, false or null, from its first byte at the offset,
// kept in c.
func (d *decoder) literal(c *capture) error {
	var word string
	switch d.buf[d.pos] {
	case 't':
		word = "true"
	case 'f':
		word = "false"
	default:
		word = "null"
	}
	d.take(c)
	for k := 1; k < len(word); k++ {
		if !d.fill() {
			return d.inputError()
		}
		if b := d.buf[d.pos]; b != word[k] {
			return d.syntax(b, fmt.Sprintf("in literal %s (expecting %s)", word, quoteChar(word[k])))
		}
		d.take(c)
	}
	return nil
}

// value reads one value of any kind and size, from the next byte past
// white space, kept in c (from its first byte) up to c's limit, checked
// as encoding/json would and held nowhere else: its strings and numbers
// at most MaxString long, its nesting, with the arrays and objects it is
// in, at most MaxDepth deep.
func (d *decoder) value(c *capture) error {
	if _, err := d.next(nil); err != nil {
		return err
	}
	depth := len(d.stack)
	for {
		// A value starts here.
		b, err := d.next(c)
		if err != nil {
			return err
		}
		switch {
		case b == '{':
			if err := d.push(c, b); err != nil {
				return err
			}
			if b, err = d.next(c); err != nil {
				return err
			}
			if b != '}' {
				if err := d.key(c); err != nil {
					return err
				}
				continue
			}
		case b == '[':
			if err := d.push(c, b); err != nil {
				return err
			}
			if b, err = d.next(c); err != nil {
				return err
			}
			if b != ']' {
				continue
			}
		case b == '"':
			if err := d.str(c); err != nil {
				return err
			}
		case b == '-' || b >= '0' && b <= '9':
			if err := d.number(c); err != nil {
				return err
			}
		case b == 't' || b == 'f' || b == 'n':
			if err := d.literal(c); err != nil {
				return err
			}
		default:
			return d.syntax(b, "looking for beginning of value")
		}
		// A value ended (or an empty array or object is next, to be
		// closed): close the arrays and objects that end here.
		for {
			if len(d.stack) == depth {
				return nil
			}
			b, err := d.next(c)
			if err != nil {
				return err
			}
			top := d.stack[len(d.stack)-1]
			if b == ',' {
				d.take(c)
				if top == '{' {
					if _, err = d.next(c); err != nil {
						return err
					}
					if err := d.key(c); err != nil {
						return err
					}
				}
				break
			}
			if top == '{' && b == '}' || top == '[' && b == ']' {
				d.take(c)
				d.stack = d.stack[:len(d.stack)-1]
				continue
			}
			if top == '{' {
				return d.syntax(b, "after object key:value pair")
			}
			return d.syntax(b, "after array element")
		}
	}
}

// key reads an object's key and the colon after it, kept in c, from the
// key's first byte at the offset.
func (d *decoder) key(c *capture) error {
	if d.buf[d.pos] != '"' {
		return d.syntax(d.buf[d.pos], "looking for beginning of object key string")
	}
	if err := d.str(c); err != nil {
		return err
	}
	return d.expect(c, ':', "after object key")
}

// members reads the members of an object whose '{' is next, calling f with
// each key (its bytes between the quotes, escapes undone, valid until the
// next call; nil for a key longer than maxKept) and the reader before the
// value, which f reads.
func (d *decoder) members(f func(key []byte) error) error {
	if empty, err := d.open('{', '}'); empty || err != nil {
		return err
	}
	for {
		if d.buf[d.pos] != '"' {
			return d.syntax(d.buf[d.pos], "looking for beginning of object key string")
		}
		// A key longer than maxKept is none that Import reads.
		d.keyBuf.reset(maxKept)
		if err := d.str(&d.keyBuf); err != nil {
			return err
		}
		if err := d.expect(nil, ':', "after object key"); err != nil {
			return err
		}
		var key []byte
		if !d.keyBuf.cut {
			var err error
			if key, err = unquote(d.keyBuf.b); err != nil {
				return err
			}
		}
		if err := f(key); err != nil {
			return err
		}
		if end, err := d.after('}', "after object key:value pair"); end || err != nil {
			return err
		}
	}
}

// elements reads the elements of an array whose '[' is next, calling f
// with the reader before each element, which f reads.
func (d *decoder) elements(f func() error) error {
	if empty, err := d.open('[', ']'); empty || err != nil {
		return err
	}
	for {
		if err := f(); err != nil {
			return err
		}
		if end, err := d.after(']', "after array element"); end || err != nil {
			return err
		}
	}
}

// open reads the opener of an object or array ('{' or '[', next), and
// reports whether closer follows at once (an empty one, read whole).
func (d *decoder) open(opener, closer byte) (empty bool, err error) {
	if _, err := d.next(nil); err != nil {
		return false, err
	}
	if err := d.push(nil, opener); err != nil {
		return false, err
	}
	b, err := d.next(nil)
	if err != nil {
		return false, err
	}
	if b != closer {
		return false, nil
	}
	d.take(nil)
	d.stack = d.stack[:len(d.stack)-1]
	return true, nil
}

// after reads what follows a member or element: a ',' and the next
// byte (more follow), or closer, which ends the object or array (end
// true); anything else is a syntax error, what saying where.
func (d *decoder) after(closer byte, what string) (end bool, err error) {
	b, err := d.next(nil)
	if err != nil {
		return false, err
	}
	switch b {
	case ',':
		d.take(nil)
		_, err := d.next(nil)
		return false, err
	case closer:
		d.take(nil)
		d.stack = d.stack[:len(d.stack)-1]
		return true, nil
	}
	return false, d.syntax(b, what)
}

// unquote returns the text of a JSON string read whole (with its quotes):
// its bytes between the quotes, escapes undone.
func unquote(raw []byte) ([]byte, error) {
	s := raw[1 : len(raw)-1]
	if bytes.IndexByte(s, '\\') < 0 {
		return s, nil
	}
	var u string
	if err := json.Unmarshal(raw, &u); err != nil {
		return nil, err
	}
	return []byte(u), nil
}

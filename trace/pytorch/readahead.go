package pytorch

import "io"

// readahead reads r in a goroutine of its own, a few buffers ahead of its
// reader, so that decompressing a gzip snapshot (a tenth of the import of
// kv_decode) runs beside the decoding of the pickle, on a second core. It
// gives r's bytes and then r's error (io.EOF at the end) as r gave them.
// close stops the goroutine; after it, Read must not be called.
type readahead struct {
	full chan aheadBuf // buffers read, then the one that carries r's error
	free chan []byte   // buffers read out, to fill again
	stop chan struct{}
	cur  []byte // the rest of the buffer being read out
	buf  []byte // its whole
	err  error
}

type aheadBuf struct {
	b   []byte
	err error
}

const (
	aheadBufs = 4
	aheadSize = 256 << 10
)

func newReadahead(r io.Reader) *readahead {
	ra := &readahead{
		full: make(chan aheadBuf, aheadBufs),
		free: make(chan []byte, aheadBufs),
		stop: make(chan struct{}),
	}
	for range aheadBufs {
		ra.free <- make([]byte, aheadSize)
	}
	go ra.fill(r)
	return ra
}

// fill reads r into free buffers until r fails or ends, or close.
func (ra *readahead) fill(r io.Reader) {
	for {
		var b []byte
		select {
		case b = <-ra.free:
		case <-ra.stop:
			return
		}
		n := 0
		var err error
		for n < len(b) && err == nil {
			var k int
			k, err = r.Read(b[n:])
			n += k
		}
		select {
		case ra.full <- aheadBuf{b[:n], err}:
		case <-ra.stop:
			return
		}
		if err != nil {
			return
		}
	}
}

func (ra *readahead) Read(p []byte) (int, error) {
	for len(ra.cur) == 0 {
		if ra.err != nil {
			return 0, ra.err
		}
		if ra.buf != nil {
			ra.free <- ra.buf[:cap(ra.buf)]
			ra.buf = nil
		}
		f := <-ra.full
		ra.buf, ra.cur, ra.err = f.b, f.b, f.err
	}
	n := copy(p, ra.cur)
	ra.cur = ra.cur[n:]
	return n, nil
}

// close stops the goroutine (it may end only after a Read of r under way).
func (ra *readahead) close() {
	select {
	case <-ra.stop:
	default:
		close(ra.stop)
	}
}

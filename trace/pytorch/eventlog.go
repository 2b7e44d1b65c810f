package pytorch

import (
	"encoding/binary"
	"errors"

	"github.com/gpualloc/allocsim/trace"
)

// eventLog keeps the events of Import's first reading in a compact form, so
// that the Source gives them without reading the snapshot a second time
// (which took as long as the first: half of the import of kv_decode).
//
// An event takes one record of 4 bytes or more (6.3 on average on
// kv_decode, whose 723037 events take 4.5 MB where trace.Event's 72 bytes
// would take 52 MB):
//
//	flags   1 byte: the op (bits 0-4); bit 5: the stream differs from
//	        the last event's and follows; bit 6: a second flags byte
//	        follows; bit 7: the time delta is in nanoseconds (else in
//	        microseconds, as PyTorch records times)
//	more    1 byte, with bit 6: bit 0 label, 1 stack, 2 kind, 3 thread,
//	        4 pool, 5 restore: the fields that follow
//	time    the difference from the last event's Time, zigzag varint
//	addr    the difference from the last event's Addr, zigzag varint
//	size    uvarint
//	stream  uvarint, with bit 5
//	label   uvarint index into labels
//	stack, kind, thread, pool: uvarint each
//
// in chunks of logChunk bytes, none of which a record straddles, so that
// the log never copies itself as it grows. A log that would go over
// maxLog bytes is let go (over), and the Source reads the snapshot again
// as before: memory stays bounded whatever the file.
type eventLog struct {
	chunks [][]byte
	n      int64 // events appended
	size   int64 // bytes in chunks
	max    int64
	over   bool
	labels []string

	// The last event appended (or read), which the next's deltas are from.
	prevT      int64
	prevA      uint64
	prevStream uint64

	// Reading: the chunk and the offset in it of the next record.
	ci, off int
}

const (
	logChunk = 64 << 10
	// logRecordMax bounds a record: two flag bytes and eight varints.
	logRecordMax = 2 + 8*binary.MaxVarintLen64
	// maxLog bounds a log: about 10 million events of a snapshot like
	// kv_decode, whose pickle would be about 500 MB.
	maxLog = 64 << 20

	logStreamBit = 1 << 5
	logMoreBit   = 1 << 6
	logNanosBit  = 1 << 7
	logOpMask    = 1<<5 - 1
)

func init() {
	if trace.OpPoolRelease > logOpMask {
		panic("pytorch: eventLog's op bits are too few")
	}
}

func newEventLog(max int64) *eventLog { return &eventLog{max: max} }

func zigzag(x int64) uint64 { return uint64(x<<1) ^ uint64(x>>63) }

func unzigzag(u uint64) int64 { return int64(u>>1) ^ -int64(u&1) }

// append adds ev, unless the log is over its bound (then it lets go of
// what it holds).
func (l *eventLog) append(ev *trace.Event) {
	if l.over {
		return
	}
	var cur []byte
	if k := len(l.chunks); k > 0 && cap(l.chunks[k-1])-len(l.chunks[k-1]) >= logRecordMax {
		cur = l.chunks[k-1]
	} else {
		if l.size+logChunk > l.max {
			l.over, l.chunks = true, nil
			return
		}
		cur = make([]byte, 0, logChunk)
		l.chunks = append(l.chunks, cur)
		l.size += logChunk
	}
	flags := byte(ev.Op)
	var more byte
	if ev.Stream != l.prevStream {
		flags |= logStreamBit
	}
	if ev.Label != "" {
		more |= 1 << 0
	}
	if ev.Stack != 0 {
		more |= 1 << 1
	}
	if ev.Kind != 0 {
		more |= 1 << 2
	}
	if ev.Thread != 0 {
		more |= 1 << 3
	}
	if ev.Pool != 0 {
		more |= 1 << 4
	}
	if ev.Restore {
		more |= 1 << 5
	}
	if more != 0 {
		flags |= logMoreBit
	}
	dt := ev.Time - l.prevT
	if dt%1000 != 0 {
		flags |= logNanosBit
	} else {
		dt /= 1000
	}
	cur = append(cur, flags)
	if more != 0 {
		cur = append(cur, more)
	}
	cur = binary.AppendUvarint(cur, zigzag(dt))
	cur = binary.AppendUvarint(cur, zigzag(int64(ev.Addr-l.prevA)))
	cur = binary.AppendUvarint(cur, ev.Size)
	if flags&logStreamBit != 0 {
		cur = binary.AppendUvarint(cur, ev.Stream)
	}
	if more&(1<<0) != 0 {
		cur = binary.AppendUvarint(cur, uint64(l.label(ev.Label)))
	}
	if more&(1<<1) != 0 {
		cur = binary.AppendUvarint(cur, uint64(ev.Stack))
	}
	if more&(1<<2) != 0 {
		cur = binary.AppendUvarint(cur, uint64(ev.Kind))
	}
	if more&(1<<3) != 0 {
		cur = binary.AppendUvarint(cur, ev.Thread)
	}
	if more&(1<<4) != 0 {
		cur = binary.AppendUvarint(cur, uint64(ev.Pool))
	}
	l.chunks[len(l.chunks)-1] = cur
	l.prevT, l.prevA, l.prevStream = ev.Time, ev.Addr, ev.Stream
	l.n++
}

// label returns the index of s in l.labels, adding it if new (a snapshot
// has two: "snapshot" and trace.ReleaseByEmptyCache).
func (l *eventLog) label(s string) int {
	for i, x := range l.labels {
		if x == s {
			return i
		}
	}
	l.labels = append(l.labels, s)
	return len(l.labels) - 1
}

// rewind makes next give the events from the first.
func (l *eventLog) rewind() {
	l.ci, l.off = 0, 0
	l.prevT, l.prevA, l.prevStream = 0, 0, 0
}

var errLogEnd = errors.New("end of the event log")

// next decodes the next event into ev; errLogEnd after the last. The log
// holds only what append wrote, so any other error is a bug.
func (l *eventLog) next(ev *trace.Event) error {
	for l.ci < len(l.chunks) && l.off >= len(l.chunks[l.ci]) {
		l.ci, l.off = l.ci+1, 0
	}
	if l.ci >= len(l.chunks) {
		return errLogEnd
	}
	b := l.chunks[l.ci][l.off:]
	i := 0
	bad := false
	uv := func() uint64 {
		x, n := binary.Uvarint(b[i:])
		if n <= 0 {
			bad = true
			return 0
		}
		i += n
		return x
	}
	flags := b[i]
	i++
	var more byte
	if flags&logMoreBit != 0 {
		more = b[i]
		i++
	}
	*ev = trace.Event{Op: trace.Op(flags & logOpMask), Stream: l.prevStream}
	dt := unzigzag(uv())
	if flags&logNanosBit == 0 {
		dt *= 1000
	}
	ev.Time = l.prevT + dt
	ev.Addr = l.prevA + uint64(unzigzag(uv()))
	ev.Size = uv()
	if flags&logStreamBit != 0 {
		ev.Stream = uv()
	}
	if more&(1<<0) != 0 {
		k := uv()
		if k >= uint64(len(l.labels)) {
			bad = true
		} else {
			ev.Label = l.labels[k]
		}
	}
	if more&(1<<1) != 0 {
		ev.Stack = uint32(uv())
	}
	if more&(1<<2) != 0 {
		ev.Kind = trace.Kind(uv())
	}
	if more&(1<<3) != 0 {
		ev.Thread = uv()
	}
	if more&(1<<4) != 0 {
		ev.Pool = uint32(uv())
	}
	ev.Restore = more&(1<<5) != 0
	if bad {
		return errors.New("a corrupt record in the event log")
	}
	l.off += i
	l.prevT, l.prevA, l.prevStream = ev.Time, ev.Addr, ev.Stream
	return nil
}

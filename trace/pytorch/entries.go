package pytorch

import (
	"errors"
	"fmt"
)

// This file converts what the decoder (stream.go) keeps of the snapshot
// into the fields of a trace entry, a segment and a block: the values of
// their dicts by key, and the integers of those values.

// entryFields are the fields of a trace entry that Import reads.
type entryFields struct {
	action, addr, size, stream, timeUS value
	frames                             value
}

// sink receives the entries of the device trace, in order, as the decoder
// converts them. index counts from 0.
type sink interface {
	entry(d *decoder, index int64, f *entryFields) error
}

// entry converts the entry v of the device trace for the sink.
func (d *decoder) entry(v value) error {
	index := d.entries
	d.entries++
	if d.entryErr != nil {
		d.release(v)
		return nil
	}
	f := &d.fields1
	*f = entryFields{}
	err := d.fields(v, f)
	d.release(v)
	if err == nil && d.sink != nil {
		err = d.sink.entry(d, index, f)
	}
	if err != nil {
		d.entryErr = &entryError{index, err}
	}
	return nil
}

// entryError is an error in device trace entry Index.
type entryError struct {
	Index int64
	Err   error
}

func (e *entryError) Error() string { return fmt.Sprintf("entry %d: %v", e.Index, e.Err) }
func (e *entryError) Unwrap() error { return e.Err }

// fields reads the fields of the trace entry v into f.
func (d *decoder) fields(v value, f *entryFields) error {
	c := d.container(v)
	if c == nil || c.kind != pyDict {
		if v.k == vSkip && pyKind(v.n) == pyDict || v.k == vCont && c == nil {
			return errors.New("is a dict repeated through the pickle memo, which this importer does not follow")
		}
		return fmt.Errorf("is a %s, want a dict", d.pyType(v))
	}
	for i := 0; i+1 < len(c.items); i += 2 {
		key := c.items[i]
		if key.k != vStr {
			continue
		}
		switch key.n {
		case sAction:
			f.action = c.items[i+1]
		case sAddr:
			f.addr = c.items[i+1]
		case sSize:
			f.size = c.items[i+1]
		case sStream:
			f.stream = c.items[i+1]
		case sTimeUS:
			f.timeUS = c.items[i+1]
		case sFrames:
			f.frames = c.items[i+1]
		}
	}
	return nil
}

// segment converts the segment dict v.
func (d *decoder) segment(v value) snapSegment {
	s := snapSegment{device: -1}
	c := d.container(v)
	if c == nil || c.kind != pyDict {
		s.bad = "a segment that is a " + d.pyType(v)
		return s
	}
	var haveAddr, haveSize bool
	for i := 0; i+1 < len(c.items); i += 2 {
		key, val := c.items[i], c.items[i+1]
		if key.k != vStr {
			continue
		}
		switch key.n {
		case sAddress:
			s.addr, haveAddr = d.uintOf(val)
		case sTotalSize:
			s.size, haveSize = d.uintOf(val)
		case sStream:
			if x, err := d.toStream(val); err == nil {
				s.stream = x
			}
		case sFrames:
			d.stackOf(val) // read, and its list let go
		case sSegmentType:
			s.small = val.k == vStr && val.n == sSmall
		case sIsExpandable:
			s.expandable = val.k == vBool && val.n == 1
		case sDevice:
			if val.k == vInt {
				s.device = val.n
			}
		case sSegmentPoolID:
			s.havePool = true
			pc := d.container(val)
			ok := pc != nil && pc.kind == pyTuple && len(pc.items) == 2
			if ok {
				var ok0, ok1 bool
				s.pool[0], ok0 = d.uintOf(pc.items[0])
				s.pool[1], ok1 = d.uintOf(pc.items[1])
				ok = ok0 && ok1
			}
			if !ok {
				s.badPool = "is a " + d.pyType(val) + ", want a tuple of two non-negative ints"
			}
		case sBlocks:
			bc := d.container(val)
			if bc == nil || bc.role != roleBlocks && bc.role != roleKeep {
				s.bad = "blocks that are not a list"
				continue
			}
			if bc.role == roleKeep {
				for _, b := range bc.items {
					s.blocks = append(s.blocks, d.block(b))
				}
			} else {
				s.blocks = append([]snapBlock(nil), bc.blks...)
			}
			d.release(val)
		}
	}
	if !haveAddr || !haveSize {
		s.bad = "a segment without address or total_size"
	}
	return s
}

// block converts the block dict v.
func (d *decoder) block(v value) snapBlock {
	var b snapBlock
	c := d.container(v)
	if c == nil || c.kind != pyDict {
		return b
	}
	for i := 0; i+1 < len(c.items); i += 2 {
		key, val := c.items[i], c.items[i+1]
		if key.k != vStr {
			continue
		}
		switch key.n {
		case sAddress:
			b.addr, b.haveAddr = d.uintOf(val)
		case sSize:
			b.size, _ = d.uintOf(val)
		case sRequestedSize:
			b.requested, _ = d.uintOf(val)
		case sFrames:
			if id, _ := d.stackOf(val); d.blockFrames {
				b.stack = d.kept(id)
			}
		case sState:
			switch {
			case val.k != vStr:
			case val.n == sActiveAllocated:
				b.state = blockAllocated
			case val.n == sActivePendingFree:
				b.state = blockPendingFree
			case d.strs[val.n] == "inactive":
				b.state = blockInactive
			}
		}
	}
	return b
}

func (d *decoder) uintOf(v value) (uint64, bool) {
	x, err := d.toUint64(v, "")
	return x, err == nil
}

// toUint64 converts a non-negative int to uint64.
func (d *decoder) toUint64(v value, field string) (uint64, error) {
	switch v.k {
	case vInt:
		if v.n < 0 {
			return 0, fmt.Errorf("%s %d is negative", field, v.n)
		}
		return uint64(v.n), nil
	case vUint:
		return uint64(v.n), nil
	case vBig:
		return 0, fmt.Errorf("%s %s does not fit in 64 bits unsigned", field, d.bigs[v.n])
	}
	return 0, fmt.Errorf("%s is a %s, want an int", field, d.pyType(v))
}

// toInt64 converts an int to int64.
func (d *decoder) toInt64(v value, field string) (int64, error) {
	switch v.k {
	case vInt:
		return v.n, nil
	case vUint:
		return 0, fmt.Errorf("%s %d does not fit in 64 bits signed", field, uint64(v.n))
	case vBig:
		return 0, fmt.Errorf("%s %s does not fit in 64 bits signed", field, d.bigs[v.n])
	}
	return 0, fmt.Errorf("%s is a %s, want an int", field, d.pyType(v))
}

// toStream converts a stream, which PyTorch writes as int64(cudaStream_t),
// back to its unsigned value.
func (d *decoder) toStream(v value) (uint64, error) {
	if v.k == vUint {
		return uint64(v.n), nil
	}
	n, err := d.toInt64(v, "stream")
	return uint64(n), err
}

package pytorch

// This file is the snapshot's schema as the decoder (stream.go) sees it:
// the roles a container takes from where it goes, the strings that name
// the snapshot's keys, the compact segments and blocks of its final state,
// and how the items of a list or dict are kept, converted or dropped by
// the role of the container they are added to.

// role says what a container becomes, and so what of it is kept.
type role uint8

const (
	roleKeep     role = iota + 1 // kept whole (allocator settings, odd shapes)
	roleRoot                     // the snapshot dict: three keys kept
	roleTraces                   // device_traces: only the item at the device kept
	roleEntries                  // the device's trace: items converted, not kept
	roleEntry                    // a trace entry: its five fields kept
	roleSegments                 // segments: items converted to snapSegment
	roleSegment                  // a segment: its fields kept
	roleBlocks                   // a segment's blocks: converted to snapBlock
	roleBlock                    // a block: its fields kept
	roleFrames                   // an entry's or a block's frames: items converted to frame ids
	roleFrame                    // a frame: its three fields kept
)

// String ids interned before decoding, so that roles and fields can be told
// by comparing ids.
const (
	sAction = iota
	sAddr
	sSize
	sStream
	sTimeUS
	numEntryKeys  // the entry fields are the ids below this
	sDeviceTraces = iota - 1
	sSegments
	sAllocatorSettings
	sAddress
	sTotalSize
	sSegmentType
	sIsExpandable
	sDevice
	sBlocks
	sRequestedSize
	sState
	sSmall
	sActiveAllocated
	sActivePendingFree
	sSegmentPoolID
	sFrames
	sFilename
	sLine
	sName
	// The actions, in actionOps order.
	sFirstAction
)

var knownStrings = []string{
	sAction: "action", sAddr: "addr", sSize: "size", sStream: "stream", sTimeUS: "time_us",
	sDeviceTraces: "device_traces", sSegments: "segments", sAllocatorSettings: "allocator_settings",
	sAddress: "address", sTotalSize: "total_size", sSegmentType: "segment_type",
	sIsExpandable: "is_expandable", sDevice: "device", sBlocks: "blocks",
	sRequestedSize: "requested_size", sState: "state", sSmall: "small",
	sActiveAllocated: "active_allocated", sActivePendingFree: "active_pending_free",
	sSegmentPoolID: "segment_pool_id",
	sFrames:        "frames", sFilename: "filename", sLine: "line", sName: "name",
}

// snapSegment is a segment of the snapshot's final state, as reconstruct
// needs it.
type snapSegment struct {
	device     int64 // -1 if not given
	addr, size uint64
	stream     uint64
	small      bool // segment_type "small"
	expandable bool
	// pool is the segment_pool_id: (0, 0) for the default pools, else a
	// private pool's (a CUDA graph's or a MemPool's).
	pool     [2]uint64
	havePool bool   // the segment has a segment_pool_id
	badPool  string // what is wrong with its segment_pool_id, "" if nothing
	blocks   []snapBlock
	bad      string // why the segment cannot be used, "" if it can
}

// snapBlock is a block of a snapSegment.
type snapBlock struct {
	addr, size, requested uint64
	haveAddr              bool
	state                 blockState
	stack                 uint32 // its frames' stack in the decoder's table, 0 if none
}

type blockState uint8

const (
	blockOther blockState = iota
	blockInactive
	blockAllocated
	blockPendingFree
)

// childRole returns the role of a container of kind k about to be pushed,
// or 0 to skip it, from the container it will be added to. Python's
// pickler leaves three shapes, which the stack alone cannot always tell
// apart: a batch (the container below the last mark, with the items so
// far above it), one item for a list (the list at the top of the stack),
// and one item for a dict (the dict below a key at the top). Each shape
// that fits gives a role; the most useful wins (a role of the snapshot's
// structure over keeping, keeping over skipping), which is right for
// every way Python writes a snapshot and never loses a value that
// matters.
func (d *decoder) childRole(k pyKind) role {
	n := len(d.stack)
	if n == 0 && len(d.marks) == 0 {
		if !d.rootMade && k == pyDict {
			d.rootMade = true
			return roleRoot
		}
		return roleKeep
	}
	m := d.topMark()
	best, found := role(0), false
	consider := func(r role) {
		if !found || roleRank(r) > roleRank(best) {
			best = r
		}
		found = true
	}
	if len(d.marks) > 0 && m > 0 {
		pk, pc := d.kindOf(d.stack[m-1])
		pending := n - m
		switch pk {
		case pyDict:
			if pending%2 == 1 && isScalar(d.stack[n-1]) {
				consider(d.roleFor(pc, 0, d.stack[n-1], k))
			} else if pending%2 == 0 && k == pyTuple {
				consider(d.keyRole(pc))
			}
		case pyList, pySet:
			pos := pending
			if pc != nil {
				pos += pc.n
			}
			consider(d.roleFor(pc, pos, value{}, k))
		}
	}
	if n > m {
		top := d.stack[n-1]
		if tk, tc := d.kindOf(top); tk == pyList || tk == pySet {
			pos := 0
			if tc != nil {
				pos = tc.n
			}
			consider(d.roleFor(tc, pos, value{}, k))
		} else if n-2 >= m && isScalar(top) {
			if pk, pc := d.kindOf(d.stack[n-2]); pk == pyDict {
				consider(d.roleFor(pc, 0, top, k))
			}
		}
	}
	if found {
		return best
	}
	// Some other shape: inside a tuple being built, or items for LIST or
	// DICT. Keep it if what encloses it is kept or structural, so that no
	// value that matters is lost. The marks looked at are the last
	// maxMarkWalk: more, each with a scalar below, made each container cost
	// a walk of all the marks (a snapshot has 7 marks at most; 4000 marks
	// and 1M empty lists took 23 s).
	for i := len(d.marks) - 1; i >= 0 && i >= len(d.marks)-maxMarkWalk; i-- {
		d.markSteps++
		mm := d.marks[i]
		if mm == 0 {
			break
		}
		below := d.stack[mm-1]
		if below.k == vSkip {
			return 0
		}
		if c := d.container(below); c != nil {
			switch c.role {
			case roleEntry, roleBlock:
				return 0
			}
			return roleKeep
		}
	}
	return roleKeep
}

// maxMarkWalk bounds the marks childRole looks through for a container's
// context.
const maxMarkWalk = 64

// roleRank orders roles by how much choosing them keeps.
func roleRank(r role) int {
	switch r {
	case 0:
		return 0
	case roleKeep:
		return 1
	}
	return 2
}

func isScalar(v value) bool {
	return v.k != vCont && v.k != vSkip && v.k != vFrame && v.k != vStack && v.k != vFrameBuild
}

// kindOf returns the Python kind of a container value (0 for any other
// value) and its container, nil if it is skipped.
func (d *decoder) kindOf(v value) (pyKind, *container) {
	switch v.k {
	case vSkip:
		return pyKind(v.n), nil
	case vCont:
		if c := d.container(v); c != nil {
			return c.kind, c
		}
	}
	return 0, nil
}

// keyRole is the role of a container used as a dict key (only a tuple can
// be one).
func (d *decoder) keyRole(c *container) role {
	if c != nil && c.role == roleKeep {
		return roleKeep
	}
	return 0
}

// roleFor is the role of a container of kind k that becomes item pos of
// list c, or the value of key in dict c.
func (d *decoder) roleFor(c *container, pos int, key value, k pyKind) role {
	if c == nil {
		return 0
	}
	switch c.role {
	case roleKeep:
		return roleKeep
	case roleRoot:
		if key.k != vStr {
			return 0
		}
		switch key.n {
		case sDeviceTraces:
			if k == pyList {
				return roleTraces
			}
		case sSegments:
			if k == pyList {
				return roleSegments
			}
		case sAllocatorSettings:
			return roleKeep
		default:
			return 0
		}
		return roleKeep // a wrong type, reported by Import
	case roleTraces:
		if pos == d.device && k == pyList {
			return roleEntries
		}
		if pos == d.device {
			return roleKeep
		}
		return 0
	case roleEntries:
		if k == pyDict {
			return roleEntry
		}
		return 0
	case roleSegments:
		if k == pyDict {
			return roleSegment
		}
		return 0
	case roleEntry:
		if d.seen != nil && key.k == vStr && key.n == sFrames && k == pyList {
			return roleFrames
		}
		return 0
	case roleBlock:
		if d.seen != nil && key.k == vStr && key.n == sFrames && k == pyList {
			return roleFrames
		}
		return 0
	case roleFrames:
		if k == pyDict {
			return roleFrame
		}
		return 0
	case roleSegment:
		if key.k == vStr && key.n == sBlocks && k == pyList {
			return roleBlocks
		}
		if d.seen != nil && key.k == vStr && key.n == sFrames && k == pyList {
			// The segment's own (its cudaMalloc's), read only for the
			// frames that later stacks refer to again.
			return roleFrames
		}
		if key.k == vStr && key.n == sSegmentPoolID && k == pyTuple {
			return roleKeep
		}
		return 0
	case roleBlocks:
		if k == pyDict {
			return roleBlock
		}
		return 0
	}
	return 0
}

// appendItems appends items to the list (or set) target.
func (d *decoder) appendItems(at int64, op byte, target value, items []value) error {
	if target.k == vSkip {
		if pyKind(target.n) == pyDict || pyKind(target.n) == pyTuple {
			return d.fail(at, op, "append to a %s", pyKindNames[target.n])
		}
		return nil
	}
	c := d.container(target)
	if c == nil || (c.kind != pyList && c.kind != pySet) {
		return d.fail(at, op, "append to a %s", d.pyType(target))
	}
	switch c.role {
	case roleEntries:
		for _, v := range items {
			if err := d.entry(v); err != nil {
				return err
			}
			c.n++
		}
		if d.pauseAfterAppend {
			d.paused = true
		}
		return nil
	case roleTraces:
		for _, v := range items {
			if c.n == d.device {
				c.dev = v
				d.devList = v
				if d.stopAtTraces {
					d.stopped = true
				}
			}
			c.n++
		}
		return nil
	case roleSegments:
		for _, v := range items {
			d.segments = append(d.segments, d.segment(v))
			d.release(v)
			c.n++
		}
		return nil
	case roleBlocks:
		for _, v := range items {
			c.blks = append(c.blks, d.block(v))
			d.release(v)
			c.n++
		}
		return nil
	case roleFrames:
		if c.n+len(items) > d.lim.frames {
			return d.over(at, int64(d.lim.frames), " frames", "a frames list of %d frames", c.n+len(items))
		}
		for _, v := range items {
			fid, err := d.frameOf(v)
			if err != nil {
				return d.fail(at, op, "%v", err)
			}
			c.fids = append(c.fids, fid)
			c.n++
		}
		for _, v := range items {
			d.release(v)
		}
		d.framesDone()
		return nil
	}
	c.items = append(c.items, items...)
	c.n += len(items)
	return nil
}

// setItems sets the keys and values in items (key, value, ...) in the dict
// target.
func (d *decoder) setItems(at int64, op byte, target value, items []value) error {
	if len(items)%2 != 0 {
		return d.fail(at, op, "odd number of items")
	}
	if target.k == vSkip {
		if pyKind(target.n) != pyDict {
			return d.fail(at, op, "set an item of a %s", pyKindNames[target.n])
		}
		return nil
	}
	if target.k == vFrameBuild {
		d.setFrame(target, items)
		return nil
	}
	c := d.container(target)
	if c == nil || c.kind != pyDict {
		return d.fail(at, op, "set an item of a %s", d.pyType(target))
	}
	for i := 0; i < len(items); i += 2 {
		key, val := items[i], items[i+1]
		c.n++
		keep := true
		switch c.role {
		case roleEntry:
			keep = key.k == vStr && (key.n < numEntryKeys || key.n == sFrames && isFrames(val))
		case roleRoot:
			keep = key.k == vStr && (key.n == sDeviceTraces || key.n == sSegments || key.n == sAllocatorSettings)
		case roleSegment:
			keep = key.k == vStr && (key.n == sAddress || key.n == sTotalSize || key.n == sStream || key.n == sSegmentType ||
				key.n == sIsExpandable || key.n == sDevice || key.n == sBlocks || key.n == sSegmentPoolID ||
				key.n == sFrames && isFrames(val))
		case roleBlock:
			keep = key.k == vStr && (key.n == sAddress || key.n == sSize || key.n == sRequestedSize || key.n == sState || key.n == sFrames && isFrames(val))
		}
		if !keep {
			continue
		}
		if key.n == sFrames && val.k == vCont {
			// Complete once set in its dict, and converted now, so that
			// a later reference through the memo (the next entry's, in
			// the same batch of entries) finds its stack.
			id, err := d.stackOf(val)
			if err != nil {
				return d.fail(at, op, "%v", err)
			}
			val = value{k: vStack, n: int64(id)}
		}
		if c.role == roleEntry && d.hasKey(c, key) {
			// Python never writes a key of a dict twice: two entries
			// run together by a damaged byte.
			return d.fail(at, op, "inconsistent snapshot: a trace entry has its key %q twice", knownStrings[key.n])
		}
		d.setKey(c, key, val)
	}
	return nil
}

// hasKey reports whether the dict c holds key among its first keys.
func (d *decoder) hasKey(c *container, key value) bool {
	if key.k == vStr && c.keys&keyBit(key) == 0 {
		return false
	}
	for j := 0; j < len(c.items) && j < 128; j += 2 {
		if c.items[j] == key {
			return true
		}
	}
	return false
}

// keyBit returns the bit of the string key in a container's keys.
func keyBit(key value) uint16 { return 1 << (key.n & 15) }

// setKey sets key to val in c, replacing an equal string key among the
// first ones (a dict's keys are unique; for long kept dicts of other keys
// the order of insertion is kept as is).
func (d *decoder) setKey(c *container, key, val value) {
	if key.k == vStr {
		if bit := keyBit(key); c.keys&bit == 0 {
			c.keys |= bit
			c.items = append(c.items, key, val)
			return
		}
	}
	if key.k == vStr || key.k == vInt {
		for j := 0; j < len(c.items) && j < 128; j += 2 {
			if c.items[j] == key {
				c.items[j+1] = val
				return
			}
		}
	}
	c.items = append(c.items, key, val)
}

// isFrames reports whether v may be the frames of an entry or a block: a
// list being read, or one the memo gives again already read.
func isFrames(v value) bool { return v.k == vCont || v.k == vStack }

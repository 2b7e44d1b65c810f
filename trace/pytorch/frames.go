package pytorch

import (
	"fmt"
	"strings"

	"github.com/gpualloc/allocsim/trace"
)

// This file converts the stack frames of trace entries and blocks (a list
// of dicts {"name", "filename", "line"}, innermost first) into the
// stacks of a trace.Stacks: each frame dict becomes a frame id when it is
// appended to its list, and the list a stack id when the entry or block
// is converted. Stacks repeat massively (a training step's mallocs come
// from a few dozen lines), so the table keeps each frame and stack once,
// and the decoder keeps each frame's id by its interned strings, so that a
// repeated frame costs a lookup and no string. A frame dict is no
// container: its three fields are read into decoder.building as the
// pickle sets them, since a snapshot holds millions of them.
//
// Only the frames of alloc and oom entries are read (a free's frames are
// its malloc's again), and of the final segments' blocks on the first
// reading (a cut history's rebuilt mallocs take them).

// frameKey is a frame by the decoder's string ids.
type frameKey struct {
	name, file uint32
	line       int64
}

// noString stands for a frame field that is not a str.
const noString = ^uint32(0)

// A frame dict or a frames list that was memoized is found again through
// its memo slot, tagged tagSkip: until converted, memoPending and its
// index in building (with memoList, a frames container's index, whose
// c.memo names the slot, which tells a container reused since); once
// converted, its id: a frame id from memoFrame up, a stack id with
// memoStack set.
const (
	memoFrame   = 8       // above every pyKind
	memoStack   = 1 << 27 // frame and stack ids stay below it
	memoList    = 1 << 28 // and indexes below this
	memoPending = 1 << 29
)

// skipValue is the value of memo slot idx tagged tagSkip with payload x.
func (d *decoder) skipValue(idx uint64, x uint32) value {
	switch {
	case x&memoPending != 0 && x&memoList != 0:
		i := x &^ (memoPending | memoList)
		if int(i) < len(d.conts) && d.conts[i].memo == idx+1 {
			return value{k: vCont, g: d.conts[i].gen, n: int64(i)}
		}
		return value{k: vSkip, n: int64(pyList)}
	case x&memoPending != 0:
		i := x &^ memoPending
		if int(i) < len(d.buildMemo) && d.buildMemo[i] == idx+1 {
			return value{k: vFrameBuild, g: d.buildGen, n: int64(i)}
		}
		return value{k: vSkip, n: int64(pyDict)}
	case x&memoStack != 0:
		return value{k: vStack, n: int64(x &^ memoStack)}
	case x >= memoFrame:
		return value{k: vFrame, n: int64(x - memoFrame)}
	}
	return value{k: vSkip, n: int64(x)}
}

// newFrame starts a frame dict.
func (d *decoder) newFrame() value {
	if len(d.building) >= d.lim.frames {
		d.overLater(int64(d.lim.frames), "", "a frame dict read with %d others not yet in a frames list", len(d.building))
		return value{k: vSkip, n: int64(pyDict)}
	}
	d.building = append(d.building, frameKey{name: noString, file: noString})
	d.buildMemo = append(d.buildMemo, 0)
	return value{k: vFrameBuild, g: d.buildGen, n: int64(len(d.building) - 1)}
}

// setFrame sets the keys and values in items in the frame dict target.
func (d *decoder) setFrame(target value, items []value) {
	if target.g != d.buildGen || target.n >= int64(len(d.building)) {
		return
	}
	d.setFrameKey(&d.building[target.n], items)
}

// framesDone forgets the frame dicts read so far, all converted.
func (d *decoder) framesDone() {
	d.building, d.buildMemo = d.building[:0], d.buildMemo[:0]
	d.buildGen++
}

// frameOf returns the frame id of v, an item of a frames list: a frame
// dict being read, one the memo gives again, or a dict kept whole.
func (d *decoder) frameOf(v value) (uint32, error) {
	var k frameKey
	switch {
	case v.k == vFrame:
		return uint32(v.n), nil
	case v.k == vFrameBuild:
		if v.g != d.buildGen || v.n >= int64(len(d.building)) {
			return 0, fmt.Errorf("a frame no longer kept")
		}
		k = d.building[v.n]
	default:
		c := d.container(v)
		if c == nil || c.kind != pyDict {
			if v.k == vSkip && pyKind(v.n) == pyDict {
				return 0, fmt.Errorf("a frame repeated through the pickle memo, which this importer does not follow")
			}
			return 0, fmt.Errorf("a frame that is a %s, want a dict", d.pyType(v))
		}
		k = frameKey{name: noString, file: noString}
		d.setFrameKey(&k, c.items)
	}
	id, ok := d.frameIDs[k]
	if !ok {
		f := trace.Frame{Line: k.line}
		if k.name != noString {
			f.Name = d.strs[k.name]
		}
		if k.file != noString {
			f.File = d.strs[k.file]
		}
		id = d.seen.AddFrame(f)
		d.frameIDs[k] = id
	}
	if v.k == vFrameBuild {
		if m := d.buildMemo[v.n]; m > 0 && id < memoStack-memoFrame {
			d.memo.put(m-1, tagSkip|(id+memoFrame))
			d.buildMemo[v.n] = 0
		}
	}
	return id, nil
}

// setFrameKey reads the fields of a frame dict's items into k.
func (d *decoder) setFrameKey(k *frameKey, items []value) {
	for i := 0; i+1 < len(items); i += 2 {
		key, val := items[i], items[i+1]
		if key.k != vStr {
			continue
		}
		switch {
		case key.n == sName && val.k == vStr:
			k.name = uint32(val.n)
		case key.n == sFilename && val.k == vStr:
			k.file = uint32(val.n)
		case key.n == sLine && val.k == vInt:
			k.line = val.n
		}
	}
}

// stackOf returns the id in d.seen of v, the frames of an entry or a
// block (0 for none, or when frames are not read), and lets its list go;
// kept maps it to the table the events name.
func (d *decoder) stackOf(v value) (uint32, error) {
	if v.k == vStack {
		return uint32(v.n), nil
	}
	c := d.container(v)
	if c == nil || c.kind != pyList || d.seen == nil {
		return 0, nil
	}
	var fids []uint32
	switch c.role {
	case roleFrames:
		fids = c.fids
	case roleKeep:
		// Kept whole (an entry of a device trace not streamed).
		fids = d.fids[:0]
		for _, it := range c.items {
			fid, err := d.frameOf(it)
			if err != nil {
				return 0, err
			}
			fids = append(fids, fid)
		}
		d.fids = fids
	default:
		return 0, nil
	}
	id := d.seen.Add(fids)
	if c.role == roleFrames {
		if c.memo > 0 && id < memoStack {
			d.memo.put(c.memo-1, tagSkip|memoStack|id)
			c.memo = 0
		}
		d.release(v)
	}
	return id, nil
}

// kept returns the id in d.stacks, the table the events name, of stack id
// of d.seen, adding it there the first time it is asked for: a stack that
// only a free or a block not rebuilt names is read (its frames and list
// may be met again through the memo) but not kept.
func (d *decoder) kept(id uint32) uint32 {
	if id == 0 || d.stacks == nil {
		return 0
	}
	if n := int(id) + 1 - len(d.toKept); n > 0 {
		d.toKept = append(d.toKept, make([]uint32, n)...)
	}
	if k := d.toKept[id]; k != 0 {
		return k
	}
	k := d.stacks.AddFrames(d.seen.Frames(id))
	d.toKept[id] = k
	return k
}

// memPoolFrame is in the stack of the segment frees that a MemPool's
// deletion makes (its destructor releases the pool's cached segments):
// PyTorch's C++ frames, recorded with stacks "all".
const memPoolFrame = "MemPool::~MemPool"

// restoreFrames are in the stack of the mallocs of a checkpoint restore
// of torch.compile's cudagraph trees: the C++ frame (stacks "all") and the
// Python one (stacks "python").
var restoreFrames = []string{"setCheckpointPoolState", "apply_checkpoint_execution_state_in_allocator"}

// emptyCacheFrame is in the stack of the segment frees that an explicit
// torch.cuda.empty_cache() makes (stacks "all"); those of a malloc's retry
// hold the allocator's malloc instead.
const emptyCacheFrame = "CachingAllocator::emptyCache("

// byEmptyCache reports whether stack id of d.seen holds emptyCacheFrame.
func (d *decoder) byEmptyCache(id uint32) bool {
	return d.stackHolds(id, queryEmptyCache, emptyCacheFrame)
}

// byMemPool reports whether stack id of d.seen holds memPoolFrame.
func (d *decoder) byMemPool(id uint32) bool {
	return d.stackHolds(id, queryMemPool, memPoolFrame)
}

// restoreStack reports whether stack id of d.seen holds one of
// restoreFrames.
func (d *decoder) restoreStack(id uint32) bool {
	return d.stackHolds(id, queryRestore, restoreFrames...)
}

// stackHolds reports whether a frame of stack id of d.seen has one of
// names in its function name; what names the question, for the cache.
func (d *decoder) stackHolds(id uint32, what queryKind, names ...string) bool {
	if id == 0 || d.seen == nil {
		return false
	}
	key := stackQuery{id, what}
	if v, ok := d.stackQueries[key]; ok {
		return v
	}
	v := false
	for _, f := range d.seen.FrameIDs(id) {
		name := d.seen.Frame(f).Name
		for _, n := range names {
			v = v || strings.Contains(name, n)
		}
	}
	if d.stackQueries == nil {
		d.stackQueries = map[stackQuery]bool{}
	}
	d.stackQueries[key] = v
	return v
}

// stackQuery is a question stackHolds answered about a stack.
type stackQuery struct {
	id   uint32
	what queryKind
}

// queryKind is what stackHolds is asked of a stack.
type queryKind uint8

const (
	queryMemPool    queryKind = iota + 1 // byMemPool
	queryRestore                         // restoreStack
	queryEmptyCache                      // byEmptyCache
)

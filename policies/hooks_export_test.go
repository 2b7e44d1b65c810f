package policies

import (
	"fmt"

	"github.com/gpualloc/allocsim/trace"
)

// This file gives the tests of the async-pool, paddle and tlsf policies
// (package policies_test) a white-box check of each policy's own records,
// beside the black-box layout checks: CheckTiling. A merge that loses or
// gains bytes leaves no two live blocks overlapping, but it breaks the
// tiling of a segment by its blocks.

// checkTreap checks the free tree of c (order, the items' keys against
// their blocks, the children's largest sizes, every block free and in it
// once) and returns its blocks.
func checkTreap(c *coalescing) (map[*flBlock]bool, error) {
	nodes := map[*flBlock]bool{}
	var prev *flBlock
	var walk func(x *ftNode[*flBlock]) (uint64, error)
	walk = func(x *ftNode[*flBlock]) (uint64, error) {
		var m uint64
		for i := 0; i <= x.n; i++ {
			if !x.leaf {
				km, err := walk(x.kids[i])
				if err != nil {
					return 0, err
				}
				if c.free.byAddr && km != x.kmax[i] {
					return 0, fmt.Errorf("child %d: largest %d, recorded %d", i, km, x.kmax[i])
				}
				m = max(m, km)
			}
			if i == x.n {
				break
			}
			size, addr, b := x.sizes[i], x.addrs[i], x.vals[i]
			switch {
			case addr != b.addr || size != b.size:
				return 0, fmt.Errorf("block %#x+%d in the tree as %#x+%d", b.addr, b.size, addr, size)
			case nodes[b]:
				return 0, fmt.Errorf("block %#x+%d twice in the tree", b.addr, b.size)
			case !b.free:
				return 0, fmt.Errorf("block %#x+%d: allocated, in a free tree", b.addr, b.size)
			case prev != nil && !c.less(prev, b):
				return 0, fmt.Errorf("blocks %#x+%d and %#x+%d out of order", prev.addr, prev.size, b.addr, b.size)
			}
			nodes[b] = true
			prev = b
			m = max(m, b.size)
		}
		return m, nil
	}
	if c.free.root == nil {
		return nodes, nil
	}
	if _, err := walk(c.free.root); err != nil {
		return nil, err
	}
	if len(nodes) != c.free.len {
		return nil, fmt.Errorf("%d blocks in the tree, counted %d", len(nodes), c.free.len)
	}
	return nodes, nil
}

// less reports whether a comes before b in c's free tree.
func (c *coalescing) less(a, b *flBlock) bool {
	if !c.free.byAddr && a.size != b.size {
		return a.size < b.size
	}
	return a.addr < b.addr
}

// checkSegmentTiling checks that the blocks of segment s, from first,
// follow each other without gap or overlap and cover it, and calls visit
// on each.
func checkSegmentTiling(addr, size uint64, first *flBlock, s *flSegment, visit func(*flBlock) error) error {
	at := addr
	var prev *flBlock
	for b := first; b != nil; b = b.next {
		if b.seg != s || b.prev != prev {
			return fmt.Errorf("segment %#x: block %#x+%d badly linked", addr, b.addr, b.size)
		}
		if b.addr != at || b.size == 0 {
			return fmt.Errorf("segment %#x: block %#x+%d where %#x was expected", addr, b.addr, b.size, at)
		}
		if err := visit(b); err != nil {
			return err
		}
		at += b.size
		prev = b
	}
	if at != addr+size {
		return fmt.Errorf("segment %#x+%d: blocks end at %#x", addr, size, at)
	}
	return nil
}

// checkSerialTree checks a tree of the async pool, keyed by (size,
// serial): every block free, in it once with its own key, in key order.
func checkSerialTree(t *freeTree[*flBlock]) (map[*flBlock]bool, error) {
	nodes := map[*flBlock]bool{}
	var prev *flBlock
	var walk func(x *ftNode[*flBlock]) error
	walk = func(x *ftNode[*flBlock]) error {
		for i := 0; i <= x.n; i++ {
			if !x.leaf {
				if err := walk(x.kids[i]); err != nil {
					return err
				}
			}
			if i == x.n {
				break
			}
			size, serial, b := x.sizes[i], x.addrs[i], x.vals[i]
			switch {
			case size != b.size || serial != b.serial:
				return fmt.Errorf("block %#x+%d (serial %d) in the tree as size %d, serial %d", b.addr, b.size, b.serial, size, serial)
			case nodes[b]:
				return fmt.Errorf("block %#x+%d twice in the tree", b.addr, b.size)
			case !b.free:
				return fmt.Errorf("block %#x+%d: allocated, in a free tree", b.addr, b.size)
			case prev != nil && (prev.size > b.size || prev.size == b.size && prev.serial >= b.serial):
				return fmt.Errorf("blocks %#x+%d and %#x+%d out of order", prev.addr, prev.size, b.addr, b.size)
			}
			nodes[b] = true
			prev = b
		}
		return nil
	}
	if t.root == nil {
		return nodes, nil
	}
	if err := walk(t.root); err != nil {
		return nil, err
	}
	if len(nodes) != t.len {
		return nil, fmt.Errorf("%d blocks, the tree counts %d", len(nodes), t.len)
	}
	return nodes, nil
}

// CheckTiling checks the async pool's records: segments tiled by their
// blocks; every free block in the ready treap or, pending, in its stream's;
// the free, reserved and pending counts; the live map.
func (p *AsyncPool) CheckTiling() error {
	inTree := map[*flBlock]*freeTree[*flBlock]{}
	nodes, err := checkSerialTree(&p.readyT)
	if err != nil {
		return fmt.Errorf("ready: %v", err)
	}
	for b := range nodes {
		if b.pend.s != nil {
			return fmt.Errorf("ready block %#x pending %+v", b.addr, b.pend)
		}
		inTree[b] = &p.readyT
	}
	for _, st := range p.streams {
		nodes, err := checkSerialTree(&st.pend)
		if err != nil {
			return fmt.Errorf("stream %d: %v", st.id, err)
		}
		if len(nodes) != st.pend.len {
			return fmt.Errorf("stream %d: %d pending blocks, counted %d", st.id, len(nodes), st.pend.len)
		}
		for b := range nodes {
			if inTree[b] != nil {
				return fmt.Errorf("block %#x in two trees", b.addr)
			}
			inTree[b] = &st.pend
			if f := b.pend; f.s != st || f.seq > st.seq {
				return fmt.Errorf("block %#x: in stream %d's tree, pending %+v", b.addr, st.id, f)
			}
		}
	}
	var used uint64
	allocated := 0
	busy := make([]uint64, len(p.busy))
	if s := p.seg; s != nil {
		err := checkSegmentTiling(s.addr, s.size, s.first, s, func(b *flBlock) error {
			if !b.free || b.pend.s != nil {
				// Live or pending: on mapped chunks, counted busy.
				first, last := p.chunks(b.addr, b.size)
				for c := first; c <= last; c++ {
					if c >= uint64(len(p.mapped)) || !p.mapped[c] {
						return fmt.Errorf("block %#x+%d on chunk %d, not mapped", b.addr, b.size, c)
					}
					lo := max(b.addr, p.base+c*p.granularity)
					hi := min(b.addr+b.size, p.base+(c+1)*p.granularity)
					busy[c] += hi - lo
				}
			}
			if !b.free {
				allocated++
				used += b.size
				if v, _ := p.ready.live.Get(b.addr); v != b {
					return fmt.Errorf("allocated block %#x not live", b.addr)
				}
				if b.pend != (apFree{}) {
					return fmt.Errorf("allocated block %#x pending %+v", b.addr, b.pend)
				}
				return nil
			}
			if inTree[b] == nil {
				return fmt.Errorf("free block %#x+%d in no treap", b.addr, b.size)
			}
			delete(inTree, b)
			return nil
		})
		if err != nil {
			return err
		}
	}
	var reserved uint64
	for c, m := range p.mapped {
		if m {
			reserved += p.granularity
		}
		if busy[c] != p.busy[c] {
			return fmt.Errorf("chunk %d: %d busy bytes, counted %d", c, busy[c], p.busy[c])
		}
	}
	switch {
	case len(inTree) > 0:
		return fmt.Errorf("%d treap blocks in no segment", len(inTree))
	case allocated != p.ready.live.Len():
		return fmt.Errorf("%d allocated blocks, %d live", allocated, p.ready.live.Len())
	case reserved != p.reserved || used != p.used:
		return fmt.Errorf("reserved %d, used %d; counted %d, %d", reserved, used, p.reserved, p.used)
	}
	return nil
}

// CheckTiling checks each paddle pool: chunks tiled by their blocks, free
// blocks in the pool's treap, the free count, the live map; and the free
// space counted over the pools. The live blocks are the policy's, each of its pool; a pool's own live
// map is unused.
func (p *Paddle) CheckTiling() error {
	var total, largest uint64
	for _, pl := range p.pools {
		if pl.c.live.Len() != 0 {
			return fmt.Errorf("stream %d: %d blocks in the pool's own live map", pl.stream, pl.c.live.Len())
		}
		for addr, l := range p.live.All() {
			if l.pl == pl {
				pl.c.live.Put(addr, l.b)
			}
		}
		err := pl.c.checkTiling()
		pl.c.live = trace.AddrMap[*flBlock]{}
		if err != nil {
			return fmt.Errorf("stream %d: %v", pl.stream, err)
		}
		t, l := pl.c.FreeSpace()
		total, largest = total+t, max(largest, l)
	}
	if t, l := p.FreeSpace(); t != total || l != largest {
		return fmt.Errorf("free space %d, largest %d; counted %d, %d", t, l, total, largest)
	}
	return nil
}

// checkTiling checks a coalescing free list: segments tiled by their
// blocks, free blocks in the treap, the free count, the live map.
func (c *coalescing) checkTiling() error {
	nodes, err := checkTreap(c)
	if err != nil {
		return err
	}
	var free uint64
	allocated := 0
	for i, s := range c.segments {
		if s.index != i {
			return fmt.Errorf("segment %#x: index %d at %d", s.addr, s.index, i)
		}
		err := checkSegmentTiling(s.addr, s.size, s.first, s, func(b *flBlock) error {
			if !b.free {
				allocated++
				if v, _ := c.live.Get(b.addr); v != b {
					return fmt.Errorf("allocated block %#x not live", b.addr)
				}
				return nil
			}
			free += b.size
			if !nodes[b] {
				return fmt.Errorf("free block %#x+%d not in the treap", b.addr, b.size)
			}
			delete(nodes, b)
			return nil
		})
		if err != nil {
			return err
		}
	}
	switch {
	case len(nodes) > 0:
		return fmt.Errorf("%d treap blocks in no segment", len(nodes))
	case allocated != c.live.Len():
		return fmt.Errorf("%d allocated blocks, %d live", allocated, c.live.Len())
	case free != c.freeBytes:
		return fmt.Errorf("free %d, counted %d", free, c.freeBytes)
	}
	return nil
}

// CheckTiling checks the TLSF records: segments tiled by their blocks;
// every free block in the list of its class and no other; the bitmaps; the
// free count; the live map.
func (p *TLSF) CheckTiling() error {
	listed := map[*tlsfBlock]bool{}
	for fl := range p.heads {
		for sl := range p.heads[fl] {
			var prev *tlsfBlock
			for b := p.heads[fl][sl]; b != nil; b = b.fnext {
				if f, s := p.mapping(b.size); f != uint(fl) || s != uint(sl) {
					return fmt.Errorf("block %#x+%d in list (%d, %d), belongs in (%d, %d)", b.addr, b.size, fl, sl, f, s)
				}
				if b.fprev != prev || !b.free || listed[b] {
					return fmt.Errorf("block %#x+%d badly listed", b.addr, b.size)
				}
				listed[b] = true
				prev = b
			}
			nonEmpty := p.heads[fl][sl] != nil
			if nonEmpty != (p.slMap[fl]&(1<<sl) != 0) {
				return fmt.Errorf("list (%d, %d): second-level bit wrong", fl, sl)
			}
		}
		if (p.slMap[fl] != 0) != (p.flMap&(1<<fl) != 0) {
			return fmt.Errorf("first level %d: bit wrong", fl)
		}
	}
	var free uint64
	allocated := 0
	for i, s := range p.segments {
		if s.index != i {
			return fmt.Errorf("segment %#x: index %d at %d", s.addr, s.index, i)
		}
		at := s.addr
		var prev *tlsfBlock
		for b := s.first; b != nil; b = b.next {
			if b.seg != s || b.prev != prev || b.addr != at || b.size == 0 {
				return fmt.Errorf("segment %#x: block %#x+%d where %#x was expected", s.addr, b.addr, b.size, at)
			}
			if b.free {
				if prev != nil && prev.free {
					return fmt.Errorf("free blocks %#x and %#x not merged", prev.addr, b.addr)
				}
				if !listed[b] {
					return fmt.Errorf("free block %#x+%d in no list", b.addr, b.size)
				}
				delete(listed, b)
				free += b.size
			} else {
				allocated++
				if p.live[b.addr] != b {
					return fmt.Errorf("allocated block %#x not live", b.addr)
				}
			}
			at += b.size
			prev = b
		}
		if at != s.addr+s.size {
			return fmt.Errorf("segment %#x+%d: blocks end at %#x", s.addr, s.size, at)
		}
	}
	switch {
	case len(listed) > 0:
		return fmt.Errorf("%d listed blocks in no segment", len(listed))
	case allocated != len(p.live):
		return fmt.Errorf("%d allocated blocks, %d live", allocated, len(p.live))
	case free != p.freeBytes:
		return fmt.Errorf("free %d, counted %d", free, p.freeBytes)
	}
	return nil
}

// CheckTiling checks the workspace's records: the region's blocks in
// address order below the top, the live ones indexed and counted, the top
// at the start when none is live.
func (p *Workspace) CheckTiling() error {
	if p.top > p.capacity {
		return fmt.Errorf("top %d above the region's %d bytes", p.top, p.capacity)
	}
	var at uint64
	live := 0
	for i, e := range p.stack {
		if e.start < at || e.end <= e.start || e.end > p.top {
			return fmt.Errorf("region block %d: [%d, %d) after %d, top %d", i, e.start, e.end, at, p.top)
		}
		at = e.end
		if !e.dead {
			live++
			if b, ok := p.blocks.Get(p.region + e.start); !ok || b.overflow || b.index != i {
				return fmt.Errorf("region block %d at %d not indexed", i, e.start)
			}
		}
	}
	indexed := 0
	for _, b := range p.blocks.All() {
		if !b.overflow {
			indexed++
		}
	}
	switch {
	case live != p.nlive || live != indexed:
		return fmt.Errorf("%d live region blocks, counted %d, indexed %d", live, p.nlive, indexed)
	case live == 0 && p.top != 0:
		return fmt.Errorf("no live region block, top %d", p.top)
	}
	return nil
}

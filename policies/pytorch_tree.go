package policies

import (
	"fmt"
)

// The pytorch policy's data structures: blocks by address, and free blocks
// ordered by (size, address).

// ptTree is a B-tree of free blocks ordered by (size, address). Nodes of
// deleted levels are kept for reuse, so that a steady state allocates
// nothing.
type ptTree struct {
	root  *ptNode
	len   int
	spare *ptNode // recycled nodes, linked through kids[0]
}

const (
	ptDegree   = 16 // minimum degree: nodes hold ptDegree-1 .. 2*ptDegree-1 items
	ptMaxItems = 2*ptDegree - 1
)

type ptItem struct {
	size, addr uint64
	b          *ptBlock
}

type ptNode struct {
	n     int
	leaf  bool
	items [ptMaxItems]ptItem
	kids  [ptMaxItems + 1]*ptNode
}

// find returns the index of the first item of x not below (size, addr).
// A linear scan: the trees are small (free blocks per stream and pool
// number tens in real traces), and it beats a binary search there.
func (x *ptNode) find(size, addr uint64) int {
	items := x.items[:x.n]
	for i := range items {
		if it := &items[i]; it.size > size || it.size == size && it.addr >= addr {
			return i
		}
	}
	return len(items)
}

func (t *ptTree) newNode(leaf bool) *ptNode {
	x := t.spare
	if x == nil {
		return &ptNode{leaf: leaf}
	}
	t.spare = x.kids[0]
	x.kids[0] = nil
	x.leaf = leaf
	return x
}

func (t *ptTree) recycle(x *ptNode) {
	*x = ptNode{}
	x.kids[0] = t.spare
	t.spare = x
}

// lowerBound returns the block of the first item not below (size, 0), or
// nil.
func (t *ptTree) lowerBound(size uint64) *ptBlock { return t.lowerBoundAt(size, 0) }

// lowerBoundAt returns the block of the first item not below (size, addr),
// or nil.
func (t *ptTree) lowerBoundAt(size, addr uint64) *ptBlock {
	var b *ptBlock
	for x := t.root; x != nil; {
		i := x.find(size, addr)
		if i < x.n {
			b = x.items[i].b
		}
		if x.leaf {
			break
		}
		x = x.kids[i]
	}
	return b
}

// successor returns the block of the item after b's, or nil.
func (t *ptTree) successor(b *ptBlock) *ptBlock {
	if b.addr == ^uint64(0) {
		return t.lowerBoundAt(b.size+1, 0)
	}
	return t.lowerBoundAt(b.size, b.addr+1)
}

// max returns the block of the last item, or nil.
func (t *ptTree) max() *ptBlock {
	x := t.root
	if x == nil || t.len == 0 {
		return nil
	}
	for !x.leaf {
		x = x.kids[x.n]
	}
	return x.items[x.n-1].b
}

// appendIf appends the blocks for which keep is true, in order.
func (t *ptTree) appendIf(list []*ptBlock, keep func(*ptBlock) bool) []*ptBlock {
	if t.len == 0 {
		return list
	}
	var walk func(x *ptNode)
	walk = func(x *ptNode) {
		for i := 0; i < x.n; i++ {
			if !x.leaf {
				walk(x.kids[i])
			}
			if b := x.items[i].b; keep(b) {
				list = append(list, b)
			}
		}
		if !x.leaf {
			walk(x.kids[x.n])
		}
	}
	walk(t.root)
	return list
}

// insert adds it, whose key must not be in t.
func (t *ptTree) insert(it ptItem) {
	if t.root == nil {
		t.root = t.newNode(true)
	}
	if t.root.n == ptMaxItems {
		r := t.newNode(false)
		r.kids[0] = t.root
		t.root = r
		t.splitChild(r, 0)
	}
	x := t.root
	for {
		i := x.find(it.size, it.addr)
		if x.leaf {
			copy(x.items[i+1:x.n+1], x.items[i:x.n])
			x.items[i] = it
			x.n++
			break
		}
		if x.kids[i].n == ptMaxItems {
			t.splitChild(x, i)
			if m := &x.items[i]; m.size < it.size || m.size == it.size && m.addr < it.addr {
				i++
			}
		}
		x = x.kids[i]
	}
	t.len++
}

// rekey replaces the item with key (size, addr), which must be in t, by
// it, whose key must not be: in a tree of one node (free blocks per stream
// and pool number tens) by one shift of the items between the two keys,
// rather than a delete and an insert that shift the items after each.
func (t *ptTree) rekey(size, addr uint64, it ptItem) {
	x := t.root
	if !x.leaf {
		t.delete(size, addr)
		t.insert(it)
		return
	}
	i := x.find(size, addr)
	if i == x.n || x.items[i].size != size || x.items[i].addr != addr {
		panic(fmt.Sprintf("policies: pytorch free block tree: no block of %d bytes at %#x", size, addr))
	}
	// j is where it goes among the items with the old one still there.
	if j := x.find(it.size, it.addr); j <= i {
		copy(x.items[j+1:i+1], x.items[j:i])
		x.items[j] = it
	} else {
		copy(x.items[i:j-1], x.items[i+1:j])
		x.items[j-1] = it
	}
}

// splitChild splits the full child i of x around its median, which moves
// up into x.
func (t *ptTree) splitChild(x *ptNode, i int) {
	y := x.kids[i]
	z := t.newNode(y.leaf)
	z.n = ptDegree - 1
	copy(z.items[:ptDegree-1], y.items[ptDegree:])
	if !y.leaf {
		copy(z.kids[:ptDegree], y.kids[ptDegree:])
		clear(y.kids[ptDegree:])
	}
	median := y.items[ptDegree-1]
	clear(y.items[ptDegree-1:])
	y.n = ptDegree - 1
	copy(x.kids[i+2:x.n+2], x.kids[i+1:x.n+1])
	x.kids[i+1] = z
	copy(x.items[i+1:x.n+1], x.items[i:x.n])
	x.items[i] = median
	x.n++
}

// delete removes the item with key (size, addr), which must be in t. On
// the way down every node entered has at least ptDegree items, so that the
// removal never leaves a node short.
func (t *ptTree) delete(size, addr uint64) {
	x := t.root
	for {
		i := x.find(size, addr)
		found := i < x.n && x.items[i].size == size && x.items[i].addr == addr
		if x.leaf {
			if !found {
				panic(fmt.Sprintf("policies: pytorch free block tree: no block of %d bytes at %#x", size, addr))
			}
			copy(x.items[i:x.n-1], x.items[i+1:x.n])
			x.n--
			x.items[x.n] = ptItem{}
			break
		}
		if found {
			y, z := x.kids[i], x.kids[i+1]
			switch {
			case y.n >= ptDegree:
				// Replace by the predecessor and delete that from y.
				w := y
				for !w.leaf {
					w = w.kids[w.n]
				}
				x.items[i] = w.items[w.n-1]
				size, addr = x.items[i].size, x.items[i].addr
				x = y
			case z.n >= ptDegree:
				// Replace by the successor and delete that from z.
				w := z
				for !w.leaf {
					w = w.kids[0]
				}
				x.items[i] = w.items[0]
				size, addr = x.items[i].size, x.items[i].addr
				x = z
			default:
				t.merge(x, i)
				x = y
			}
			continue
		}
		c := x.kids[i]
		if c.n == ptDegree-1 {
			switch {
			case i > 0 && x.kids[i-1].n >= ptDegree:
				t.rotateRight(x, i-1)
			case i < x.n && x.kids[i+1].n >= ptDegree:
				t.rotateLeft(x, i)
			case i < x.n:
				t.merge(x, i)
			default:
				c = x.kids[i-1]
				t.merge(x, i-1)
			}
		}
		x = c
	}
	t.len--
	if r := t.root; r.n == 0 && !r.leaf {
		t.root = r.kids[0]
		t.recycle(r)
	}
}

// rotateRight moves the last item of child i of x up into x and x's item
// i down to the front of child i+1.
func (t *ptTree) rotateRight(x *ptNode, i int) {
	l, c := x.kids[i], x.kids[i+1]
	copy(c.items[1:c.n+1], c.items[:c.n])
	c.items[0] = x.items[i]
	if !c.leaf {
		copy(c.kids[1:c.n+2], c.kids[:c.n+1])
		c.kids[0] = l.kids[l.n]
		l.kids[l.n] = nil
	}
	c.n++
	x.items[i] = l.items[l.n-1]
	l.items[l.n-1] = ptItem{}
	l.n--
}

// rotateLeft moves the first item of child i+1 of x up into x and x's item
// i down to the end of child i.
func (t *ptTree) rotateLeft(x *ptNode, i int) {
	c, r := x.kids[i], x.kids[i+1]
	c.items[c.n] = x.items[i]
	if !c.leaf {
		c.kids[c.n+1] = r.kids[0]
	}
	c.n++
	x.items[i] = r.items[0]
	copy(r.items[:r.n-1], r.items[1:r.n])
	r.items[r.n-1] = ptItem{}
	if !r.leaf {
		copy(r.kids[:r.n], r.kids[1:r.n+1])
		r.kids[r.n] = nil
	}
	r.n--
}

// merge joins child i+1 of x and x's item i onto the end of child i.
func (t *ptTree) merge(x *ptNode, i int) {
	y, z := x.kids[i], x.kids[i+1]
	y.items[y.n] = x.items[i]
	copy(y.items[y.n+1:], z.items[:z.n])
	if !y.leaf {
		copy(y.kids[y.n+1:], z.kids[:z.n+1])
	}
	y.n += z.n + 1
	copy(x.items[i:x.n-1], x.items[i+1:x.n])
	x.items[x.n-1] = ptItem{}
	copy(x.kids[i+1:x.n], x.kids[i+2:x.n+1])
	x.kids[x.n] = nil
	x.n--
	t.recycle(z)
}

// ptActive is the table of allocated blocks by address: open addressing
// with linear probing and backward-shift deletion over (address, block)
// slots, grown at half full. For the pytorch policy's per-malloc and
// per-free lookups it is faster than trace.AddrMap, whose records sit
// apart from its index, at a like cost per live block (two to four slots
// of 16 bytes). The zero value is ready to use.
type ptActive struct {
	slots []ptActiveSlot
	n     int
	shift uint // 64 - log2(len(slots))
}

type ptActiveSlot struct {
	addr uint64 // 0 for an empty slot (no block is at address 0)
	b    *ptBlock
}

func (m *ptActive) home(addr uint64) int { return int(addr * 0x9e3779b97f4a7c15 >> m.shift) }

// put sets the block at addr, which must not be in m, and must not be 0.
func (m *ptActive) put(addr uint64, b *ptBlock) {
	if 2*(m.n+1) > len(m.slots) {
		m.grow()
	}
	mask := len(m.slots) - 1
	i := m.home(addr)
	for m.slots[i].addr != 0 {
		i = (i + 1) & mask
	}
	m.slots[i] = ptActiveSlot{addr, b}
	m.n++
}

// take removes the block at addr and returns it, nil if there is none.
func (m *ptActive) take(addr uint64) *ptBlock {
	if m.n == 0 || addr == 0 {
		return nil
	}
	mask := len(m.slots) - 1
	i := m.home(addr)
	for m.slots[i].addr != addr {
		if m.slots[i].addr == 0 {
			return nil
		}
		i = (i + 1) & mask
	}
	b := m.slots[i].b
	m.n--
	// Shift back the later slots of the probe run whose home is not in
	// the cyclic range (i, j].
	for j := (i + 1) & mask; m.slots[j].addr != 0; j = (j + 1) & mask {
		h := m.home(m.slots[j].addr)
		if (j > i && (h <= i || h > j)) || (j < i && h <= i && h > j) {
			m.slots[i] = m.slots[j]
			i = j
		}
	}
	m.slots[i] = ptActiveSlot{}
	return b
}

func (m *ptActive) grow() {
	old := m.slots
	size := max(64, 2*len(old))
	m.slots = make([]ptActiveSlot, size)
	m.shift = 64
	for s := size; s > 1; s >>= 1 {
		m.shift--
	}
	mask := size - 1
	for _, s := range old {
		if s.addr != 0 {
			i := m.home(s.addr)
			for m.slots[i].addr != 0 {
				i = (i + 1) & mask
			}
			m.slots[i] = s
		}
	}
}

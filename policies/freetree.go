package policies

import "fmt"

// freeTree is the free list of the coalescing policies (first-fit,
// best-fit, paddle, async-pool, bfc, rmm-pool, rmm-arena): a B-tree of free
// blocks, each item holding a block's size and address beside the block,
// so that a search reads node arrays and never the blocks themselves.
//
// A best-fit tree (byAddr false) is ordered by (size, address) and answers
// the smallest block of at least n bytes, the lowest address among equal
// sizes. A first-fit tree (byAddr true) is ordered by address, and every
// inner node keeps, beside each child, the largest size in that child's
// subtree: a search descends into the leftmost child or item large enough
// and answers the lowest-addressed block that fits. A block of a first-fit
// tree may change its address and size in place (resize) as long as its
// place in address order stays. Nodes of deleted levels are kept for
// reuse, so that a steady state allocates nothing.
//
// The tree holds keys, not the blocks' fields: a caller deletes a block by
// the key it was inserted (or last resized) with, before it changes the
// block's own size or address.
type freeTree[B any] struct {
	root   *ftNode[B]
	byAddr bool
	len    int
	spare  *ftNode[B] // recycled nodes, linked through kids[0]
}

const (
	ftDegree   = 8 // minimum degree: nodes hold ftDegree-1 .. 2*ftDegree-1 items
	ftMaxItems = 2*ftDegree - 1
	ftMaxDepth = 48 // far above the height of any tree of 2^64 items
)

// ftItem is a free block of a freeTree: its size and address in bytes.
type ftItem[B any] struct {
	size, addr uint64
	b          B
}

type ftNode[B any] struct {
	n    int
	leaf bool
	// kmax[i] is the largest size under kids[i]; first-fit trees only.
	kmax  [ftMaxItems + 1]uint64
	items [ftMaxItems]ftItem[B]
	kids  [ftMaxItems + 1]*ftNode[B]
}

// ftStep is one step of a descent: the node and the child taken.
type ftStep[B any] struct {
	x *ftNode[B]
	i int
}

// search returns the index of the first item of x not below the key
// (size, addr), or addr alone in a first-fit tree. A linear scan: nodes are
// small and it beats a binary search there.
func (t *freeTree[B]) search(x *ftNode[B], size, addr uint64) int {
	items := x.items[:x.n]
	if t.byAddr {
		for i := range items {
			if items[i].addr >= addr {
				return i
			}
		}
		return len(items)
	}
	for i := range items {
		if it := &items[i]; it.size > size || it.size == size && it.addr >= addr {
			return i
		}
	}
	return len(items)
}

// before reports whether item it comes before the key (size, addr).
func (t *freeTree[B]) before(it *ftItem[B], size, addr uint64) bool {
	if t.byAddr {
		return it.addr < addr
	}
	return it.size < size || it.size == size && it.addr < addr
}

// is reports whether item it has the key (size, addr).
func (t *freeTree[B]) is(it *ftItem[B], size, addr uint64) bool {
	return it.addr == addr && (t.byAddr || it.size == size)
}

// nodeMax returns the largest size under x, from its items and its
// children's recorded maxima.
func (t *freeTree[B]) nodeMax(x *ftNode[B]) uint64 {
	var m uint64
	for i := range x.items[:x.n] {
		m = max(m, x.items[i].size)
	}
	if !x.leaf {
		for _, k := range x.kmax[:x.n+1] {
			m = max(m, k)
		}
	}
	return m
}

// fixKid records the largest size under child i of x, in a first-fit tree.
func (t *freeTree[B]) fixKid(x *ftNode[B], i int) {
	if t.byAddr {
		x.kmax[i] = t.nodeMax(x.kids[i])
	}
}

func (t *freeTree[B]) newNode(leaf bool) *ftNode[B] {
	x := t.spare
	if x == nil {
		return &ftNode[B]{leaf: leaf}
	}
	t.spare = x.kids[0]
	x.kids[0] = nil
	x.leaf = leaf
	return x
}

func (t *freeTree[B]) recycle(x *ftNode[B]) {
	*x = ftNode[B]{}
	x.kids[0] = t.spare
	t.spare = x
}

// best returns the block of the smallest size of at least n bytes, the
// lowest address among equal sizes, and whether there is one; t is a
// best-fit tree.
func (t *freeTree[B]) best(n uint64) (B, bool) {
	var b B
	found := false
	for x := t.root; x != nil; {
		items := x.items[:x.n]
		i := 0
		for i < len(items) && items[i].size < n {
			i++
		}
		if i < len(items) {
			b, found = items[i].b, true
		}
		if x.leaf {
			break
		}
		x = x.kids[i]
	}
	return b, found
}

// first returns the lowest-addressed block of at least n bytes and whether
// there is one; t is a first-fit tree.
func (t *freeTree[B]) first(n uint64) (B, bool) {
	x := t.root
	if x == nil {
		var zero B
		return zero, false
	}
next:
	for !x.leaf {
		for i := 0; i < x.n; i++ {
			if x.kmax[i] >= n {
				x = x.kids[i]
				continue next
			}
			if x.items[i].size >= n {
				return x.items[i].b, true
			}
		}
		if x.kmax[x.n] < n {
			var zero B
			return zero, false
		}
		x = x.kids[x.n]
	}
	for i := range x.items[:x.n] {
		if x.items[i].size >= n {
			return x.items[i].b, true
		}
	}
	// Only the root can get here: a child is entered only when it holds a
	// block that fits.
	var zero B
	return zero, false
}

// firstWhere returns the lowest-addressed block of at least n bytes for
// which ok is true, and whether there is one; t is a first-fit tree.
func (t *freeTree[B]) firstWhere(n uint64, ok func(B) bool) (B, bool) {
	var walk func(x *ftNode[B]) (B, bool)
	walk = func(x *ftNode[B]) (B, bool) {
		for i := 0; i <= x.n; i++ {
			if !x.leaf && x.kmax[i] >= n {
				if b, found := walk(x.kids[i]); found {
					return b, true
				}
			}
			if i < x.n && x.items[i].size >= n && ok(x.items[i].b) {
				return x.items[i].b, true
			}
		}
		var zero B
		return zero, false
	}
	if t.root == nil {
		var zero B
		return zero, false
	}
	return walk(t.root)
}

// appendAll appends the blocks of t in order.
func (t *freeTree[B]) appendAll(list []B) []B {
	var walk func(x *ftNode[B])
	walk = func(x *ftNode[B]) {
		for i := 0; i < x.n; i++ {
			if !x.leaf {
				walk(x.kids[i])
			}
			list = append(list, x.items[i].b)
		}
		if !x.leaf {
			walk(x.kids[x.n])
		}
	}
	if t.root != nil {
		walk(t.root)
	}
	return list
}

// any returns some block of t and whether t has one.
func (t *freeTree[B]) any() (B, bool) {
	if t.len == 0 {
		var zero B
		return zero, false
	}
	return t.root.items[0].b, true
}

// largest returns the size in bytes of the largest block, 0 if none.
func (t *freeTree[B]) largest() uint64 {
	x := t.root
	switch {
	case t.len == 0:
		return 0
	case t.byAddr:
		return t.nodeMax(x)
	}
	for !x.leaf {
		x = x.kids[x.n]
	}
	return x.items[x.n-1].size
}

// insert adds block b of size bytes at addr, whose key must not be in t.
// On the way down every full node is split first, so that the leaf has
// room.
func (t *freeTree[B]) insert(size, addr uint64, b B) {
	if t.root == nil {
		t.root = t.newNode(true)
	}
	if t.root.n == ftMaxItems {
		r := t.newNode(false)
		r.kids[0] = t.root
		t.root = r
		t.splitChild(r, 0)
	}
	x := t.root
	for {
		i := t.search(x, size, addr)
		if x.leaf {
			copy(x.items[i+1:x.n+1], x.items[i:x.n])
			x.items[i] = ftItem[B]{size, addr, b}
			x.n++
			break
		}
		if x.kids[i].n == ftMaxItems {
			t.splitChild(x, i)
			if t.before(&x.items[i], size, addr) {
				i++
			}
		}
		if t.byAddr && x.kmax[i] < size {
			x.kmax[i] = size
		}
		x = x.kids[i]
	}
	t.len++
}

// splitChild splits the full child i of x around its median, which moves
// up into x.
func (t *freeTree[B]) splitChild(x *ftNode[B], i int) {
	y := x.kids[i]
	z := t.newNode(y.leaf)
	z.n = ftDegree - 1
	copy(z.items[:ftDegree-1], y.items[ftDegree:])
	if !y.leaf {
		copy(z.kids[:ftDegree], y.kids[ftDegree:])
		copy(z.kmax[:ftDegree], y.kmax[ftDegree:])
		clear(y.kids[ftDegree:])
		clear(y.kmax[ftDegree:])
	}
	median := y.items[ftDegree-1]
	clear(y.items[ftDegree-1:])
	y.n = ftDegree - 1
	copy(x.kids[i+2:x.n+2], x.kids[i+1:x.n+1])
	copy(x.kmax[i+2:x.n+2], x.kmax[i+1:x.n+1])
	x.kids[i+1] = z
	copy(x.items[i+1:x.n+1], x.items[i:x.n])
	x.items[i] = median
	x.n++
	t.fixKid(x, i)
	t.fixKid(x, i+1)
}

// delete removes the block with key (size, addr), or addr alone in a
// first-fit tree, which must be in t. On the way down every node entered
// has at least ftDegree items, so that the removal never leaves a node
// short; in a first-fit tree the maxima of the children on the path are
// recomputed from the bottom up afterwards.
func (t *freeTree[B]) delete(size, addr uint64) {
	var path [ftMaxDepth]ftStep[B]
	depth := 0
	x := t.root
	for {
		i := t.search(x, size, addr)
		found := i < x.n && t.is(&x.items[i], size, addr)
		if x.leaf {
			if !found {
				panic(fmt.Sprintf("policies: free tree: no block of %d bytes at %#x", size, addr))
			}
			copy(x.items[i:x.n-1], x.items[i+1:x.n])
			x.n--
			x.items[x.n] = ftItem[B]{}
			break
		}
		if found {
			y, z := x.kids[i], x.kids[i+1]
			switch {
			case y.n >= ftDegree:
				// Replace by the predecessor, then delete that from y.
				w := y
				for !w.leaf {
					w = w.kids[w.n]
				}
				x.items[i] = w.items[w.n-1]
				size, addr = w.items[w.n-1].size, w.items[w.n-1].addr
			case z.n >= ftDegree:
				// Replace by the successor, then delete that from z.
				w := z
				for !w.leaf {
					w = w.kids[0]
				}
				x.items[i] = w.items[0]
				size, addr = w.items[0].size, w.items[0].addr
				i++
			default:
				// The item moves down into the merged child.
				t.merge(x, i)
			}
			path[depth] = ftStep[B]{x, i}
			depth++
			x = x.kids[i]
			continue
		}
		c := x.kids[i]
		if c.n == ftDegree-1 {
			switch {
			case i > 0 && x.kids[i-1].n >= ftDegree:
				t.rotateRight(x, i-1)
				t.fixKid(x, i-1)
			case i < x.n && x.kids[i+1].n >= ftDegree:
				t.rotateLeft(x, i)
				t.fixKid(x, i+1)
			case i < x.n:
				t.merge(x, i)
			default:
				i--
				c = x.kids[i]
				t.merge(x, i)
			}
		}
		path[depth] = ftStep[B]{x, i}
		depth++
		x = c
	}
	if t.byAddr {
		for k := depth - 1; k >= 0; k-- {
			t.fixKid(path[k].x, path[k].i)
		}
	}
	t.len--
	if r := t.root; r.n == 0 && !r.leaf {
		t.root = r.kids[0]
		t.recycle(r)
	}
}

// resize sets the address and size of the block at oldAddr to addr and
// size in place; t is a first-fit tree and the block's place in address
// order must not change.
func (t *freeTree[B]) resize(oldAddr, addr, size uint64) {
	var path [ftMaxDepth]ftStep[B]
	depth := 0
	x := t.root
	var old uint64
	for {
		i := t.search(x, 0, oldAddr)
		if i < x.n && x.items[i].addr == oldAddr {
			it := &x.items[i]
			old = it.size
			it.addr, it.size = addr, size
			break
		}
		if x.leaf {
			panic(fmt.Sprintf("policies: free tree: no block at %#x", oldAddr))
		}
		path[depth] = ftStep[B]{x, i}
		depth++
		x = x.kids[i]
	}
	if size >= old {
		// A grown block raises the maxima on its path, at most.
		for k := range depth {
			if s := path[k]; s.x.kmax[s.i] < size {
				s.x.kmax[s.i] = size
			}
		}
		return
	}
	// A shrunk block lowers them only where it was the largest.
	for k := depth - 1; k >= 0; k-- {
		s := path[k]
		m := t.nodeMax(s.x.kids[s.i])
		if m == s.x.kmax[s.i] {
			break
		}
		s.x.kmax[s.i] = m
	}
}

// rotateRight moves the last item of child i of x up into x, and x's item
// i down to the front of child i+1 (with the last child of child i).
func (t *freeTree[B]) rotateRight(x *ftNode[B], i int) {
	l, c := x.kids[i], x.kids[i+1]
	copy(c.items[1:c.n+1], c.items[:c.n])
	c.items[0] = x.items[i]
	if !c.leaf {
		copy(c.kids[1:c.n+2], c.kids[:c.n+1])
		copy(c.kmax[1:c.n+2], c.kmax[:c.n+1])
		c.kids[0], c.kmax[0] = l.kids[l.n], l.kmax[l.n]
		l.kids[l.n], l.kmax[l.n] = nil, 0
	}
	c.n++
	x.items[i] = l.items[l.n-1]
	l.items[l.n-1] = ftItem[B]{}
	l.n--
}

// rotateLeft moves the first item of child i+1 of x up into x, and x's
// item i down to the end of child i (with the first child of child i+1).
func (t *freeTree[B]) rotateLeft(x *ftNode[B], i int) {
	c, r := x.kids[i], x.kids[i+1]
	c.items[c.n] = x.items[i]
	if !c.leaf {
		c.kids[c.n+1], c.kmax[c.n+1] = r.kids[0], r.kmax[0]
	}
	c.n++
	x.items[i] = r.items[0]
	copy(r.items[:r.n-1], r.items[1:r.n])
	r.items[r.n-1] = ftItem[B]{}
	if !r.leaf {
		copy(r.kids[:r.n], r.kids[1:r.n+1])
		copy(r.kmax[:r.n], r.kmax[1:r.n+1])
		r.kids[r.n], r.kmax[r.n] = nil, 0
	}
	r.n--
}

// merge joins x's item i and child i+1 of x onto the end of child i; the
// caller brings child i's maximum up to date.
func (t *freeTree[B]) merge(x *ftNode[B], i int) {
	y, z := x.kids[i], x.kids[i+1]
	y.items[y.n] = x.items[i]
	copy(y.items[y.n+1:], z.items[:z.n])
	if !y.leaf {
		copy(y.kids[y.n+1:], z.kids[:z.n+1])
		copy(y.kmax[y.n+1:], z.kmax[:z.n+1])
	}
	y.n += z.n + 1
	copy(x.items[i:x.n-1], x.items[i+1:x.n])
	x.items[x.n-1] = ftItem[B]{}
	copy(x.kids[i+1:x.n], x.kids[i+2:x.n+1])
	copy(x.kmax[i+1:x.n], x.kmax[i+2:x.n+1])
	x.kids[x.n], x.kmax[x.n] = nil, 0
	x.n--
	t.recycle(z)
}

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
	ftDegree   = 12 // minimum degree: nodes hold ftDegree-1 .. 2*ftDegree-1 items
	ftMaxItems = 2*ftDegree - 1
	ftMaxDepth = 24 // above the height of any tree of 2^64 items (at most log12(2^63), under 18)
)

// ftNode is a node of a freeTree. The key of item i, the size and address
// in bytes of its free block, is sizes[i] and addrs[i]: kept apart from the
// blocks, so that a search scans pointer-free memory, and apart from each
// other, so that a scan of one order touches half the cache lines.
type ftNode[B any] struct {
	n     int
	leaf  bool
	sizes [ftMaxItems]uint64
	addrs [ftMaxItems]uint64
	kids  [ftMaxItems + 1]*ftNode[B]
	vals  [ftMaxItems]B // the block of each item
	// kmax[i] is the largest size under kids[i]; first-fit trees only.
	kmax [ftMaxItems + 1]uint64
}

// open makes room for an item at i, moving items i.. one place up; x is
// not full.
func (x *ftNode[B]) open(i int) {
	for j := x.n; j > i; j-- {
		x.sizes[j], x.addrs[j], x.vals[j] = x.sizes[j-1], x.addrs[j-1], x.vals[j-1]
	}
}

// set sets item i of x.
func (x *ftNode[B]) set(i int, size, addr uint64, b B) {
	x.sizes[i], x.addrs[i], x.vals[i] = size, addr, b
}

// setFrom sets item i of x to item j of y.
func (x *ftNode[B]) setFrom(i int, y *ftNode[B], j int) {
	x.sizes[i], x.addrs[i], x.vals[i] = y.sizes[j], y.addrs[j], y.vals[j]
}

// cut removes item i of x, moving the items after it one place down, and
// clears the slot left free.
func (x *ftNode[B]) cut(i int) {
	n := x.n - 1
	for j := i; j < n; j++ {
		x.sizes[j], x.addrs[j], x.vals[j] = x.sizes[j+1], x.addrs[j+1], x.vals[j+1]
	}
	var zero B
	x.vals[n] = zero
	x.n = n
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
	n := x.n
	i := 0
	if t.byAddr {
		// Branch-free: the place of an address in a node is unpredictable.
		for _, a := range x.addrs[:n] {
			i += b2i(a < addr)
		}
		return i
	}
	// Under best fit an early exit pays: the scan of addresses is short
	// and reads a second array.
	for i < n && x.sizes[i] < size {
		i++
	}
	for i < n && x.sizes[i] == size && x.addrs[i] < addr {
		i++
	}
	return i
}

// b2i returns 1 for true, 0 for false, without a branch.
func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// before reports whether item i of x comes before the key (size, addr).
func (t *freeTree[B]) before(x *ftNode[B], i int, size, addr uint64) bool {
	if t.byAddr {
		return x.addrs[i] < addr
	}
	return x.sizes[i] < size || x.sizes[i] == size && x.addrs[i] < addr
}

// is reports whether item i of x has the key (size, addr).
func (t *freeTree[B]) is(x *ftNode[B], i int, size, addr uint64) bool {
	return x.addrs[i] == addr && (t.byAddr || x.sizes[i] == size)
}

// nodeMax returns the largest size under x, from its items and its
// children's recorded maxima.
func (t *freeTree[B]) nodeMax(x *ftNode[B]) uint64 {
	var m uint64
	for _, s := range x.sizes[:x.n] {
		m = max(m, s)
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
// best-fit tree. It is lower(n, 0): no address is below 0.
func (t *freeTree[B]) best(n uint64) (B, bool) { return t.lower(n, 0) }

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
			if x.sizes[i] >= n {
				return x.vals[i], true
			}
		}
		if x.kmax[x.n] < n {
			var zero B
			return zero, false
		}
		x = x.kids[x.n]
	}
	for i, s := range x.sizes[:x.n] {
		if s >= n {
			return x.vals[i], true
		}
	}
	// Only the root can get here: a child is entered only when it holds a
	// block that fits.
	var zero B
	return zero, false
}

// firstWhere returns the first block in t's order of at least n bytes for
// which ok is true, and whether there is one: in a first-fit tree the
// lowest-addressed, in a best-fit tree the smallest (the lowest second key
// among equal sizes).
func (t *freeTree[B]) firstWhere(n uint64, ok func(B) bool) (B, bool) {
	// mayFit reports whether child i of x can hold a block of n bytes: by
	// its largest size in a first-fit tree; in a best-fit tree, child i
	// holds the keys below item i, all too small when item i is.
	mayFit := func(x *ftNode[B], i int) bool {
		if t.byAddr {
			return x.kmax[i] >= n
		}
		return i == x.n || x.sizes[i] >= n
	}
	var walk func(x *ftNode[B]) (B, bool)
	walk = func(x *ftNode[B]) (B, bool) {
		for i := 0; i <= x.n; i++ {
			if !x.leaf && mayFit(x, i) {
				if b, found := walk(x.kids[i]); found {
					return b, true
				}
			}
			if i < x.n && x.sizes[i] >= n && ok(x.vals[i]) {
				return x.vals[i], true
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
			list = append(list, x.vals[i])
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

// lower returns the first block whose key is not below (size, addr), and
// whether there is one; t is a best-fit tree.
func (t *freeTree[B]) lower(size, addr uint64) (B, bool) {
	var b B
	found := false
	for x := t.root; x != nil; {
		i := t.search(x, size, addr)
		if i < x.n {
			b, found = x.vals[i], true
		}
		if x.leaf {
			break
		}
		x = x.kids[i]
	}
	return b, found
}

// last returns the block of the largest key and whether t has one; t is a
// best-fit tree.
func (t *freeTree[B]) last() (B, bool) {
	x := t.root
	if t.len == 0 {
		var zero B
		return zero, false
	}
	for !x.leaf {
		x = x.kids[x.n]
	}
	return x.vals[x.n-1], true
}

// any returns some block of t and whether t has one.
func (t *freeTree[B]) any() (B, bool) {
	if t.len == 0 {
		var zero B
		return zero, false
	}
	return t.root.vals[0], true
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
	return x.sizes[x.n-1]
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
			x.open(i)
			x.set(i, size, addr, b)
			x.n++
			break
		}
		if x.kids[i].n == ftMaxItems {
			t.splitChild(x, i)
			if t.before(x, i, size, addr) {
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
	copy(z.sizes[:ftDegree-1], y.sizes[ftDegree:])
	copy(z.addrs[:ftDegree-1], y.addrs[ftDegree:])
	copy(z.vals[:ftDegree-1], y.vals[ftDegree:])
	if !y.leaf {
		copy(z.kids[:ftDegree], y.kids[ftDegree:])
		copy(z.kmax[:ftDegree], y.kmax[ftDegree:])
		clear(y.kids[ftDegree:])
		clear(y.kmax[ftDegree:])
	}
	copy(x.kids[i+2:x.n+2], x.kids[i+1:x.n+1])
	copy(x.kmax[i+2:x.n+2], x.kmax[i+1:x.n+1])
	x.kids[i+1] = z
	x.open(i)
	x.setFrom(i, y, ftDegree-1)
	x.n++
	clear(y.vals[ftDegree-1:])
	y.n = ftDegree - 1
	t.fixKid(x, i)
	t.fixKid(x, i+1)
}

// delete removes the block with key (size, addr), or addr alone in a
// first-fit tree, which must be in t. An item of an inner node is first
// replaced by its predecessor, so that the removal is always from a leaf;
// then, from the bottom up, a node left short borrows from a sibling or
// merges with one. Nodes are restructured only where they run short, and
// in a first-fit tree the children's maxima on the path are recomputed.
func (t *freeTree[B]) delete(size, addr uint64) {
	var path [ftMaxDepth]ftStep[B]
	depth := 0
	x := t.root
	var i int
	for {
		i = t.search(x, size, addr)
		if i < x.n && t.is(x, i, size, addr) {
			break
		}
		if x.leaf {
			panic(fmt.Sprintf("policies: free tree: no block of %d bytes at %#x", size, addr))
		}
		path[depth] = ftStep[B]{x, i}
		depth++
		x = x.kids[i]
	}
	t.deleteAt(&path, depth, x, i)
}

// takeBest removes and returns the block best returns for n bytes, and
// whether there is one, in one descent; t is a best-fit tree.
func (t *freeTree[B]) takeBest(n uint64) (B, bool) {
	var path [ftMaxDepth]ftStep[B]
	depth, at := 0, 0
	var fx *ftNode[B]
	fi := 0
	for x := t.root; x != nil; {
		i := 0
		for i < x.n && x.sizes[i] < n {
			i++
		}
		if i < x.n {
			// The deepest item found is the answer; the steps above it
			// are the steps towards its key.
			fx, fi, at = x, i, depth
		}
		if x.leaf {
			break
		}
		path[depth] = ftStep[B]{x, i}
		depth++
		x = x.kids[i]
	}
	if fx == nil {
		var zero B
		return zero, false
	}
	b := fx.vals[fi]
	t.deleteAt(&path, at, fx, fi)
	return b, true
}

// takeFirst finds the block first returns for n bytes and, if its
// address is below the address below, cuts n bytes from its front in one
// descent: a block of n bytes is removed, a larger one keeps its place
// with its address n bytes higher and its size n bytes less. It returns
// the block, its size before the cut, and whether there is one (below
// below); t is a first-fit tree. A non-nil ok may refuse the block found:
// then nothing is cut and takeFirst reports false. The block's own fields
// are the caller's to update.
func (t *freeTree[B]) takeFirst(n, below uint64, ok func(B) bool) (B, uint64, bool) {
	var path [ftMaxDepth]ftStep[B]
	depth := 0
	x := t.root
	var zero B
	if x == nil {
		return zero, 0, false
	}
	i := 0
next:
	for !x.leaf {
		for i = 0; i < x.n; i++ {
			if x.kmax[i] >= n {
				path[depth] = ftStep[B]{x, i}
				depth++
				x = x.kids[i]
				continue next
			}
			if x.sizes[i] >= n {
				break next
			}
		}
		if x.kmax[x.n] < n {
			return zero, 0, false
		}
		path[depth] = ftStep[B]{x, x.n}
		depth++
		x = x.kids[x.n]
	}
	if x.leaf {
		for i = 0; i < x.n && x.sizes[i] < n; i++ {
		}
		if i == x.n {
			// Only the root can get here: a child is entered only when
			// it holds a block that fits.
			return zero, 0, false
		}
	}
	b := x.vals[i]
	if x.addrs[i] >= below || ok != nil && !ok(b) {
		return zero, 0, false
	}
	old := x.sizes[i]
	if old == n {
		t.deleteAt(&path, depth, x, i)
		return b, old, true
	}
	x.addrs[i], x.sizes[i] = x.addrs[i]+n, old-n
	t.shrunk(&path, depth, old)
	return b, old, true
}

// deleteAt removes item i of node x, reached by the steps path[:depth]
// from the root.
func (t *freeTree[B]) deleteAt(path *[ftMaxDepth]ftStep[B], depth int, x *ftNode[B], i int) {
	if !x.leaf {
		// The predecessor, the last item of the left subtree, takes the
		// item's place; it is removed from its leaf instead.
		path[depth] = ftStep[B]{x, i}
		depth++
		w := x.kids[i]
		for !w.leaf {
			path[depth] = ftStep[B]{w, w.n}
			depth++
			w = w.kids[w.n]
		}
		x.setFrom(i, w, w.n-1)
		x, i = w, w.n-1
	}
	x.cut(i)
	for depth > 0 && x.n < ftDegree-1 {
		depth--
		p, j := path[depth].x, path[depth].i // x is child j of p
		switch {
		case j > 0 && p.kids[j-1].n >= ftDegree:
			t.rotateRight(p, j-1)
			t.fixKid(p, j-1)
		case j < p.n && p.kids[j+1].n >= ftDegree:
			t.rotateLeft(p, j)
			t.fixKid(p, j+1)
		case j > 0:
			j--
			t.merge(p, j)
		default:
			t.merge(p, j)
		}
		t.fixKid(p, j)
		x = p
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
		if i < x.n && x.addrs[i] == oldAddr {
			old = x.sizes[i]
			x.addrs[i], x.sizes[i] = addr, size
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
	t.shrunk(&path, depth, old)
}

// shrunk brings the maxima on the steps path[:depth] up to date after a
// block under them shrank from old bytes: a shrunk block lowers them only
// where it was the largest, from the bottom up, while the subtree changed
// held the maximum recorded.
func (t *freeTree[B]) shrunk(path *[ftMaxDepth]ftStep[B], depth int, old uint64) {
	for k := depth - 1; k >= 0; k-- {
		s := path[k]
		if s.x.kmax[s.i] > old {
			break
		}
		m := t.nodeMax(s.x.kids[s.i])
		if m == s.x.kmax[s.i] {
			break
		}
		old = s.x.kmax[s.i]
		s.x.kmax[s.i] = m
	}
}

// rotateRight moves the last item of child i of x up into x, and x's item
// i down to the front of child i+1 (with the last child of child i).
func (t *freeTree[B]) rotateRight(x *ftNode[B], i int) {
	l, c := x.kids[i], x.kids[i+1]
	c.open(0)
	c.setFrom(0, x, i)
	if !c.leaf {
		copy(c.kids[1:c.n+2], c.kids[:c.n+1])
		copy(c.kmax[1:c.n+2], c.kmax[:c.n+1])
		c.kids[0], c.kmax[0] = l.kids[l.n], l.kmax[l.n]
		l.kids[l.n], l.kmax[l.n] = nil, 0
	}
	c.n++
	x.setFrom(i, l, l.n-1)
	clear(l.vals[l.n-1 : l.n])
	l.n--
}

// rotateLeft moves the first item of child i+1 of x up into x, and x's
// item i down to the end of child i (with the first child of child i+1).
func (t *freeTree[B]) rotateLeft(x *ftNode[B], i int) {
	c, r := x.kids[i], x.kids[i+1]
	c.setFrom(c.n, x, i)
	if !c.leaf {
		c.kids[c.n+1], c.kmax[c.n+1] = r.kids[0], r.kmax[0]
	}
	c.n++
	x.setFrom(i, r, 0)
	if !r.leaf {
		copy(r.kids[:r.n], r.kids[1:r.n+1])
		copy(r.kmax[:r.n], r.kmax[1:r.n+1])
		r.kids[r.n], r.kmax[r.n] = nil, 0
	}
	r.cut(0)
}

// merge joins x's item i and child i+1 of x onto the end of child i; the
// caller brings child i's maximum up to date.
func (t *freeTree[B]) merge(x *ftNode[B], i int) {
	y, z := x.kids[i], x.kids[i+1]
	y.setFrom(y.n, x, i)
	copy(y.sizes[y.n+1:], z.sizes[:z.n])
	copy(y.addrs[y.n+1:], z.addrs[:z.n])
	copy(y.vals[y.n+1:], z.vals[:z.n])
	if !y.leaf {
		copy(y.kids[y.n+1:], z.kids[:z.n+1])
		copy(y.kmax[y.n+1:], z.kmax[:z.n+1])
	}
	y.n += z.n + 1
	copy(x.kids[i+1:x.n], x.kids[i+2:x.n+1])
	copy(x.kmax[i+1:x.n], x.kmax[i+2:x.n+1])
	x.kids[x.n], x.kmax[x.n] = nil, 0
	x.cut(i)
	t.recycle(z)
}

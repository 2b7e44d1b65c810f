package execpolicy

// ordMap is an ordered map from addresses to sizes in bytes (a treap), for
// the blocks and segments a child holds: floor and ceil find the
// neighbours that an overlap or a containment check needs in O(log n).
type ordMap struct {
	root *ordNode
	n    int
	rng  uint64 // xorshift state for the priorities
	free *ordNode
}

type ordNode struct {
	key, size   uint64
	prio        uint64
	left, right *ordNode
}

func newOrdMap() ordMap { return ordMap{rng: 0x9e3779b97f4a7c15} }

// get returns the size at key k.
func (m *ordMap) get(k uint64) (uint64, bool) {
	for x := m.root; x != nil; {
		switch {
		case k < x.key:
			x = x.left
		case k > x.key:
			x = x.right
		default:
			return x.size, true
		}
	}
	return 0, false
}

// floor returns the entry with the largest key <= k.
func (m *ordMap) floor(k uint64) (key, size uint64, ok bool) {
	for x := m.root; x != nil; {
		if x.key <= k {
			key, size, ok = x.key, x.size, true
			x = x.right
		} else {
			x = x.left
		}
	}
	return key, size, ok
}

// ceil returns the entry with the smallest key >= k.
func (m *ordMap) ceil(k uint64) (key, size uint64, ok bool) {
	for x := m.root; x != nil; {
		if x.key >= k {
			key, size, ok = x.key, x.size, true
			x = x.left
		} else {
			x = x.right
		}
	}
	return key, size, ok
}

// put adds key k with size; k must not be present.
func (m *ordMap) put(k, size uint64) {
	m.rng ^= m.rng << 13
	m.rng ^= m.rng >> 7
	m.rng ^= m.rng << 17
	x := m.free
	if x != nil {
		m.free = x.right
		*x = ordNode{}
	} else {
		x = &ordNode{}
	}
	x.key, x.size, x.prio = k, size, m.rng
	m.root = m.insert(m.root, x)
	m.n++
}

func (m *ordMap) insert(t, x *ordNode) *ordNode {
	if t == nil {
		return x
	}
	if x.prio > t.prio {
		x.left, x.right = split(t, x.key)
		return x
	}
	if x.key < t.key {
		t.left = m.insert(t.left, x)
	} else {
		t.right = m.insert(t.right, x)
	}
	return t
}

// split splits t into the keys below k and those above it.
func split(t *ordNode, k uint64) (lo, hi *ordNode) {
	if t == nil {
		return nil, nil
	}
	if t.key < k {
		t.right, hi = split(t.right, k)
		return t, hi
	}
	lo, t.left = split(t.left, k)
	return lo, t
}

// delete removes key k and reports whether it was present.
func (m *ordMap) delete(k uint64) bool {
	link := &m.root
	for x := *link; x != nil; x = *link {
		switch {
		case k < x.key:
			link = &x.left
		case k > x.key:
			link = &x.right
		default:
			*link = join(x.left, x.right)
			x.left, x.right = nil, m.free
			m.free = x
			m.n--
			return true
		}
	}
	return false
}

// join joins two treaps whose keys are all of a below those of b.
func join(a, b *ordNode) *ordNode {
	switch {
	case a == nil:
		return b
	case b == nil:
		return a
	case a.prio > b.prio:
		a.right = join(a.right, b)
		return a
	default:
		b.left = join(a, b.left)
		return b
	}
}

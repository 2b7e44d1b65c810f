// Package ordmap is an ordered map from uint64 keys (addresses) to values,
// a treap with floor and ceiling queries in O(log n): what the checks of
// live blocks and segments need to find a block's neighbours (the engine's
// invariant checker, an exec: policy's checks of its child's answers).
package ordmap

// Map is an ordered map from uint64 keys: a treap with floor and ceiling
// queries. Its zero value is not ready: make one with New.
type Map[V any] struct {
	root *node[V]
	n    int
	rng  uint64
}

type node[V any] struct {
	key         uint64
	val         V
	prio        uint64
	left, right *node[V]
}

func New[V any]() Map[V] { return Map[V]{rng: 0x9e3779b97f4a7c15} }

func (m *Map[V]) Len() int { return m.n }

func (m *Map[V]) Get(k uint64) (V, bool) {
	for x := m.root; x != nil; {
		switch {
		case k < x.key:
			x = x.left
		case k > x.key:
			x = x.right
		default:
			return x.val, true
		}
	}
	var zero V
	return zero, false
}

// Floor returns the entry with the largest key <= k.
func (m *Map[V]) Floor(k uint64) (uint64, V, bool) {
	var best *node[V]
	for x := m.root; x != nil; {
		if x.key <= k {
			best, x = x, x.right
		} else {
			x = x.left
		}
	}
	if best == nil {
		var zero V
		return 0, zero, false
	}
	return best.key, best.val, true
}

// Ceil returns the entry with the smallest key >= k.
func (m *Map[V]) Ceil(k uint64) (uint64, V, bool) {
	var best *node[V]
	for x := m.root; x != nil; {
		if x.key >= k {
			best, x = x, x.left
		} else {
			x = x.right
		}
	}
	if best == nil {
		var zero V
		return 0, zero, false
	}
	return best.key, best.val, true
}

// Put sets the value of key k.
func (m *Map[V]) Put(k uint64, v V) {
	m.rng ^= m.rng << 13
	m.rng ^= m.rng >> 7
	m.rng ^= m.rng << 17
	m.root = m.insert(m.root, k, v, m.rng)
}

func (m *Map[V]) insert(x *node[V], k uint64, v V, prio uint64) *node[V] {
	if x == nil {
		m.n++
		return &node[V]{key: k, val: v, prio: prio}
	}
	switch {
	case k < x.key:
		x.left = m.insert(x.left, k, v, prio)
		if x.left.prio > x.prio {
			l := x.left
			x.left, l.right = l.right, x
			return l
		}
	case k > x.key:
		x.right = m.insert(x.right, k, v, prio)
		if x.right.prio > x.prio {
			r := x.right
			x.right, r.left = r.left, x
			return r
		}
	default:
		x.val = v
	}
	return x
}

// Delete removes key k if present.
func (m *Map[V]) Delete(k uint64) {
	p := &m.root
	for *p != nil && (*p).key != k {
		if k < (*p).key {
			p = &(*p).left
		} else {
			p = &(*p).right
		}
	}
	if *p == nil {
		return
	}
	*p = merge((*p).left, (*p).right)
	m.n--
}

// merge joins two treaps whose keys are ordered (all of a before all of b).
func merge[V any](a, b *node[V]) *node[V] {
	switch {
	case a == nil:
		return b
	case b == nil:
		return a
	case a.prio > b.prio:
		a.right = merge(a.right, b)
		return a
	default:
		b.left = merge(a, b.left)
		return b
	}
}

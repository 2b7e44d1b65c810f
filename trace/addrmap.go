package trace

import "iter"

// AddrMap is a hash table keyed by addresses, with open addressing, linear
// probing and backward-shift deletion: about twice as fast as a Go map for
// the per-event lookups of a replay or a validation. The zero value is
// ready to use. It is not safe for concurrent use.
type AddrMap[V any] struct {
	slots []addrSlot[V]
	n     int
	shift uint // 64 - log2(len(slots))
}

type addrSlot[V any] struct {
	addr uint64
	val  V
	used bool
}

func (m *AddrMap[V]) init(size int) {
	m.slots = make([]addrSlot[V], size)
	m.shift = 64
	for s := size; s > 1; s >>= 1 {
		m.shift--
	}
	m.n = 0
}

func (m *AddrMap[V]) home(addr uint64) int {
	return int((addr * 0x9e3779b97f4a7c15) >> m.shift)
}

// Get returns the value at addr and whether there is one.
func (m *AddrMap[V]) Get(addr uint64) (V, bool) {
	if p := m.Ptr(addr); p != nil {
		return *p, true
	}
	var zero V
	return zero, false
}

// Insert sets the value at addr unless addr is present, in which case it
// leaves it and returns the value there and true.
func (m *AddrMap[V]) Insert(addr uint64, v V) (V, bool) {
	p, ok := m.Ref(addr)
	if ok {
		return *p, true
	}
	*p = v
	var zero V
	return zero, false
}

// Ref returns a pointer to the value at addr, inserting the zero value
// when addr is absent, and whether it was present. The pointer is valid
// until the next Insert, Put, Ref or Delete.
func (m *AddrMap[V]) Ref(addr uint64) (*V, bool) {
	if len(m.slots) == 0 {
		m.init(64)
	} else if 2*(m.n+1) > len(m.slots) {
		m.grow()
	}
	mask := len(m.slots) - 1
	for i := m.home(addr); ; i = (i + 1) & mask {
		s := &m.slots[i]
		if !s.used {
			s.addr, s.used = addr, true
			m.n++
			return &s.val, false
		}
		if s.addr == addr {
			return &s.val, true
		}
	}
}

// Ptr returns a pointer to the value at addr, nil when absent. The pointer
// is valid until the next Insert, Put, Ref or Delete.
func (m *AddrMap[V]) Ptr(addr uint64) *V {
	if m.n == 0 {
		return nil
	}
	mask := len(m.slots) - 1
	for i := m.home(addr); ; i = (i + 1) & mask {
		s := &m.slots[i]
		if !s.used {
			return nil
		}
		if s.addr == addr {
			return &s.val
		}
	}
}

// Put sets the value at addr.
func (m *AddrMap[V]) Put(addr uint64, v V) {
	p, _ := m.Ref(addr)
	*p = v
}

// Delete removes addr, if present.
func (m *AddrMap[V]) Delete(addr uint64) { m.Take(addr) }

// Take removes addr and returns its value, if present, shifting the later
// slots of its probe run back so that lookups stay correct without
// tombstones.
func (m *AddrMap[V]) Take(addr uint64) (V, bool) {
	var zero V
	if m.n == 0 {
		return zero, false
	}
	mask := len(m.slots) - 1
	i := m.home(addr)
	for ; ; i = (i + 1) & mask {
		s := &m.slots[i]
		if !s.used {
			return zero, false
		}
		if s.addr == addr {
			break
		}
	}
	v := m.slots[i].val
	m.n--
	for j := (i + 1) & mask; ; j = (j + 1) & mask {
		s := &m.slots[j]
		if !s.used {
			break
		}
		h := m.home(s.addr)
		// s may move to i when its home is outside the cyclic range (i, j].
		if (j > i && (h <= i || h > j)) || (j < i && h <= i && h > j) {
			m.slots[i] = *s
			i = j
		}
	}
	m.slots[i] = addrSlot[V]{}
	return v, true
}

func (m *AddrMap[V]) grow() {
	old := m.slots
	m.init(2 * len(old))
	for k := range old {
		if old[k].used {
			m.Put(old[k].addr, old[k].val)
		}
	}
}

// Len returns the number of addresses held.
func (m *AddrMap[V]) Len() int { return m.n }

// All returns an iterator over the addresses held and their values, in no
// particular order. The table must not be changed during the iteration.
func (m *AddrMap[V]) All() iter.Seq2[uint64, V] {
	return func(yield func(uint64, V) bool) {
		for k := range m.slots {
			if s := &m.slots[k]; s.used && !yield(s.addr, s.val) {
				return
			}
		}
	}
}

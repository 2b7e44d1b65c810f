package trace

import "iter"

// AddrMap is a hash table keyed by addresses: an index of 4-byte slots
// with open addressing, linear probing and backward-shift deletion, over
// records (address and value) kept densely in chunks. A lookup is about
// three times as fast as a Go map's for the per-event lookups of a replay
// or a validation, and a live address costs its record (8 bytes plus the
// value) and four to eight index slots (the index grows at a quarter
// full: 16 to 32 bytes), where a table of records in the slots themselves
// would cost four to eight records. A slot holds a record's number only,
// no part of its address's hash: at a quarter full a probe mostly meets
// the record sought or an empty slot, so that the record's address is the
// check. (Index slots of 8 bytes with 32 bits of hash, grown at half full
// for the same bytes per address, made a replay of kv_decode's mallocs
// and frees 1.4 times as slow in the table: longer probe runs and their
// mispredicted branches.) The zero value is ready to use. It is not safe
// for concurrent use.
type AddrMap[V any] struct {
	// index holds 0 for an empty slot, else the record's number plus one.
	index  []uint32
	chunks [][]addrRecord[V] // records, addrChunk to a chunk
	n      int               // addresses held
	top    uint32            // records ever used
	free   []uint32          // numbers of records freed, for reuse
	shift  uint              // 64 - log2(len(index))
}

type addrRecord[V any] struct {
	addr uint64
	val  V
}

// addrChunk is the number of records of a chunk: growth appends a chunk
// and copies no record, except in the first chunk, which grows by doubling
// so that a small table stays small.
const addrChunk = 1 << 13

func (m *AddrMap[V]) init(size int) {
	m.index = make([]uint32, size)
	m.shift = 64
	for s := size; s > 1; s >>= 1 {
		m.shift--
	}
}

func addrHash(addr uint64) uint64 { return addr * 0x9e3779b97f4a7c15 }

// home returns the home slot of addr.
func (m *AddrMap[V]) home(addr uint64) int { return int(addrHash(addr) >> m.shift) }

// rec returns the record of a non-empty index slot.
func (m *AddrMap[V]) rec(slot uint32) *addrRecord[V] {
	k := slot - 1
	return &m.chunks[k/addrChunk][k%addrChunk]
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
	if len(m.index) == 0 {
		m.init(64)
	} else if 4*(m.n+1) > len(m.index) {
		m.grow()
	}
	mask := len(m.index) - 1
	for i := m.home(addr); ; i = (i + 1) & mask {
		s := m.index[i]
		if s == 0 {
			k := m.newRecord()
			m.index[i] = k + 1
			r := &m.chunks[k/addrChunk][k%addrChunk]
			r.addr = addr
			m.n++
			return &r.val, false
		}
		if r := m.rec(s); r.addr == addr {
			return &r.val, true
		}
	}
}

// newRecord returns the number of an unused record, zero-valued.
func (m *AddrMap[V]) newRecord() uint32 {
	if n := len(m.free); n > 0 {
		k := m.free[n-1]
		m.free = m.free[:n-1]
		return k
	}
	k := m.top
	m.top++
	c := int(k / addrChunk)
	if c == len(m.chunks) {
		size := addrChunk
		if c == 0 {
			size = 16
		}
		m.chunks = append(m.chunks, make([]addrRecord[V], 0, size))
	}
	ch := &m.chunks[c]
	if len(*ch) == cap(*ch) {
		grown := make([]addrRecord[V], len(*ch), 2*cap(*ch))
		copy(grown, *ch)
		*ch = grown
	}
	*ch = (*ch)[:len(*ch)+1]
	return k
}

// Ptr returns a pointer to the value at addr, nil when absent. The pointer
// is valid until the next Insert, Put, Ref or Delete.
func (m *AddrMap[V]) Ptr(addr uint64) *V {
	if m.n == 0 {
		return nil
	}
	mask := len(m.index) - 1
	for i := m.home(addr); ; i = (i + 1) & mask {
		s := m.index[i]
		if s == 0 {
			return nil
		}
		if r := m.rec(s); r.addr == addr {
			return &r.val
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
	mask := len(m.index) - 1
	i := m.home(addr)
	var r *addrRecord[V]
	for ; ; i = (i + 1) & mask {
		s := m.index[i]
		if s == 0 {
			return zero, false
		}
		if r = m.rec(s); r.addr == addr {
			break
		}
	}
	v := r.val
	*r = addrRecord[V]{}
	m.free = append(m.free, m.index[i]-1)
	m.n--
	for j := (i + 1) & mask; ; j = (j + 1) & mask {
		s := m.index[j]
		if s == 0 {
			break
		}
		h := m.home(m.rec(s).addr)
		// s may move to i when its home is outside the cyclic range (i, j].
		if (j > i && (h <= i || h > j)) || (j < i && h <= i && h > j) {
			m.index[i] = s
			i = j
		}
	}
	m.index[i] = 0
	return v, true
}

// grow doubles the index; the records stay where they are.
func (m *AddrMap[V]) grow() {
	old := m.index
	m.init(2 * len(old))
	mask := len(m.index) - 1
	for _, s := range old {
		if s == 0 {
			continue
		}
		i := m.home(m.rec(s).addr)
		for m.index[i] != 0 {
			i = (i + 1) & mask
		}
		m.index[i] = s
	}
}

// Len returns the number of addresses held.
func (m *AddrMap[V]) Len() int { return m.n }

// All returns an iterator over the addresses held and their values, in no
// particular order (that of the index, the same for the same operations).
// The table must not be changed during the iteration.
func (m *AddrMap[V]) All() iter.Seq2[uint64, V] {
	return func(yield func(uint64, V) bool) {
		for _, s := range m.index {
			if s != 0 {
				if r := m.rec(s); !yield(r.addr, r.val) {
					return
				}
			}
		}
	}
}

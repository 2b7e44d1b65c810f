package sim

// liveTable is an open-addressing hash table from trace addresses to live
// allocations, with linear probing and backward-shift deletion: the
// engine's hottest structure, about twice as fast as a Go map here.
type liveTable struct {
	slots []liveSlot
	n     int
	shift uint // 64 - log2(len(slots))
}

type liveSlot struct {
	addr uint64
	val  liveAlloc
	used bool
}

func newLiveTable() *liveTable {
	t := &liveTable{}
	t.init(1024)
	return t
}

func (t *liveTable) init(size int) {
	t.slots = make([]liveSlot, size)
	t.shift = 64
	for s := size; s > 1; s >>= 1 {
		t.shift--
	}
	t.n = 0
}

func (t *liveTable) home(addr uint64) int {
	return int((addr * 0x9e3779b97f4a7c15) >> t.shift)
}

// get returns the allocation at addr and whether there is one.
func (t *liveTable) get(addr uint64) (liveAlloc, bool) {
	mask := len(t.slots) - 1
	for i := t.home(addr); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if !s.used {
			return liveAlloc{}, false
		}
		if s.addr == addr {
			return s.val, true
		}
	}
}

// put sets the allocation at addr.
func (t *liveTable) put(addr uint64, v liveAlloc) {
	if 4*(t.n+1) > 3*len(t.slots) {
		t.grow()
	}
	mask := len(t.slots) - 1
	for i := t.home(addr); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if !s.used {
			*s = liveSlot{addr: addr, val: v, used: true}
			t.n++
			return
		}
		if s.addr == addr {
			s.val = v
			return
		}
	}
}

// remove deletes addr, if present, shifting later slots of its probe run
// back so that lookups stay correct without tombstones.
func (t *liveTable) remove(addr uint64) {
	mask := len(t.slots) - 1
	i := t.home(addr)
	for ; ; i = (i + 1) & mask {
		s := &t.slots[i]
		if !s.used {
			return
		}
		if s.addr == addr {
			break
		}
	}
	t.n--
	for j := (i + 1) & mask; ; j = (j + 1) & mask {
		s := &t.slots[j]
		if !s.used {
			break
		}
		h := t.home(s.addr)
		// s may move to i if its home is not in the cyclic range (i, j].
		if (j > i && (h <= i || h > j)) || (j < i && h <= i && h > j) {
			t.slots[i] = *s
			i = j
		}
	}
	t.slots[i] = liveSlot{}
}

func (t *liveTable) grow() {
	old := t.slots
	t.init(2 * len(old))
	for k := range old {
		if old[k].used {
			t.put(old[k].addr, old[k].val)
		}
	}
}

// len returns the number of live allocations.
func (t *liveTable) len() int { return t.n }

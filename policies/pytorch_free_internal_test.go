package policies

import (
	"cmp"
	"math/rand"
	"slices"
	"testing"
)

// TestPtFree checks the free blocks' bins against a sorted slice under
// random inserts, deletes and rekeys (a delete and an insert), of sizes
// that share bins and tie (multiples of 512 up to 32 KiB) and of sizes
// across the range of bins (up to 2^64-1), with up to 20 and up to 400
// blocks, and lowerBound, successor, max and appendIf after
// each. The long cases put three blocks in four in one bin (eight sizes
// from 8 KiB by 64 bytes), growing to up to 1500 blocks and shrinking to
// none in turns of 2000 steps, so that the bin is indexed and unindexed
// again many times; they check that it was.
func TestPtFree(t *testing.T) {
	for _, c := range []struct {
		most       int
		wide, long bool
	}{{20, false, false}, {400, false, false}, {20, true, false}, {400, true, false}, {1500, false, true}} {
		rng := rand.New(rand.NewSource(int64(c.most)))
		size := func() uint64 {
			switch {
			case c.wide:
				return rng.Uint64() >> rng.Intn(64)
			case c.long && rng.Intn(4) != 0:
				return 8192 + uint64(rng.Intn(8))*64
			}
			return uint64(rng.Intn(64)) * 512
		}
		indexed, unindexed := 0, 0
		var set ptFree
		var model []*ptBlock
		less := func(a, b *ptBlock) int {
			return cmp.Or(cmp.Compare(a.size, b.size), cmp.Compare(a.addr, b.addr))
		}
		fresh := func(b *ptBlock) *ptBlock {
			for {
				b.size, b.addr = size(), uint64(rng.Intn(1<<16))*512
				if _, found := slices.BinarySearchFunc(model, b, less); !found {
					return b
				}
			}
		}
		lowerBound := func(size, addr uint64) *ptBlock {
			i, _ := slices.BinarySearchFunc(model, &ptBlock{size: size, addr: addr}, less)
			if i < len(model) {
				return model[i]
			}
			return nil
		}
		for step := range 20000 {
			op := rng.Intn(3)
			if c.long {
				// Grow in even turns, shrink in odd ones.
				op = min(op, 1)
				if rng.Intn(8) != 0 {
					op = step / 2000 % 2
				}
			}
			switch {
			case len(model) == 0 || op == 0 && len(model) < c.most:
				b := fresh(&ptBlock{})
				set.insert(b)
				i, _ := slices.BinarySearchFunc(model, b, less)
				model = slices.Insert(model, i, b)
			case op == 1:
				k := rng.Intn(len(model))
				set.delete(model[k])
				model = slices.Delete(model, k, k+1)
			default:
				k := rng.Intn(len(model))
				b := model[k]
				set.delete(b)
				model = slices.Delete(model, k, k+1)
				fresh(b)
				set.insert(b)
				i, _ := slices.BinarySearchFunc(model, b, less)
				model = slices.Insert(model, i, b)
			}
			got := set.appendIf(nil, func(*ptBlock) bool { return true })
			if !slices.Equal(got, model) {
				t.Fatalf("%+v, step %d: %d blocks in order, want %d", c, step, len(got), len(model))
			}
			for k, b := range model {
				var want *ptBlock
				if k+1 < len(model) {
					want = model[k+1]
				}
				if got := set.successor(b); got != want {
					t.Fatalf("%+v, step %d: successor of block %d is %v, want %v", c, step, k, got, want)
				}
			}
			s := size()
			if b, want := set.lowerBound(s), lowerBound(s, 0); b != want {
				t.Fatalf("%+v, step %d: lowerBound(%d) = %v, want %v", c, step, s, b, want)
			}
			var want *ptBlock
			if len(model) > 0 {
				want = model[len(model)-1]
			}
			if b := set.max(); b != want {
				t.Fatalf("%+v, step %d: max = %v, want %v", c, step, b, want)
			}
			for _, b := range model {
				if b.indexed != (set.long[int(b.bin)] != nil) {
					t.Fatalf("%+v, step %d: the block of %d bytes at %#x says indexed %v, its bin %d is not", c, step, b.size, b.addr, b.indexed, b.bin)
				}
			}
			if set.long != nil {
				indexed++
				for i, ix := range set.long {
					if n := binLen(&set, i); ix.len != n || n < ptUnindex {
						t.Fatalf("%+v, step %d: bin %d indexed with %d blocks, holds %d", c, step, i, ix.len, n)
					}
				}
			} else if indexed > 0 {
				unindexed++
			}
		}
		if c.long && (indexed < 1000 || unindexed < 1000) {
			t.Errorf("%+v: %d steps with a bin indexed, %d steps without after one, want both 1000 or more", c, indexed, unindexed)
		}
	}
}

// binLen returns the number of blocks in bin i of t.
func binLen(t *ptFree, i int) int {
	n := 0
	for c := t.head(i); c != nil; c = c.binNext {
		n++
	}
	return n
}

// TestPtBin checks that the bins are in size order, 16 to each power of
// two, and that the largest size's fits.
func TestPtBin(t *testing.T) {
	for _, c := range []struct {
		size uint64
		bin  int
	}{{0, 0}, {15, 15}, {16, 16}, {31, 31}, {32, 32}, {33, 32}, {34, 33}, {63, 47}, {64, 48},
		{512, 96}, {1 << 20, 16*16 + 16}, {1<<20 + 1<<16, 16*16 + 17}, {1<<21 - 1, 16*16 + 31}, {^uint64(0), 975}} {
		if got := ptBin(c.size); got != c.bin {
			t.Errorf("ptBin(%d) = %d, want %d", c.size, got, c.bin)
		}
	}
	if ptBin(^uint64(0)) >= ptBins {
		t.Errorf("ptBin(2^64-1) = %d, past the %d bins", ptBin(^uint64(0)), ptBins)
	}
	rng := rand.New(rand.NewSource(1))
	for range 100000 {
		a, b := rng.Uint64()>>rng.Intn(64), rng.Uint64()>>rng.Intn(64)
		if a <= b && ptBin(a) > ptBin(b) {
			t.Fatalf("ptBin(%d) = %d is after ptBin(%d) = %d", a, ptBin(a), b, ptBin(b))
		}
	}
}

// TestPtActive checks the table of allocated blocks against a Go map
// under random puts and takes of clustered addresses (a probe run that
// wraps around the table's end included), up to 3000 held.
func TestPtActive(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	var m ptActive
	model := map[uint64]*ptBlock{}
	var held []uint64
	for step := range 200000 {
		if len(held) == 0 || rng.Intn(2) == 0 && len(held) < 3000 {
			addr := 0x7f0000000000 + uint64(rng.Intn(1<<14))*512
			if _, dup := model[addr]; dup {
				continue
			}
			b := &ptBlock{addr: addr}
			m.put(addr, b)
			model[addr] = b
			held = append(held, addr)
		} else {
			k := rng.Intn(len(held))
			addr := held[k]
			held[k] = held[len(held)-1]
			held = held[:len(held)-1]
			if got := m.take(addr); got != model[addr] {
				t.Fatalf("step %d: take(%#x) = %v, want %v", step, addr, got, model[addr])
			}
			delete(model, addr)
		}
		if m.n != len(model) {
			t.Fatalf("step %d: %d held, want %d", step, m.n, len(model))
		}
		if probe := 0x7f0000000000 + uint64(rng.Intn(1<<14))*512; m.take(probe) != model[probe] {
			t.Fatalf("step %d: take(%#x) of a block %v", step, probe, model[probe])
		} else if b := model[probe]; b != nil {
			m.put(probe, b) // put back what the probe took
		}
	}
	for _, addr := range held {
		if m.take(addr) != model[addr] {
			t.Fatalf("the end: take(%#x) wrong", addr)
		}
	}
	if m.n != 0 || m.take(0x7f0000000000) != nil || m.take(0) != nil {
		t.Fatal("the end: not empty")
	}
}

// TestPtTops checks the heap of the sets' largest free blocks against a
// scan of every set, asked after runs of 0 to 30 random inserts and
// deletes over 40 sets (so that a set can fill, empty and fill again
// between two asks, or be touched many times), with sizes that tie.
func TestPtTops(t *testing.T) {
	rng := rand.New(rand.NewSource(7))
	sets := make([]ptFree, 40)
	held := make([][]*ptBlock, len(sets))
	var h ptTops
	addr := uint64(0)
	for step := range 20000 {
		k := rng.Intn(len(sets))
		if len(held[k]) == 0 || rng.Intn(2) == 0 {
			addr += 512
			b := &ptBlock{size: uint64(1+rng.Intn(40)) * 512, addr: addr}
			sets[k].insert(b)
			held[k] = append(held[k], b)
		} else {
			j := rng.Intn(len(held[k]))
			sets[k].delete(held[k][j])
			held[k] = slices.Delete(held[k], j, j+1)
		}
		h.touch(&sets[k])
		if rng.Intn(30) != 0 {
			continue
		}
		var want uint64
		for _, bs := range held {
			for _, b := range bs {
				want = max(want, b.size)
			}
		}
		if got := h.largest(); got != want {
			t.Fatalf("step %d: largest = %d, the sets' largest block is %d", step, got, want)
		}
		n := 0
		for _, bs := range held {
			if len(bs) > 0 {
				n++
			}
		}
		if len(h.heap) != n {
			t.Fatalf("step %d: %d sets in the heap, %d hold blocks", step, len(h.heap), n)
		}
	}
}

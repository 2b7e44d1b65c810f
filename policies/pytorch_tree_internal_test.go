package policies

import (
	"cmp"
	"math/rand"
	"slices"
	"testing"
)

// TestPtTree checks the free block tree against a sorted slice under
// random inserts, deletes and rekeys, in trees of one node (up to 20
// items) and of many levels (up to 400), and lowerBound after each.
func TestPtTree(t *testing.T) {
	for _, most := range []int{20, 400} {
		rng := rand.New(rand.NewSource(int64(most)))
		var tree ptTree
		var model []ptItem
		less := func(a, b ptItem) int {
			return cmp.Or(cmp.Compare(a.size, b.size), cmp.Compare(a.addr, b.addr))
		}
		fresh := func() ptItem {
			for {
				it := ptItem{size: uint64(rng.Intn(64)) * 512, addr: uint64(rng.Intn(1<<16)) * 512}
				if _, found := slices.BinarySearchFunc(model, it, less); !found {
					it.b = &ptBlock{size: it.size, addr: it.addr}
					return it
				}
			}
		}
		for step := range 20000 {
			switch op := rng.Intn(3); {
			case len(model) == 0 || op == 0 && len(model) < most:
				it := fresh()
				tree.insert(it)
				i, _ := slices.BinarySearchFunc(model, it, less)
				model = slices.Insert(model, i, it)
			case op == 1:
				k := rng.Intn(len(model))
				tree.delete(model[k].size, model[k].addr)
				model = slices.Delete(model, k, k+1)
			default:
				k := rng.Intn(len(model))
				old := model[k]
				it := fresh()
				tree.rekey(old.size, old.addr, it)
				model = slices.Delete(model, k, k+1)
				i, _ := slices.BinarySearchFunc(model, it, less)
				model = slices.Insert(model, i, it)
			}
			got := tree.appendIf(nil, func(*ptBlock) bool { return true })
			if len(got) != len(model) || tree.len != len(model) {
				t.Fatalf("most %d, step %d: %d items in the tree (len %d), want %d", most, step, len(got), tree.len, len(model))
			}
			for k := range got {
				if got[k] != model[k].b {
					t.Fatalf("most %d, step %d: item %d is %d bytes at %#x, want %d at %#x", most, step, k, got[k].size, got[k].addr, model[k].size, model[k].addr)
				}
			}
			size := uint64(rng.Intn(66)) * 512
			i, _ := slices.BinarySearchFunc(model, ptItem{size: size}, less)
			var want *ptBlock
			if i < len(model) {
				want = model[i].b
			}
			if b := tree.lowerBound(size); b != want {
				t.Fatalf("most %d, step %d: lowerBound(%d) = %v, want %v", most, step, size, b, want)
			}
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

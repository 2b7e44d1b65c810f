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

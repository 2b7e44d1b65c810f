package policies

import (
	"math/rand"
	"testing"
)

// TestFitTree drives the treap of bfc, rmm-pool and rmm-arena with random
// inserts, removes and (for first fit) resizes, and checks after each that
// its answers match a brute-force search over the same blocks and that it
// is a binary search tree by key, a heap by priority, with parent links,
// subtree sizes and byte count right.
func TestFitTree(t *testing.T) {
	for _, byAddr := range []bool{false, true} {
		rng := rand.New(rand.NewSource(5))
		tr := &fitTree{byAddr: byAddr}
		var in []*fitBlock
		used := map[uint64]bool{}
		for op := range 20000 {
			switch r := rng.Intn(10); {
			case r < 5 || len(in) == 0:
				addr := uint64(rng.Intn(4096)) * 16
				if used[addr] {
					continue
				}
				used[addr] = true
				b := &fitBlock{addr: addr, size: uint64(1 + rng.Intn(64))}
				tr.insert(b)
				in = append(in, b)
			case r < 9:
				i := rng.Intn(len(in))
				b := in[i]
				in[i] = in[len(in)-1]
				in = in[:len(in)-1]
				delete(used, b.addr)
				tr.remove(b)
				if b.tree != nil || b.parent != nil || b.left != nil || b.right != nil {
					t.Fatalf("op %d: a removed block keeps its links", op)
				}
			case byAddr:
				// Grow or shrink in place, keeping the address.
				b := in[rng.Intn(len(in))]
				tr.resize(b, b.addr, uint64(1+rng.Intn(64)))
			}
			checkFitTree(t, op, tr, in)
			n := uint64(1 + rng.Intn(70))
			var want *fitBlock
			for _, b := range in {
				if b.size < n {
					continue
				}
				switch {
				case want == nil,
					byAddr && b.addr < want.addr,
					!byAddr && (b.size < want.size || b.size == want.size && b.addr < want.addr):
					want = b
				}
			}
			var got *fitBlock
			if byAddr {
				got = tr.first(n)
			} else {
				got = tr.best(n)
			}
			if got != want {
				t.Fatalf("op %d (byAddr %v): fit of %d = %v, want %v", op, byAddr, n, got, want)
			}
		}
	}
}

func checkFitTree(t *testing.T, op int, tr *fitTree, in []*fitBlock) {
	t.Helper()
	var bytes, largest uint64
	for _, b := range in {
		bytes += b.size
		largest = max(largest, b.size)
		if b.tree != tr {
			t.Fatalf("op %d: block %#x not marked as in the tree", op, b.addr)
		}
	}
	if tr.bytes != bytes || tr.largest() != largest {
		t.Fatalf("op %d: bytes, largest = %d, %d; want %d, %d", op, tr.bytes, tr.largest(), bytes, largest)
	}
	if tr.root != nil && tr.root.parent != nil {
		t.Fatalf("op %d: the root has a parent", op)
	}
	var walk func(x *fitBlock) (int, uint64)
	walk = func(x *fitBlock) (int, uint64) {
		if x == nil {
			return 0, 0
		}
		m := x.size
		n := 1
		for _, c := range []*fitBlock{x.left, x.right} {
			if c == nil {
				continue
			}
			if c.parent != x || c.prio > x.prio {
				t.Fatalf("op %d: bad parent link or heap order under %#x", op, x.addr)
			}
			k, cm := walk(c)
			n += k
			m = max(m, cm)
		}
		if tr.byAddr && x.maxSize != m {
			t.Fatalf("op %d: subtree size at %#x = %d, want %d", op, x.addr, x.maxSize, m)
		}
		return n, m
	}
	if n, _ := walk(tr.root); n != len(in) {
		t.Fatalf("op %d: %d nodes in the tree, want %d", op, n, len(in))
	}
	// In order, the keys ascend.
	var prev *fitBlock
	var inorder func(x *fitBlock)
	inorder = func(x *fitBlock) {
		if x == nil {
			return
		}
		inorder(x.left)
		if prev != nil && !fitBefore(tr.byAddr, prev, x) {
			t.Fatalf("op %d: %#x+%d before %#x+%d out of order", op, prev.addr, prev.size, x.addr, x.size)
		}
		prev = x
		inorder(x.right)
	}
	inorder(tr.root)
}

// fitBefore reports whether a comes before b in a tree keyed by address or
// by (size, address).
func fitBefore(byAddr bool, a, b *fitBlock) bool {
	if byAddr {
		return a.addr < b.addr
	}
	return a.size < b.size || a.size == b.size && a.addr < b.addr
}

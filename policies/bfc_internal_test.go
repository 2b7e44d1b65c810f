package policies

import (
	"math/rand"
	"testing"
)

// TestFitTree drives the free tree of bfc, rmm-pool and rmm-arena with random
// inserts, removes and (for first fit) resizes, and checks after each that
// its answers match a brute-force search over the same blocks and that it
// holds its blocks in order, marked as in it, with the byte count and the
// largest size right.
func TestFitTree(t *testing.T) {
	for _, byAddr := range []bool{false, true} {
		rng := rand.New(rand.NewSource(5))
		tr := &fitTree{}
		tr.blocks.byAddr = byAddr
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
				if b.tree != nil {
					t.Fatalf("op %d: a removed block is still marked as in the tree", op)
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
	// The tree's own shape is TestFreeTree's; here its blocks, in order.
	got := tr.blocks.appendAll(nil)
	if len(got) != len(in) {
		t.Fatalf("op %d: %d blocks in the tree, want %d", op, len(got), len(in))
	}
	for i := 1; i < len(got); i++ {
		if !fitBefore(tr.blocks.byAddr, got[i-1], got[i]) {
			t.Fatalf("op %d: %#x+%d before %#x+%d out of order", op, got[i-1].addr, got[i-1].size, got[i].addr, got[i].size)
		}
	}
}

// fitBefore reports whether a comes before b in a tree keyed by address or
// by (size, address).
func fitBefore(byAddr bool, a, b *fitBlock) bool {
	if byAddr {
		return a.addr < b.addr
	}
	return a.size < b.size || a.size == b.size && a.addr < b.addr
}

package policies

import (
	"fmt"
	"math/rand"
	"slices"
	"testing"
)

// ftRef is a block of the reference the free tree is checked against.
type ftRef struct{ size, addr uint64 }

// TestFreeTree drives both orders of the free tree with random inserts,
// deletes, takes (takeBest, takeFirst) and (first fit) resizes against a plain slice of blocks, and
// checks after each step the tree's shape and every answer: best and first
// fit for every request size, firstWhere, largest and the in-order walk.
// Small address and size ranges make equal sizes, full nodes, merges and
// rotations common.
func TestFreeTree(t *testing.T) {
	for _, byAddr := range []bool{false, true} {
		for _, seed := range []int64{1, 2} {
			t.Run(fmt.Sprintf("byAddr=%v/seed=%d", byAddr, seed), func(t *testing.T) {
				rng := rand.New(rand.NewSource(seed))
				tr := &freeTree[*ftRef]{byAddr: byAddr}
				var in []*ftRef
				used := map[uint64]bool{}
				// Grow to a few hundred blocks, shrink to none, grow again.
				target := 300
				for op := range 20000 {
					if op%10000 == 5000 {
						target = 0
					} else if op%10000 == 0 {
						target = 300 + rng.Intn(300)
					}
					r := rng.Intn(10)
					switch {
					case len(in) == 0 || r < 4 || r < 6 && len(in) < target:
						addr := uint64(rng.Intn(2048)) * 16
						if used[addr] {
							continue
						}
						used[addr] = true
						b := &ftRef{size: uint64(1 + rng.Intn(64)), addr: addr}
						tr.insert(b.size, b.addr, b)
						in = append(in, b)
					case r == 9:
						below := ^uint64(0)
						if rng.Intn(2) == 0 {
							below = uint64(rng.Intn(2048 * 16))
						}
						if err := ftTake(tr, &in, used, uint64(1+rng.Intn(66)), below); err != nil {
							t.Fatalf("op %d: %v", op, err)
						}
					case r < 8 || !byAddr:
						i := rng.Intn(len(in))
						b := in[i]
						in[i] = in[len(in)-1]
						in = in[:len(in)-1]
						delete(used, b.addr)
						tr.delete(b.size, b.addr)
					default:
						// Resize in place: a new address between the
						// neighbours in address order, a new size.
						b := in[rng.Intn(len(in))]
						lo, hi := uint64(0), uint64(2048*16)
						for _, o := range in {
							if o.addr < b.addr {
								lo = max(lo, o.addr+1)
							} else if o.addr > b.addr {
								hi = min(hi, o.addr)
							}
						}
						addr := lo + uint64(rng.Int63n(int64(hi-lo)))
						delete(used, b.addr)
						used[addr] = true
						old := b.addr
						b.addr, b.size = addr, uint64(1+rng.Intn(64))
						tr.resize(old, b.addr, b.size)
					}
					if err := checkFreeTree(tr, in); err != nil {
						t.Fatalf("op %d: %v", op, err)
					}
				}
			})
		}
	}
}

// ftTake takes n bytes from tr with takeBest or takeFirst (from a block
// below address below), checks the block taken against the reference in,
// and updates in and used: under best fit the block leaves, under first
// fit n bytes are cut from its front. A cut that would move a block past
// its neighbour (the random blocks may overlap) is not made.
func ftTake(tr *freeTree[*ftRef], in *[]*ftRef, used map[uint64]bool, n, below uint64) error {
	want := slices.Clone(*in)
	slices.SortFunc(want, func(a, b *ftRef) int {
		if !tr.byAddr && a.size != b.size {
			return cmpUint(a.size, b.size)
		}
		return cmpUint(a.addr, b.addr)
	})
	var fit *ftRef
	k := slices.IndexFunc(want, func(b *ftRef) bool { return b.size >= n })
	if k >= 0 {
		fit = want[k]
	}
	var got *ftRef
	var ok bool
	leaves := true
	if tr.byAddr {
		if fit != nil && fit.addr >= below {
			fit = nil
		}
		if fit != nil && fit.size > n && k+1 < len(want) && fit.addr+n >= want[k+1].addr {
			return nil
		}
		// Half the time, blocks at odd multiples of 16 are refused.
		var pick func(*ftRef) bool
		if n%2 == 0 {
			pick = func(b *ftRef) bool { return b.addr%32 == 0 }
			if fit != nil && !pick(fit) {
				fit = nil
			}
		}
		var old uint64
		got, old, ok = tr.takeFirst(n, below, pick)
		if fit != nil && old != fit.size {
			return fmt.Errorf("takeFirst(%d): size before %d, want %d", n, old, fit.size)
		}
		if fit != nil && fit.size > n {
			leaves = false
			delete(used, fit.addr)
			fit.addr, fit.size = fit.addr+n, fit.size-n
			used[fit.addr] = true
		}
	} else {
		got, ok = tr.takeBest(n)
	}
	if got != fit || ok != (fit != nil) {
		return fmt.Errorf("take of %d = %v, want %v", n, got, fit)
	}
	if fit != nil && leaves {
		i := slices.Index(*in, fit)
		(*in)[i] = (*in)[len(*in)-1]
		*in = (*in)[:len(*in)-1]
		delete(used, fit.addr)
	}
	return nil
}

// checkFreeTree checks tr's shape (every leaf at one depth, node fill,
// order, the children's maxima of a first-fit tree) and its answers
// against the blocks in.
func checkFreeTree(tr *freeTree[*ftRef], in []*ftRef) error {
	want := slices.Clone(in)
	slices.SortFunc(want, func(a, b *ftRef) int {
		if !tr.byAddr && a.size != b.size {
			return cmpUint(a.size, b.size)
		}
		return cmpUint(a.addr, b.addr)
	})
	if tr.len != len(in) {
		return fmt.Errorf("len %d, want %d", tr.len, len(in))
	}
	got := tr.appendAll(nil)
	if !slices.Equal(got, want) {
		return fmt.Errorf("in order: %d blocks, want %d (or out of order)", len(got), len(want))
	}
	if tr.root != nil {
		leafDepth := -1
		var walk func(x *ftNode[*ftRef], depth int) (uint64, error)
		walk = func(x *ftNode[*ftRef], depth int) (uint64, error) {
			if x != tr.root && (x.n < ftDegree-1 || x.n > ftMaxItems) {
				return 0, fmt.Errorf("node of %d items", x.n)
			}
			var m uint64
			for i := range x.n {
				size, addr, b := x.sizes[i], x.addrs[i], x.vals[i]
				if size != b.size || addr != b.addr {
					return 0, fmt.Errorf("key %#x+%d holds block %#x+%d", addr, size, b.addr, b.size)
				}
				m = max(m, size)
			}
			if x.leaf {
				if leafDepth >= 0 && depth != leafDepth {
					return 0, fmt.Errorf("leaves at depths %d and %d", leafDepth, depth)
				}
				leafDepth = depth
				return m, nil
			}
			for i := range x.kids[:x.n+1] {
				km, err := walk(x.kids[i], depth+1)
				if err != nil {
					return 0, err
				}
				if tr.byAddr && x.kmax[i] != km {
					return 0, fmt.Errorf("child %d of node at %#x: largest %d, recorded %d", i, x.addrs[0], km, x.kmax[i])
				}
				m = max(m, km)
			}
			return m, nil
		}
		if _, err := walk(tr.root, 0); err != nil {
			return err
		}
	}
	var largest uint64
	for _, b := range in {
		largest = max(largest, b.size)
	}
	if l := tr.largest(); l != largest {
		return fmt.Errorf("largest %d, want %d", l, largest)
	}
	for n := uint64(1); n <= 66; n++ {
		var fit *ftRef
		for _, b := range want {
			if b.size >= n {
				fit = b // the first in order is the answer of both orders
				break
			}
		}
		var b *ftRef
		var ok bool
		if tr.byAddr {
			b, ok = tr.first(n)
			// firstWhere with a filter: the first fitting block at an
			// address that is a multiple of 32.
			var fw *ftRef
			for _, c := range want {
				if c.size >= n && c.addr%32 == 0 {
					fw = c
					break
				}
			}
			if g, _ := tr.firstWhere(n, func(c *ftRef) bool { return c.addr%32 == 0 }); g != fw {
				return fmt.Errorf("firstWhere(%d) = %v, want %v", n, g, fw)
			}
		} else {
			b, ok = tr.best(n)
		}
		if b != fit || ok != (fit != nil) {
			return fmt.Errorf("fit of %d = %v, want %v", n, b, fit)
		}
	}
	return nil
}

func cmpUint(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

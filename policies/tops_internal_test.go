package policies

import (
	"math/rand"
	"testing"
)

// TestTops checks maxTops and sizeTree against a plain slice of sizes
// under random sets.
func TestTops(t *testing.T) {
	rng := rand.New(rand.NewSource(36))
	var h maxTops
	var st sizeTree
	var want []uint64
	for op := range 20000 {
		i := rng.Intn(100)
		v := uint64(rng.Intn(8))
		if rng.Intn(4) == 0 {
			v = 0
		}
		for len(want) <= i {
			want = append(want, 0)
		}
		want[i] = v
		h.set(i, v)
		st.set(i, v)
		var m uint64
		for _, w := range want {
			m = max(m, w)
		}
		if h.max() != m || st.max() != m {
			t.Fatalf("op %d: max %d (heap), %d (tree), want %d", op, h.max(), st.max(), m)
		}
		from, at := rng.Intn(110), uint64(1+rng.Intn(8))
		first := -1
		for j := from; j < len(want); j++ {
			if want[j] >= at {
				first = j
				break
			}
		}
		if got := st.first(from, at); got != first {
			t.Fatalf("op %d: first(%d, %d) = %d, want %d", op, from, at, got, first)
		}
	}
}

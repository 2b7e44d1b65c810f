package trace

import (
	"math/rand/v2"
	"testing"
)

// TestAddrMap compares the table with a Go map over random operations on
// clustered, aligned addresses (long probe runs, wrap-around, growth).
func TestAddrMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var tab AddrMap[int]
	ref := map[uint64]int{}
	for i := 0; i < 200000; i++ {
		addr := uint64(rng.IntN(5000)) << 9
		switch rng.IntN(3) {
		case 0:
			v := i
			tab.Put(addr, v)
			ref[addr] = v
		case 1:
			p, had := tab.Ref(addr)
			if _, want := ref[addr]; had != want {
				t.Fatalf("op %d: Ref(%#x) found %v, want %v", i, addr, had, want)
			}
			*p = i
			ref[addr] = i
			if q := tab.Ptr(addr); q == nil || *q != i {
				t.Fatalf("op %d: Ptr(%#x) after Ref", i, addr)
			}
		case 2:
			tab.Delete(addr)
			delete(ref, addr)
		}
		if i%1000 == 0 {
			for a, want := range ref {
				if got, ok := tab.Get(a); !ok || got != want {
					t.Fatalf("op %d: get(%#x) = %v %v, want %v", i, a, got, ok, want)
				}
			}
			if tab.Len() != len(ref) {
				t.Fatalf("op %d: len %d, want %d", i, tab.Len(), len(ref))
			}
			seen := 0
			for a, v := range tab.All() {
				if want, ok := ref[a]; !ok || v != want {
					t.Fatalf("op %d: All gave %#x = %v, want %v %v", i, a, v, want, ok)
				}
				seen++
			}
			if seen != len(ref) {
				t.Fatalf("op %d: All gave %d addresses, want %d", i, seen, len(ref))
			}
		}
		probe := uint64(rng.IntN(5000)) << 9
		_, ok1 := tab.Get(probe)
		_, ok2 := ref[probe]
		if ok1 != ok2 {
			t.Fatalf("op %d: presence of %#x: %v, want %v", i, probe, ok1, ok2)
		}
	}
}

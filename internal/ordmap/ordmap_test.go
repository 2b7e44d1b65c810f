package ordmap

import "testing"

// TestOrdMap checks the ordered map against a sorted slice.
func TestOrdMap(t *testing.T) {
	m := New[int]()
	ref := map[uint64]int{}
	x := uint64(12345)
	for i := range 5000 {
		x = x*6364136223846793005 + 1442695040888963407
		k := (x >> 33) % 1000
		if x>>63 == 0 {
			m.Put(k, i)
			ref[k] = i
		} else {
			m.Delete(k)
			delete(ref, k)
		}
		q := (x >> 20) % 1000
		var fk, ck uint64
		fok, cok := false, false
		for rk := range ref {
			if rk <= q && (!fok || rk > fk) {
				fk, fok = rk, true
			}
			if rk >= q && (!cok || rk < ck) {
				ck, cok = rk, true
			}
		}
		gk, gv, gok := m.Floor(q)
		if gok != fok || (fok && (gk != fk || gv != ref[fk])) {
			t.Fatalf("op %d: floor(%d) = %d %d %v, want %d %v", i, q, gk, gv, gok, fk, fok)
		}
		gk, _, gok = m.Ceil(q)
		if gok != cok || (cok && gk != ck) {
			t.Fatalf("op %d: ceil(%d) = %d %v, want %d %v", i, q, gk, gok, ck, cok)
		}
		if m.Len() != len(ref) {
			t.Fatalf("op %d: len %d, want %d", i, m.Len(), len(ref))
		}
	}
}

package policies

import (
	"reflect"
	"testing"
)

func TestSplitList(t *testing.T) {
	got := SplitList(" a, [1,2],b ,, {x,y}")
	if want := []string{"a", "[1,2]", "b", "{x,y}"}; !reflect.DeepEqual(got, want) {
		t.Errorf("%q, want %q", got, want)
	}
}

// TestParseCapacity: a plain number under 1 MiB is refused as a likely
// mistake (24 for 24 GiB); with a unit, or 0, or 1 MiB and more, it is a
// size.
func TestParseCapacity(t *testing.T) {
	for _, c := range []struct {
		in   string
		want uint64
		ok   bool
	}{
		{"0", 0, true}, {"24B", 24, true}, {"24GiB", 24 << 30, true}, {"1048576", 1 << 20, true},
		{"4194304000", 4194304000, true}, {"24", 0, false}, {"1048575", 0, false}, {"0.5", 0, false}, {"x", 0, false},
	} {
		got, err := ParseCapacity(c.in)
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("ParseCapacity(%q) = %d, %v; want %d, ok %v", c.in, got, err, c.want, c.ok)
		}
	}
}

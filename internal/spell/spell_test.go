package spell

import "testing"

func TestSuggest(t *testing.T) {
	known := []string{"sim", "fit", "tune", "fidelity", "policies", "sweep", "stats", "slice"}
	for _, c := range []struct{ word, want string }{
		{"simm", "sim"}, {"tnue", "tune"}, {"fidelty", "fidelity"}, {"polices", "policies"},
		{"swep", "sweep"}, {"fid", "fidelity"}, {"xyzzy", ""}, {"report", ""}, {"x", ""}, {"st", ""}, {"sweeep", "sweep"},
	} {
		if got := Suggest(c.word, known); got != c.want {
			t.Errorf("Suggest(%q) = %q, want %q", c.word, got, c.want)
		}
	}
}

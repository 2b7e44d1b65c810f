package policies

import (
	"reflect"
	"testing"
)

func TestParseList(t *testing.T) {
	known := []string{"a", "b", "c"}
	for _, tc := range []struct {
		list string
		want []string
		err  string
	}{
		{"all", []string{"a", "b", "c"}, ""},
		{"c, a,c,,", []string{"c", "a"}, ""},
		{"a,x", nil, `unknown policy "x" (known: a, b, c)`},
		{" , ", nil, "no policy named"},
	} {
		got, err := ParseList(tc.list, known)
		if tc.err != "" {
			if err == nil || err.Error() != tc.err {
				t.Errorf("%q: error %v, want %q", tc.list, err, tc.err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%q: %v, %v; want %v", tc.list, got, err, tc.want)
		}
	}
}

// TestParseListExplicit: all leaves out a registered policy marked
// Explicit (optimal), which runs when named beside it.
func TestParseListExplicit(t *testing.T) {
	known := []string{"cuda", OptimalName, "pytorch"}
	for list, want := range map[string][]string{
		"all":                 {"cuda", "pytorch"},
		"all," + OptimalName:  {"cuda", "pytorch", OptimalName},
		OptimalName + ",all":  {OptimalName, "cuda", "pytorch"},
		"pytorch,all,pytorch": {"pytorch", "cuda"},
	} {
		got, err := ParseList(list, known)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("%q: %v, %v; want %v", list, got, err, want)
		}
	}
}

func TestParseSets(t *testing.T) {
	known := []string{"a", "b", "c"}
	got, err := ParseSets([]string{"a.x=1", "b.y=2MiB", "a.x=3", "a.z="}, known, []string{"a", "b"})
	if want := map[string]Settings{"a": {"x": "3", "z": ""}, "b": {"y": "2MiB"}}; err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, %v; want %v", got, err, want)
	}
	for set, want := range map[string]string{
		"a=1":   `"a=1": want NAME.key=value`,
		".x=1":  `".x=1": want NAME.key=value`,
		"a.x":   `"a.x": want NAME.key=value`,
		"d.x=1": `"d.x=1": unknown policy "d" (known: a, b, c)`,
		"c.x=1": `"c.x=1": policy c is not among those replayed (--policy)`,
	} {
		if _, err := ParseSets([]string{set}, known, []string{"a", "b"}); err == nil || err.Error() != want {
			t.Errorf("%q: error %v, want %q", set, err, want)
		}
	}
}

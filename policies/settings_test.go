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

package tables

import (
	"reflect"
	"testing"
)

func TestTraceNames(t *testing.T) {
	got := Names([]string{"a/x.pickle", "b/x.pickle", "c/y.pickle", "a/x.pickle", "/r/s/a/z.gz", "/q/t/a/z.gz"})
	want := map[string]string{"a/x.pickle": "a/x.pickle", "b/x.pickle": "b/x.pickle", "c/y.pickle": "y.pickle",
		"/r/s/a/z.gz": "s/a/z.gz", "/q/t/a/z.gz": "t/a/z.gz"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("traceNames: %v, want %v", got, want)
	}
}

package columnar

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/gpualloc/allocsim/sim/results"
	"github.com/parquet-go/parquet-go"
)

// TestWriteReadBack: two results written as Parquet and read back with
// parquet-go: one row each, typed columns with the results' values, the
// settings as their own columns (null where a result lacks the key), the
// fragmentation null where it is unknown.
func TestWriteReadBack(t *testing.T) {
	rs := []*results.Result{
		{Trace: "a.trace", Policy: "pytorch", Settings: map[string]string{"expandable_segments": "True"}, Capacity: 24 << 30,
			PeakReserved: 9502195712, PeakRequested: 8497528968, DeviceAllocs: 125, OOMs: 0, PeakFragmentation: 0.18, IdleAtPeak: 0.106},
		{Trace: "a.trace", Policy: "=cmd", PeakReserved: 1 << 40, OOMs: 2, FragmentationUnknown: true, PeakFragmentation: 0.5},
	}
	var buf bytes.Buffer
	if err := Write(&buf, rs); err != nil {
		t.Fatal(err)
	}
	r := parquet.NewReader(bytes.NewReader(buf.Bytes()))
	if n := r.NumRows(); n != 2 {
		t.Fatalf("%d rows, want 2", n)
	}
	names := map[string]int{}
	for i, path := range r.Schema().Columns() {
		names[path[0]] = i
	}
	rows := make([]parquet.Row, 2)
	if n, err := r.ReadRows(rows); n != 2 || (err != nil && !errors.Is(err, io.EOF)) {
		t.Fatalf("read %d rows: %v", n, err)
	}
	get := func(row int, name string) parquet.Value {
		i, ok := names[name]
		if !ok {
			t.Fatalf("no column %q in %v", name, names)
		}
		return rows[row][i]
	}
	if v := get(0, "peak_reserved_bytes"); v.Kind() != parquet.Int64 || uint64(v.Int64()) != 9502195712 {
		t.Errorf("peak_reserved_bytes %v", v)
	}
	if v := get(1, "peak_reserved_bytes"); uint64(v.Int64()) != 1<<40 {
		t.Errorf("row 1 peak_reserved_bytes %v", v)
	}
	if v := get(0, "policy"); v.String() != "pytorch" {
		t.Errorf("policy %v", v)
	}
	if v := get(1, "policy"); v.String() != "=cmd" {
		t.Errorf("policy %q: text is kept as it is (no spreadsheet quoting)", v.String())
	}
	if v := get(0, "ooms"); v.Kind() != parquet.Int64 || v.Int64() != 0 {
		t.Errorf("ooms %v", v)
	}
	if v := get(0, "peak_fragmentation"); v.Kind() != parquet.Double || v.Double() != 0.18 {
		t.Errorf("peak_fragmentation %v", v)
	}
	if v := get(1, "peak_fragmentation"); !v.IsNull() {
		t.Errorf("unknown fragmentation %v, want null", v)
	}
	if v := get(0, "set:expandable_segments"); v.String() != "True" {
		t.Errorf("set:expandable_segments %v", v)
	}
	if v := get(1, "set:expandable_segments"); !v.IsNull() {
		t.Errorf("row 1 set:expandable_segments %v, want null", v)
	}
	if v := get(0, "settings"); v.String() != "expandable_segments=True" {
		t.Errorf("settings %v", v)
	}
	if v := get(0, "fragmentation_unknown"); v.Kind() != parquet.Boolean || v.Boolean() {
		t.Errorf("fragmentation_unknown %v", v)
	}
}

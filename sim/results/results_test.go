package results

import (
	"bytes"
	"encoding/csv"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func readAll(t *testing.T, data string) (Kind, []Record, error) {
	t.Helper()
	r, err := NewReader(strings.NewReader(data), "in.json")
	if err != nil {
		return 0, nil, err
	}
	var out []Record
	for r.Scan() {
		out = append(out, r.Record())
	}
	return r.Kind(), out, r.Err()
}

// TestRoundTrip writes each kind and reads it back.
func TestRoundTrip(t *testing.T) {
	simRs := []*Result{{Trace: "a.trace", Policy: "pytorch", PeakReserved: 4096, FirstOOMEvent: -1}}
	gpuRs := []*GPU{{Result: Result{Trace: "a.trace", Policy: "cuda"}, Runtime: "libcudart.so", AllocTimeNS: 7}}
	fitRs := []*Fit{{Trace: "a.trace", Policy: "bfc", MinCapacity: 1 << 20, Fits: true, Cards: []CardFit{{Card{Name: "24GB", Capacity: 24e9, Nominal: true}, true}}}}
	for _, tc := range []struct {
		kind  Kind
		write func(w *bytes.Buffer) error
		check func(r Record) bool
	}{
		{KindSim, func(w *bytes.Buffer) error { return WriteSim(w, simRs) }, func(r Record) bool { return reflect.DeepEqual(r.Sim, simRs[0]) }},
		{KindGPU, func(w *bytes.Buffer) error { return WriteGPU(w, gpuRs) }, func(r Record) bool { return reflect.DeepEqual(r.GPU, gpuRs[0]) }},
		{KindFit, func(w *bytes.Buffer) error { return WriteFit(w, fitRs) }, func(r Record) bool { return reflect.DeepEqual(r.Fit, fitRs[0]) }},
	} {
		t.Run(tc.kind.String(), func(t *testing.T) {
			var buf bytes.Buffer
			if err := tc.write(&buf); err != nil {
				t.Fatal(err)
			}
			if want := `{` + "\n" + ` "kind": "` + tc.kind.String() + `",` + "\n" + ` "version": 2,` + "\n" + ` "results": [`; !strings.HasPrefix(buf.String(), want) {
				t.Errorf("file starts %.60q, want %q", buf.String(), want)
			}
			kind, recs, err := readAll(t, buf.String())
			if err != nil {
				t.Fatal(err)
			}
			if kind != tc.kind || len(recs) != 1 || recs[0].Kind != tc.kind || !tc.check(recs[0]) {
				t.Errorf("read kind %v, %+v", kind, recs)
			}
		})
	}
}

// TestLegacy reads files without a kind, as reports did: a fit answer by
// its min_capacity_bytes key, a gpu result by its runtime key, a sim
// result otherwise, record by record.
func TestLegacy(t *testing.T) {
	kind, recs, err := readAll(t, `{"results": [
		{"trace": "t", "policy": "bfc", "peak_reserved_bytes": 10},
		{"trace": "t", "policy": "bfc", "min_capacity_bytes": 20, "fits": true},
		{"trace": "t", "policy": "cuda", "runtime": "libcudart.so", "alloc_time_ns": 30}]}`)
	if err != nil {
		t.Fatal(err)
	}
	if kind != 0 || len(recs) != 3 {
		t.Fatalf("kind %v, %d records", kind, len(recs))
	}
	if recs[0].Kind != KindSim || recs[0].Sim.PeakReserved != 10 ||
		recs[1].Kind != KindFit || recs[1].Fit.MinCapacity != 20 ||
		recs[2].Kind != KindGPU || recs[2].GPU.AllocTimeNS != 30 || recs[2].Index != 2 {
		t.Errorf("records: %+v", recs)
	}
}

// TestVersion1 reads a version 1 file, whose fragmentation figures were 1 -
// allocated/reserved: they become the idle share, fragmentation unknown (0),
// said in the warnings; a diff's figures are made again from its runs.
func TestVersion1(t *testing.T) {
	_, recs, err := readAll(t, `{"kind": "sim", "version": 1, "results": [
		{"trace": "t", "policy": "bfc", "peak_fragmentation": 0.9, "fragmentation_at_peak": 0.25,
		 "series": [{"event": 3, "fragmentation": 0.5, "external_fragmentation": 0.125}]}]}`)
	if err != nil {
		t.Fatal(err)
	}
	r := recs[0].Sim
	if r.IdleAtPeak != 0.25 || r.FragmentationAtPeak != 0 || r.PeakFragmentation != 0 ||
		r.Series[0].Idle != 0.5 || r.Series[0].Fragmentation != 0 || r.Series[0].External != 0.125 ||
		len(r.Warnings) != 1 || !strings.Contains(r.Warnings[0], "version 1") {
		t.Errorf("version 1 result read as %+v", r)
	}
	_, recs, err = readAll(t, `{"kind": "diff", "version": 1, "results": [{
		"a": {"trace": "t", "policy": "bfc", "fragmentation_at_peak": 0.25},
		"b": {"trace": "t", "policy": "cuda"},
		"figures": [{"figure": "fragmentation at peak", "unit": "fraction", "a": 0.25, "b": 0, "delta": -0.25}]}]}`)
	if err != nil {
		t.Fatal(err)
	}
	d := recs[0].Diff
	if d.A.IdleAtPeak != 0.25 || !slices.ContainsFunc(d.Figures, func(f DiffFigure) bool { return f.Figure == "idle at peak" && f.A == 0.25 }) {
		t.Errorf("version 1 diff read as %+v", d)
	}
}

// TestErrors checks that each error names the file and the result, and
// wraps its sentinel.
func TestErrors(t *testing.T) {
	for _, tc := range []struct {
		name, data string
		want       error
		text       string
	}{
		{"no results", `{"rows": []}`, ErrNoResults, `in.json: byte offset 11: no "results" list`},
		{"not an object", `[1]`, ErrNoResults, `in.json: byte offset 1: no "results" list`},
		{"unknown kind", `{"kind": "plan", "results": []}`, ErrUnknownKind, `in.json: byte offset 15: unknown kind of results "plan" (known: sim, gpu, fit, diff, tune)`},
		{"newer version", `{"kind": "sim", "version": 3, "results": []}`, ErrUnsupportedVersion, `unsupported results version 3 (this replay reads up to 2)`},
		{"no trace", `{"kind": "sim", "version": 1, "results": [{"trace": "t", "policy": "bfc"}, {"policy": "bfc"}]}`, ErrNoTraceOrPolicy, `in.json: result 1, byte offset 92: no trace or policy`},
		{"bad field", `{"results": [{"trace": "t", "policy": 3}]}`, nil, `in.json: result 0, byte offset 40: json: cannot unmarshal number`},
		{"empty", ``, nil, `in.json: byte offset 0: unexpected EOF`},
		{"a trace", "\x1f\x8b\x08\x00", ErrNotResults, `in.json: byte offset 0: not a results file (the JSON replay sim, gpu, fit or sweep write); a trace? replay sim --json FILE TRACE writes its results`},
		{"text", "malloc id=1 size=4096", ErrNotResults, `in.json: byte offset 0: not a results file`},
		{"truncated", `{"kind": "sim", "results": [{"trace": "t", "policy": "bfc"}`, nil, `in.json: result 1, byte offset 59: unexpected EOF`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := readAll(t, tc.data)
			var e *Error
			if !errors.As(err, &e) || e.File != "in.json" {
				t.Fatalf("err = %v (%T), want an *Error naming in.json", err, err)
			}
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Errorf("err = %v, want %v", err, tc.want)
			}
			if !strings.Contains(err.Error(), tc.text) {
				t.Errorf("err = %q, want it to contain %q", err, tc.text)
			}
		})
	}
}

// TestColumns checks that the CSV has a column for every scalar JSON key
// of Result, in the order of the struct, so that the CSV keeps up
// as fields are added.
func TestColumns(t *testing.T) {
	var want []string
	rt := reflect.TypeOf(Result{})
	for k := range rt.NumField() {
		f := rt.Field(k)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch f.Type.Kind() {
		case reflect.Slice, reflect.Struct, reflect.Pointer:
			continue
		}
		if name != "" && name != "-" {
			want = append(want, name)
		}
	}
	if got := Columns(); !reflect.DeepEqual(got, want) {
		t.Errorf("columns\n%v\nwant\n%v", got, want)
	}
	var buf bytes.Buffer
	rs := []*Result{
		{Trace: "a", Policy: "bfc", Settings: map[string]string{"b": "2", "a": "1"}, PeakFragmentation: 0.25, Truncated: true},
		{Trace: "a", Policy: "cuda"},
	}
	if err := WriteCSV(&buf, rs); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if !strings.HasSuffix(lines[0], ",sim_wake_time_ns,set:a,set:b") ||
		!strings.HasPrefix(lines[1], "a,bfc,a=1;b=2,0,") || !strings.Contains(lines[1], ",0.25,") || !strings.HasSuffix(lines[1], ",1,2") ||
		!strings.HasSuffix(lines[2], ",,") {
		t.Errorf("csv:\n%s", buf.String())
	}
}

func TestKindString(t *testing.T) {
	for _, k := range []Kind{KindSim, KindGPU, KindFit} {
		if p, ok := ParseKind(k.String()); !ok || p != k {
			t.Errorf("ParseKind(%q) = %v, %v", k.String(), p, ok)
		}
	}
	if s := Kind(0).String(); s != "Kind(0)" {
		t.Errorf("Kind(0) = %q", s)
	}
	if _, ok := ParseKind(""); ok {
		t.Error(`ParseKind("") ok`)
	}
}

func TestTraceName(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"runs/train_gpt.pickle.gz", "train_gpt"},
		{"/abs/kv_decode.pickle", "kv_decode"},
		{"minimalloc/A.1048576.csv", "A.1048576"},
		{"x.trace", "x"},
		{"job.TRACE.ZST", "job"},
		{"run-1.5b", "run-1.5b"},
		{`C:\traces\win.json.gz`, "win"},
		{"with space & more.txt", "with_space___more"},
		{"", "trace"},
		{".gz", "gz"},
		{"...", "trace"},
		{"dir/", "dir"},
	} {
		if got := TraceName(tc.in); got != tc.want {
			t.Errorf("TraceName(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestWriteGPUCSV: a GPU result's row has the columns of replay sim --csv,
// its settings' among them, then the measured ones.
func TestWriteGPUCSV(t *testing.T) {
	r := &GPU{
		Result:   Result{Trace: "t.trace", Policy: "pytorch", Settings: map[string]string{"expandable_segments": "True"}, PeakReserved: 4494196736, DeviceAllocs: 31, FirstOOMEvent: -1, SimAllocTimeNS: 2682000},
		MaxBytes: 1 << 40, SimPeakReserved: 4494196736, AllocTimeNS: 89263000, Calls: 40,
		Driver: DriverView{FreeAtStart: 3 << 30, MinFree: 2 << 30, FreeAtEnd: 3 << 30},
		CLoop:  &CLoop{WallNS: 5, OverheadPerCallNS: 1.25},
	}
	var b strings.Builder
	if err := WriteGPUCSV(&b, []*GPU{r}); err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(strings.NewReader(b.String())).ReadAll()
	if err != nil || len(rows) != 2 {
		t.Fatalf("%d rows, %v:\n%s", len(rows), err, b.String())
	}
	head, row := rows[0], rows[1]
	if n := len(Columns()); !slices.Equal(head[:n], Columns()) || head[n] != "set:expandable_segments" || head[n+1] != "max_bytes" || head[len(head)-1] != "c_loop_overhead_per_call_ns" {
		t.Errorf("header %v", head)
	}
	got := map[string]string{}
	for k, name := range head {
		got[name] = row[k]
	}
	for k, want := range map[string]string{
		"trace": "t.trace", "policy": "pytorch", "settings": "expandable_segments=True", "peak_reserved_bytes": "4494196736",
		"device_allocs": "31", "first_oom_event": "-1", "sim_alloc_time_ns": "2682000", "max_bytes": "1099511627776",
		"sim_peak_reserved_bytes": "4494196736", "alloc_time_ns": "89263000", "calls": "40", "driver_min_free_bytes": "2147483648",
		"c_loop_wall_ns": "5", "c_loop_overhead_per_call_ns": "1.2", "set:expandable_segments": "True", "paced": "false",
	} {
		if got[k] != want {
			t.Errorf("%s = %q, want %q", k, got[k], want)
		}
	}
}

// TestReaderEnd: what follows the results list is read too: kind or
// version after it, a second file appended, or garbage is an error naming
// the file; other keys are skipped.
func TestReaderEnd(t *testing.T) {
	one := `{"kind": "sim", "version": 1, "results": [{"trace": "a.trace", "policy": "cuda"}]}`
	for text, want := range map[string]error{
		one + "\n": nil,
		`{"kind": "sim", "results": [{"trace": "a.trace", "policy": "cuda"}], "note": {"x": 1}}`: nil,
		`{"kind": "sim", "results": [{"trace": "a.trace", "policy": "cuda"}], "version": 99}`:    ErrAfterResults,
		`{"results": [{"trace": "a.trace", "policy": "cuda"}], "kind": "banana"}`:                ErrAfterResults,
		one + one:       ErrTrailingData,
		one + "GARBAGE": nil, // a JSON syntax error
	} {
		_, recs, err := readAll(t, text)
		if len(recs) != 1 {
			t.Errorf("%s: %d records", text, len(recs))
		}
		switch {
		case want == nil && text == one+"GARBAGE":
			if err == nil || !strings.HasPrefix(err.Error(), "in.json") {
				t.Errorf("%s: error %v", text, err)
			}
		case want == nil:
			if err != nil {
				t.Errorf("%s: error %v", text, err)
			}
		case !errors.Is(err, want) || !strings.HasPrefix(err.Error(), "in.json"):
			t.Errorf("%s: error %v, want %v", text, err, want)
		}
	}
}

// TestByFigure: a table's rows by trace as they came, those without OOM
// first, then by peak reserved bytes, then by name; the figures derived.
func TestByFigure(t *testing.T) {
	rs := []*Result{
		{Trace: "b", Policy: "x", PeakReserved: 5},
		{Trace: "a", Policy: "oom", PeakReserved: 1, OOMs: 1},
		{Trace: "a", Policy: "big", PeakReserved: 9, PeakRequested: 6, PeakAllocated: 3, PeakOffline: 3},
		{Trace: "b", Policy: "w", PeakReserved: 5},
		{Trace: "a", Policy: "small", PeakReserved: 2},
	}
	var got []string
	for _, r := range ByFigure(rs) {
		got = append(got, r.Trace+"/"+r.Policy)
	}
	if want := []string{"b/w", "b/x", "a/small", "a/big", "a/oom"}; !slices.Equal(got, want) {
		t.Errorf("order %v, want %v", got, want)
	}
	if rs[0].Policy != "x" {
		t.Error("ByFigure sorted its argument")
	}
	big := rs[2]
	if q, ok := big.ReservedOverRequested(); !ok || q != 1.5 {
		t.Errorf("×req %v %v, want 1.5", q, ok)
	}
	if o, ok := big.ReservedOverOffline(); !ok || o != 3 {
		t.Errorf("×offline %v %v, want 3", o, ok)
	}
	if f := big.PeakUnallocatedShare(); f != 1-float64(3)/float64(9) {
		t.Errorf("1 - allocated/reserved %v, want %v", f, 1-3.0/9)
	}
	if _, ok := rs[0].ReservedOverRequested(); ok {
		t.Error("×req of nothing requested is known")
	}
}

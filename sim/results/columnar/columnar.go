// Package columnar writes sim results as a Parquet file, one row per
// (trace, policy, settings, capacity), for the people who query a fleet's
// results with DuckDB or pandas rather than read CSV (replay sweep
// --parquet, replay merge --parquet). Its columns are the scalar keys of
// results.Result (the JSON keys, the CSV's columns), typed: bytes and
// counts as 64-bit integers (unsigned for bytes), shares as doubles, flags
// as booleans, text as UTF-8 strings; the fragmentation figures are null
// where they are unknown (a results file of version 1). The settings are a
// column "settings" (key=value;... sorted by key) and a column "set:KEY"
// per setting key any result has, null where a result lacks it. It uses
// github.com/parquet-go/parquet-go.
package columnar

import (
	"fmt"
	"io"
	"reflect"
	"strings"

	"github.com/gpualloc/allocsim/sim/results"
	"github.com/parquet-go/parquet-go"
)

// field is one column taken from a field of results.Result.
type field struct {
	name     string // the JSON key
	index    int    // the field's index in results.Result
	kind     reflect.Kind
	optional bool // null where the fragmentation is unknown
}

// fields are Result's scalar fields with a JSON key, in the order of the
// struct.
var fields = func() []field {
	var out []field
	t := reflect.TypeOf(results.Result{})
	for k := 0; k < t.NumField(); k++ {
		f := t.Field(k)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" || name == "-" {
			continue
		}
		switch f.Type.Kind() {
		case reflect.String, reflect.Bool, reflect.Int, reflect.Int64, reflect.Uint64, reflect.Float64:
		default:
			continue // lists, maps, pointers: not columns
		}
		opt := name == "peak_fragmented_bytes" || name == "peak_fragmentation" || name == "fragmentation_at_peak"
		out = append(out, field{name: name, index: k, kind: f.Type.Kind(), optional: opt})
	}
	return out
}()

// node returns the Parquet type of a field.
func (f field) node() parquet.Node {
	var n parquet.Node
	switch f.kind {
	case reflect.String:
		n = parquet.String()
	case reflect.Bool:
		n = parquet.Leaf(parquet.BooleanType)
	case reflect.Int, reflect.Int64:
		n = parquet.Int(64)
	case reflect.Uint64:
		n = parquet.Uint(64)
	case reflect.Float64:
		n = parquet.Leaf(parquet.DoubleType)
	}
	if f.optional {
		n = parquet.Optional(n)
	}
	return n
}

// Write writes rs to w as one Parquet file, a row per result in order.
// It returns the first error of the writes.
func Write(w io.Writer, rs []*results.Result) error {
	keys := results.SettingKeys(rs)
	group := parquet.Group{"settings": parquet.String()}
	for _, f := range fields {
		group[f.name] = f.node()
	}
	for _, k := range keys {
		group["set:"+k] = parquet.Optional(parquet.String())
	}
	schema := parquet.NewSchema("results", group)
	// The schema orders its columns by name: each name's column index.
	col := map[string]int{}
	for i, path := range schema.Columns() {
		col[path[0]] = i
	}
	pw := parquet.NewWriter(w, schema)
	for _, r := range rs {
		row := make(parquet.Row, len(col))
		v := reflect.ValueOf(r).Elem()
		for _, f := range fields {
			x := v.Field(f.index)
			var val parquet.Value
			switch f.kind {
			case reflect.String:
				val = parquet.ByteArrayValue([]byte(x.String()))
			case reflect.Bool:
				val = parquet.BooleanValue(x.Bool())
			case reflect.Int, reflect.Int64:
				val = parquet.Int64Value(x.Int())
			case reflect.Uint64:
				val = parquet.Int64Value(int64(x.Uint()))
			case reflect.Float64:
				val = parquet.DoubleValue(x.Float())
			}
			def := 0
			if f.optional {
				def = 1
				if r.FragmentationUnknown {
					val, def = parquet.NullValue(), 0
				}
			}
			row[col[f.name]] = val.Level(0, def, col[f.name])
		}
		row[col["settings"]] = parquet.ByteArrayValue([]byte(results.JoinSettings(r.Settings, ";"))).Level(0, 0, col["settings"])
		for _, k := range keys {
			c := col["set:"+k]
			if s, ok := r.Settings[k]; ok {
				row[c] = parquet.ByteArrayValue([]byte(s)).Level(0, 1, c)
			} else {
				row[c] = parquet.NullValue().Level(0, 0, c)
			}
		}
		if _, err := pw.WriteRows([]parquet.Row{row}); err != nil {
			return fmt.Errorf("parquet: %w", err)
		}
	}
	if err := pw.Close(); err != nil {
		return fmt.Errorf("parquet: %w", err)
	}
	return nil
}

package main

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"reflect"
	"sort"
	"strconv"
	"strings"

	"github.com/gpualloc/allocsim/sim"
)

// resultKey identifies a cell of a sweep, and a result: the trace as given,
// the policy, its settings and the capacity.
func resultKey(r *sim.Result) string {
	return cellKey(r.Trace, r.Policy, r.Settings, r.Capacity)
}

func cellKey(trace, policy string, settings map[string]string, capacity uint64) string {
	return trace + "\x00" + policy + "\x00" + formatSettings(settings) + "\x00" + strconv.FormatUint(capacity, 10)
}

// resultField is a scalar JSON field of sim.Result: a CSV column.
type resultField struct {
	name  string
	index []int
}

// resultFields returns the scalar JSON keys of sim.Result in the order of
// the struct, so that the sweep's CSV keeps up with the result as fields
// are added. The settings map is one column, formatted as in replay sim's
// CSV; lists (series, latency) are left out.
func resultFields() []resultField {
	var out []resultField
	var walk func(t reflect.Type, index []int)
	walk = func(t reflect.Type, index []int) {
		for i := range t.NumField() {
			f := t.Field(i)
			idx := append(append([]int(nil), index...), i)
			if f.Anonymous && f.Type.Kind() == reflect.Struct {
				walk(f.Type, idx)
				continue
			}
			if !f.IsExported() {
				continue
			}
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "-" || name == "" {
				continue
			}
			switch f.Type.Kind() {
			case reflect.String, reflect.Bool, reflect.Int, reflect.Int64, reflect.Int32,
				reflect.Uint, reflect.Uint64, reflect.Uint32, reflect.Float64, reflect.Float32:
				out = append(out, resultField{name, idx})
			case reflect.Map:
				if name == "settings" {
					out = append(out, resultField{name, idx})
				}
			}
		}
	}
	walk(reflect.TypeOf(sim.Result{}), nil)
	return out
}

func fieldString(v reflect.Value) string {
	switch v.Kind() {
	case reflect.String:
		return v.String()
	case reflect.Bool:
		return strconv.FormatBool(v.Bool())
	case reflect.Int, reflect.Int64, reflect.Int32:
		return strconv.FormatInt(v.Int(), 10)
	case reflect.Uint, reflect.Uint64, reflect.Uint32:
		return strconv.FormatUint(v.Uint(), 10)
	case reflect.Float64, reflect.Float32:
		return strconv.FormatFloat(v.Float(), 'g', 6, 64)
	case reflect.Map:
		return formatSettings(v.Interface().(map[string]string))
	}
	return ""
}

// resultCSV writes results as CSV: the scalar JSON keys of sim.Result, then
// one column per setting key in settingKeys ("set:KEY", empty where a
// result lacks it), so that grid values are columns of their own.
type resultCSV struct {
	w      *csv.Writer
	fields []resultField
	keys   []string
}

func newResultCSV(w io.Writer, settingKeys []string) *resultCSV {
	return &resultCSV{w: csv.NewWriter(w), fields: resultFields(), keys: settingKeys}
}

func (c *resultCSV) header() error {
	head := make([]string, 0, len(c.fields)+len(c.keys))
	for _, f := range c.fields {
		head = append(head, f.name)
	}
	for _, k := range c.keys {
		head = append(head, "set:"+k)
	}
	c.w.Write(head)
	c.w.Flush()
	return c.w.Error()
}

func (c *resultCSV) row(r *sim.Result) error {
	v := reflect.ValueOf(r).Elem()
	row := make([]string, 0, len(c.fields)+len(c.keys))
	for _, f := range c.fields {
		row = append(row, fieldString(v.FieldByIndex(f.index)))
	}
	for _, k := range c.keys {
		row = append(row, r.Settings[k])
	}
	c.w.Write(row)
	c.w.Flush()
	return c.w.Error()
}

// settingKeysOf returns the setting keys of results, sorted.
func settingKeysOf(results []*sim.Result) []string {
	seen := map[string]bool{}
	for _, r := range results {
		for k := range r.Settings {
			seen[k] = true
		}
	}
	keys := make([]string, 0, len(seen))
	for k := range seen {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func writeResultsCSV(w io.Writer, results []*sim.Result) error {
	c := newResultCSV(w, settingKeysOf(results))
	if err := c.header(); err != nil {
		return err
	}
	for _, r := range results {
		if err := c.row(r); err != nil {
			return err
		}
	}
	return nil
}

// readResultsFile reads a file of `replay sim --json` shape, {"results":
// [...]}, as sim results.
func readResultsFile(path string) ([]*sim.Result, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var doc struct {
		Results []*sim.Result `json:"results"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if doc.Results == nil {
		return nil, fmt.Errorf(`%s: no "results" list`, path)
	}
	return doc.Results, nil
}

package results

import (
	"bytes"
	"encoding/csv"
	"testing"
)

func TestCSVText(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"run.pickle", "run.pickle"},
		{"=cmd", "'=cmd"},
		{"+cmd", "'+cmd"},
		{"-2+3+cmd|' /C calc'!A0", "'-2+3+cmd|' /C calc'!A0"},
		{"@SUM(A1)", "'@SUM(A1)"},
		{"\tx", "'\tx"},
		{"\rx", "'\rx"},
		{"-1", "-1"},
		{"+2.5e3", "+2.5e3"},
		{"a=b", "a=b"},
	} {
		if got := CSVText(tc.in); got != tc.want {
			t.Errorf("CSVText(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// A result's text cells that a spreadsheet would run as formulas are
// quoted; its numbers, negative ones included, are not (issue 36, item 5).
func TestCSVFormulaCells(t *testing.T) {
	r := &Result{Trace: "=cmd", Policy: "@pol", FirstAnomaly: "+x", PoolWarning: "-y",
		Settings: map[string]string{"k": "=HYPERLINK(\"http://x\")", "n": "-1"}, FirstOOMEvent: -1}
	for _, write := range []func(*bytes.Buffer) error{
		func(b *bytes.Buffer) error { return WriteCSV(b, []*Result{r}) },
		func(b *bytes.Buffer) error { return WriteGPUCSV(b, []*GPU{{Result: *r}}) },
	} {
		var b bytes.Buffer
		if err := write(&b); err != nil {
			t.Fatal(err)
		}
		rows, err := csv.NewReader(&b).ReadAll()
		if err != nil {
			t.Fatal(err)
		}
		cell := map[string]string{}
		for k, name := range rows[0] {
			cell[name] = rows[1][k]
		}
		for name, want := range map[string]string{
			"trace": "'=cmd", "policy": "'@pol", "first_anomaly": "'+x", "pool_warning": "'-y",
			"settings": "k==HYPERLINK(\"http://x\");n=-1", "set:k": "'=HYPERLINK(\"http://x\")", "set:n": "-1",
			"first_oom_event": "-1",
		} {
			if cell[name] != want {
				t.Errorf("%s = %q, want %q", name, cell[name], want)
			}
		}
	}
}

package replaycli

import (
	"bytes"
	"encoding/csv"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// hostileName is a trace file name that sets the terminal's title when
// printed raw (issue 36, item 5).
const hostileName = "x\x1b]0;pwned\x07.txt"

// hostileTrace is a text-form trace whose device name holds a newline
// that would start a row of its own, whose frame turns the terminal red,
// and which frees an unknown address (a warning naming the trace).
const hostileTrace = `header source=text device="H200\nforged row" device_memory=1GiB
stack id=1 frame="a.py:1:\x1b[31mevil\x1b[0m"
malloc id=1 size=1MiB stack=1
free addr=0x99
free id=1
`

func writeHostile(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), hostileName)
	if err := os.WriteFile(path, []byte(hostileTrace), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// noControls fails t when out holds a control character other than a
// newline.
func noControls(t *testing.T, what, out string) {
	t.Helper()
	for i, r := range out {
		if r != '\n' && (r < 0x20 || r == 0x7f || r >= 0x80 && r <= 0x9f) {
			t.Errorf("%s: control character %q at byte %d: %q", what, r, i, out)
			return
		}
	}
}

// The names a trace brings (its file name, its device name, its frames)
// reach the terminal escaped: no escape sequence, no forged row.
func TestTerminalEscapesStats(t *testing.T) {
	path := writeHostile(t)
	out, errOut, err := runCmd(t, "stats", path)
	if err != nil {
		t.Fatal(err)
	}
	noControls(t, "stdout", out)
	noControls(t, "stderr", errOut)
	lines := strings.Split(out, "\n")
	wantFirst := filepath.Dir(path) + `/x\x1b]0;pwned\a.txt: text trace, 3 events over 2 ns`
	if lines[0] != wantFirst {
		t.Errorf("first line %q, want %q", lines[0], wantFirst)
	}
	if !strings.Contains(out, "\n"+`card: H200\nforged row, 1.0 GiB (1073741824 bytes)`+"\n") {
		t.Errorf("no escaped card line in\n%s", out)
	}
	for _, l := range lines {
		if strings.HasPrefix(l, "forged row") {
			t.Errorf("forged line %q", l)
		}
	}
}

func TestTerminalEscapesSim(t *testing.T) {
	path := writeHostile(t)
	out, errOut, err := runCmd(t, "sim", "--policy", "pytorch", "--sites", "3", path)
	if err != nil {
		t.Fatal(err)
	}
	noControls(t, "stdout", out)
	noControls(t, "stderr", errOut)
	if !strings.Contains(out, `x\x1b]0;pwned\a.txt  pytorch`) {
		t.Errorf("no escaped table row in\n%s", out)
	}
	if !strings.Contains(out, `a.py:1:\x1b[31mevil\x1b[0m`+"\n") {
		t.Errorf("no escaped site in\n%s", out)
	}
	if !strings.Contains(errOut, `/x\x1b]0;pwned\a.txt: warning: `) {
		t.Errorf("no escaped warning in\n%s", errOut)
	}
}

// A frame that a spreadsheet would run as a formula is quoted in
// --sites-csv (issue 36, item 5).
func TestSitesCSVFormula(t *testing.T) {
	path := filepath.Join(t.TempDir(), "t.txt")
	text := "header source=text\nstack id=1 frame=\"=cmd:1:x\"\nmalloc id=1 size=1MiB stack=1\nfree id=1\n"
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	out, _, err := runCmd(t, "sim", "--policy", "pytorch", "--sites", "1", "--sites-csv", "-", path)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 || rows[1][7] != "'=cmd:1:x" {
		t.Errorf("rows %q, want the site '=cmd:1:x", rows)
	}
}

// A frame with invalid UTF-8 gives a --viz snapshot whose strings are all
// UTF-8 (Python loads it), and one warning says so (issue 36, item 5).
func TestVizInvalidUTF8(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "t.txt")
	text := "header source=text\nstack id=1 frame=\"a\\xff.py:1:f\\xfe\"\nmalloc id=1 size=1MiB stack=1\nmalloc id=2 size=1MiB stack=1\nfree id=1\nfree id=2\n"
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	viz := filepath.Join(dir, "viz")
	_, errOut, err := runCmd(t, "sim", "--policy", "pytorch,cuda", "--viz", viz, path)
	if err != nil {
		t.Fatal(err)
	}
	want := "sim: --viz: warning: 4 strings of the traces (frame or file names, settings) not valid UTF-8: written with U+FFFD in place of the bad bytes, as Python reads only UTF-8\n"
	if errOut != want {
		t.Errorf("stderr %q, want %q", errOut, want)
	}
	for _, name := range []string{"t.pytorch.pickle", "t.cuda.pickle"} {
		data, err := os.ReadFile(filepath.Join(viz, name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(data, []byte("\x07a\uFFFD.py")) || !bytes.Contains(data, []byte("\x04f\uFFFD")) {
			t.Errorf("%s: no strings a\uFFFD.py and f\uFFFD", name)
		}
		if bytes.Contains(data, []byte("a\xff.py")) || bytes.Contains(data, []byte("f\xfe")) {
			t.Errorf("%s: the bad bytes are still there", name)
		}
	}
}

// replay check and fit print the trace's name escaped too.
func TestTerminalEscapesCheckFit(t *testing.T) {
	path := writeHostile(t)
	out, errOut, _ := runCmd(t, "check", path)
	noControls(t, "check stdout", out)
	noControls(t, "check stderr", errOut)
	want := filepath.Dir(path) + `/x\x1b]0;pwned\a.txt: event 1: free of unknown address 0x99` + "\n"
	if !strings.HasPrefix(out, want) {
		t.Errorf("check: %q, want it to start with %q", out, want)
	}
	out, errOut, err := runCmd(t, "fit", "--policy", "pytorch", path)
	if err != nil {
		t.Fatal(err)
	}
	noControls(t, "fit stdout", out)
	noControls(t, "fit stderr", errOut)
	if !strings.Contains(out, `x\x1b]0;pwned\a.txt  pytorch`) {
		t.Errorf("fit: no escaped row in\n%s", out)
	}
}

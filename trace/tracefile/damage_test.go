package tracefile_test

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/sim/sweep"
	"github.com/gpualloc/allocsim/trace"
	"github.com/gpualloc/allocsim/trace/tracefile"
)

// The damaged-input matrix (issue 20): every base file of every format is
// damaged in the ways files are damaged (cut short, single bits flipped,
// a block zeroed, bytes appended, the file twice), and each damaged file
// must be refused with a one-line error that names the file and a
// position, or replayed with the figures of the undamaged file, or
// replayed with a warning (sim.Result.Warnings). A bit flip that turns a
// digit of a plain-text format into another digit, and a cut of a
// plain-text file at the end of a line, are data no reader can tell from
// the truth (another number; a shorter job): such files are counted apart,
// not failed.

// damageBases are the base files: path under the repository, and whether
// the format is plain text.
var damageBases = []struct {
	name, path string
	text       bool
}{
	{"text", "trace/testdata/small.txt", true},
	{"rmm", "trace/rmm/testdata/midnight.csv", true},
	{"minimalloc", "", true}, // minimallocBase
	{"native", "", false},    // small.txt as native
	{"pickle", "trace/pytorch/testdata/tiny_proto5.pickle", false},
	{"pickle.gz", "testdata/pytorch/split_frag_oom.pickle.gz", false},
	{"pickle (from gz)", "testdata/pytorch/growing_batch.pickle.gz", false}, // decompressed
	{"pickle (churn)", "testdata/pytorch/churn.pickle.gz", false},           // decompressed
}

// minimallocBase is a MiniMalloc problem: buffers with lifetimes
// [lower, upper) and sizes.
const minimallocBase = `id,lower,upper,size
0,0,10,4096
1,2,6,8192
2,4,12,1024
3,6,9,16384
4,8,14,2048
5,10,16,512
6,12,20,65536
7,15,18,4096
`

// A damaged file's outcome.
type outcome int

const (
	refused   outcome = iota // refused with a one-line error naming file and place
	identical                // replayed with the base's figures
	warned                   // replayed with other figures and a warning
	digitFlip                // other figures, no warning: a digit became a digit (plain text)
	lineCut                  // other figures, no warning: cut at a line end (plain text)
	silent                   // other figures, no warning: a silent wrong answer
	badError                 // refused, but the error lacks the file, a position or is not one line
)

var outcomeNames = [...]string{"refused", "identical", "warned", "digit flip", "cut at a line end", "SILENT", "BAD ERROR"}

// figures are what a replay reports that damage could change.
type figures struct {
	events, requested, allocated, reserved, ooms, sourceOOMs, anomalies int64
	warnings                                                            bool
}

func replayFigures(path string) ([]figures, error) {
	rs, err := sweep.RunFile(path, tracefile.Options{}, sim.Config{Trace: path, Policy: "cuda"}, sim.Config{Trace: path, Policy: "best-fit"})
	if err != nil {
		return nil, err
	}
	var fs []figures
	for _, r := range rs {
		fs = append(fs, figures{r.Events, int64(r.PeakRequested), int64(r.PeakAllocated), int64(r.PeakReserved),
			r.OOMs, r.SourceOOMs, r.Anomalies, len(r.Warnings) > 0})
	}
	return fs, nil
}

// position matches the place an error names: a byte offset, a line, an
// event, an entry, a row.
var position = regexp.MustCompile(`(byte|line|offset|event|entry|row|result)s? \d+|:\d+:`)

func TestDamagedInputs(t *testing.T) {
	root := filepath.Join("..", "..")
	dir := t.TempDir()
	rng := rand.New(rand.NewSource(20))
	counts := map[string]*[len(outcomeNames)]int{}
	var failures []string
	for _, base := range damageBases {
		var data []byte
		var err error
		switch {
		case base.name == "minimalloc":
			data = []byte(minimallocBase)
		case base.name == "native":
			data, err = nativeOf(filepath.Join(root, "trace", "testdata", "small.txt"), dir)
		case base.name == "pickle (from gz)" || base.name == "pickle (churn)":
			data, err = gunzip(filepath.Join(root, base.path))
		default:
			data, err = os.ReadFile(filepath.Join(root, base.path))
		}
		if err != nil {
			t.Fatal(err)
		}
		ext := map[string]string{"text": ".txt", "rmm": ".csv", "minimalloc": ".csv", "native": ".trace",
			"pickle": ".pickle", "pickle.gz": ".pickle.gz", "pickle (from gz)": ".pickle", "pickle (churn)": ".pickle"}[base.name]
		if base.name == "minimalloc" {
			ext = ".minimalloc.csv"
		}
		orig := filepath.Join(dir, "base"+ext)
		if err := os.WriteFile(orig, data, 0o644); err != nil {
			t.Fatal(err)
		}
		want, err := replayFigures(orig)
		if err != nil {
			t.Fatalf("%s: the base file does not replay: %v", base.name, err)
		}
		c := new([len(outcomeNames)]int)
		counts[base.name] = c
		for _, d := range damages(data, rng) {
			path := filepath.Join(dir, "damaged"+ext)
			if err := os.WriteFile(path, d.data, 0o644); err != nil {
				t.Fatal(err)
			}
			apart := outcome(-1)
			switch {
			case base.text && d.digitFlip:
				apart = digitFlip
			case base.text && d.lineCut:
				apart = lineCut
			}
			o, why := classify(path, want, apart)
			c[o]++
			if o == silent || o == badError {
				failures = append(failures, fmt.Sprintf("%s, %s: %s: %s", base.name, d.what, outcomeNames[o], why))
			}
		}
	}
	for _, base := range damageBases {
		c := counts[base.name]
		var parts []string
		for o, n := range c {
			if n > 0 {
				parts = append(parts, fmt.Sprintf("%s %d", outcomeNames[o], n))
			}
		}
		t.Logf("%-17s %s", base.name+":", strings.Join(parts, ", "))
	}
	for _, f := range failures {
		t.Error(f)
	}
}

// classify replays the damaged file at path against the base's figures.
// A replay with other figures and no warning is silent, or apart when
// apart is not -1.
func classify(path string, want []figures, apart outcome) (outcome, string) {
	got, err := replayFigures(path)
	if err != nil {
		msg := err.Error()
		switch {
		case strings.Contains(msg, "\n"):
			return badError, fmt.Sprintf("%d lines: %q", strings.Count(msg, "\n")+1, msg)
		case !strings.Contains(msg, filepath.Base(path)):
			return badError, "does not name the file: " + msg
		case !position.MatchString(msg):
			return badError, "names no position: " + msg
		}
		return refused, msg
	}
	if slices.Equal(got, want) {
		return identical, ""
	}
	for _, g := range got {
		if g.warnings {
			return warned, ""
		}
	}
	if apart >= 0 {
		return apart, ""
	}
	return silent, fmt.Sprintf("figures %+v, undamaged %+v", got, want)
}

// damage is one damaged copy of a file.
type damage struct {
	what      string
	data      []byte
	digitFlip bool // a bit flip that turned a digit into a digit
	lineCut   bool // a cut at the end of a line
}

// damages returns the damaged copies of data: 20 truncations, 200
// single-bit flips (DAMAGE_FLIPS overrides), 3 zeroed blocks (4 KiB, or a quarter of a smaller
// file), 2 appends (a line of text, binary bytes) and the file twice.
func damages(data []byte, rng *rand.Rand) []damage {
	flips := 200
	if f, err := strconv.Atoi(os.Getenv("DAMAGE_FLIPS")); err == nil {
		flips = f
	}
	var ds []damage
	n := len(data)
	for k := 1; k <= 20; k++ {
		at := n * k / 21
		ds = append(ds, damage{what: fmt.Sprintf("cut at byte %d of %d", at, n), data: slices.Clone(data[:at]), lineCut: at > 0 && data[at-1] == '\n'})
	}
	for range flips {
		at, bit := rng.Intn(n), byte(1)<<rng.Intn(8)
		d := slices.Clone(data)
		d[at] ^= bit
		isDigit := func(b byte) bool { return b >= '0' && b <= '9' }
		ds = append(ds, damage{what: fmt.Sprintf("bit %#x flipped at byte %d (%q -> %q)", bit, at, data[at], d[at]),
			data: d, digitFlip: isDigit(data[at]) && isDigit(d[at])})
	}
	block := min(4096, n/4)
	for range 3 {
		at := rng.Intn(n - block + 1)
		d := slices.Clone(data)
		clear(d[at : at+block])
		ds = append(ds, damage{what: fmt.Sprintf("%d bytes zeroed at byte %d", block, at), data: d})
	}
	ds = append(ds,
		damage{what: "a line appended", data: append(slices.Clone(data), "appended line\n"...)},
		damage{what: "binary bytes appended", data: append(slices.Clone(data), 0x80, 0x05, 0x00, 0xff, 0x1f, 0x8b)},
		damage{what: "the file twice", data: append(slices.Clone(data), data...)},
	)
	return ds
}

// nativeOf returns the native form of the text trace at path.
func nativeOf(path, dir string) ([]byte, error) {
	f, err := tracefile.Open(path, tracefile.Options{})
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := filepath.Join(dir, "native.trace")
	if _, err := tracefile.WriteSource(out, trace.Source(f)); err != nil {
		return nil, err
	}
	return os.ReadFile(out)
}

func gunzip(path string) ([]byte, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	z, err := gzip.NewReader(bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	if _, err := b.ReadFrom(z); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

package plots

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unicode/utf8"

	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"

	"github.com/gpualloc/allocsim/sim/results"
	"github.com/gpualloc/allocsim/trace/atomicfile"
)

// Formats are the file formats Render writes, by file extension.
var Formats = []string{"png", "svg"}

// Render draws p (a *plot.Plot or a Grid) at Width x Height, or a Sizer
// at its own size, and writes it to w as format, "png" (at DPI dots per
// inch) or "svg" (fonts named, not embedded, with metric compatible
// fallbacks). It returns an error for any other format and any error of
// w.
func Render(w io.Writer, p Drawer, format string) error {
	width, height := Width, Height
	if s, ok := p.(Sizer); ok {
		width, height = s.Size()
	}
	return renderSize(w, p, format, width, height)
}

// renderSize is Render at width x height.
func renderSize(w io.Writer, p Drawer, format string, width, height vg.Length) error {
	switch format {
	case "png":
		c := vgimg.NewWith(vgimg.UseWH(width, height), vgimg.UseDPI(DPI))
		p.Draw(draw.New(c))
		_, err := vgimg.PngCanvas{Canvas: c}.WriteTo(w)
		return err
	case "svg":
		c := vgsvg.New(width, height)
		p.Draw(draw.New(xmlCanvas{c}))
		var buf bytes.Buffer
		if _, err := c.WriteTo(&buf); err != nil {
			return err
		}
		// The SVG names the font the text was measured with; viewers without
		// it fall back to a metric-compatible one rather than to a serif.
		out := bytes.ReplaceAll(buf.Bytes(),
			[]byte("font-family:Liberation Sans;"),
			[]byte("font-family:'Liberation Sans',Arimo,Arial,Helvetica,sans-serif;"))
		_, err := w.Write(out)
		return err
	default:
		return fmt.Errorf("plots: unknown format %q (want png or svg)", format)
	}
}

// xmlCanvas is an SVG canvas whose text is XMLText: a trace's or a
// policy's name with a character XML 1.0 forbids (ESC, NUL) or invalid
// UTF-8 leaves the file well-formed.
type xmlCanvas struct{ *vgsvg.Canvas }

// FillString draws XMLText(text).
func (c xmlCanvas) FillString(f font.Face, pt vg.Point, text string) {
	c.Canvas.FillString(f, pt, XMLText(text))
}

// XMLText returns text as a chart may hold it in XML 1.0: each control
// character (C0, tab and newline included, DEL, C1) and each non-character
// XML forbids as a Go escape (\x1b, \a, \u0085, \ufffe), each byte of invalid
// UTF-8 as U+FFFD; other text unchanged.
func XMLText(text string) string {
	ok := func(r rune) bool {
		return r >= 0x20 && r < 0x7f || r > 0x9f && r != 0xfffe && r != 0xffff && r != utf8.RuneError
	}
	clean := true
	for _, r := range text {
		if !ok(r) {
			clean = false
			break
		}
	}
	if clean {
		return text
	}
	var b strings.Builder
	for i := 0; i < len(text); {
		r, n := utf8.DecodeRuneInString(text[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			b.WriteRune(utf8.RuneError)
		case ok(r) || r == utf8.RuneError:
			b.WriteString(text[i : i+n])
		default:
			q := strconv.QuoteRuneToASCII(r)
			b.WriteString(q[1 : len(q)-1])
		}
		i += n
	}
	return b.String()
}

// Options say how WriteAll draws its charts.
type Options struct {
	// Policies names the policies the memory and fragmentation charts
	// draw (ShownPolicies); nil for the default set. A trace without a
	// result of one of them is an error.
	Policies []string
}

// charts are the charts WriteAll writes for each trace, by file name
// suffix.
var charts = []struct {
	suffix string
	build  func([]results.Result, Options) (Drawer, error)
}{
	{"memory", func(rs []results.Result, o Options) (Drawer, error) { return MemoryOf(rs, o.Policies) }},
	{"memory-all", func(rs []results.Result, _ Options) (Drawer, error) { return MemoryGrid(rs) }},
	{"fragmentation", func(rs []results.Result, o Options) (Drawer, error) { return FragmentationOf(rs, o.Policies) }},
	{"peaks", func(rs []results.Result, _ Options) (Drawer, error) { return Peaks(rs) }},
	{"calls", func(rs []results.Result, _ Options) (Drawer, error) { return Calls(rs) }},
}

// FileSuffixes returns the endings of the names of the files WriteAll
// writes for a trace, NAME-memory.png and the others: "-memory.png",
// "-memory.svg", ... A file whose name ends with one, in the directory
// WriteAll is given, may be written over.
func FileSuffixes() []string {
	var out []string
	for _, ch := range charts {
		for _, format := range Formats {
			out = append(out, "-"+ch.suffix+"."+format)
		}
	}
	return out
}

// WriteAll groups results by trace, in order of first appearance and
// keeping the order of the policies, and writes into dir, for each trace
// NAME (TraceName of its path; NAME-2, NAME-3 ... where two traces share a
// name), the files NAME-memory (the policies opt names, else the default
// set: MemoryOf), NAME-memory-all (every policy: MemoryGrid),
// NAME-fragmentation, NAME-peaks and NAME-calls, each as .png and .svg.
// The files are all written to temporary files in dir and renamed into
// place together at the end (an atomicfile.Batch), so that an error or an
// interrupt leaves none of them and the earlier files at those paths as
// they were. It returns the paths written, in order, and nil on error. It
// creates dir if it does not exist, and returns ErrNoResults for no
// results.
func WriteAll(dir string, rs []results.Result, opt Options) ([]string, error) {
	var b atomicfile.Batch
	defer b.Abort()
	if err := StageAll(&b, dir, rs, opt); err != nil {
		return nil, err
	}
	paths := b.Paths()
	if err := b.Commit(); err != nil {
		return nil, fmt.Errorf("plots: %w", err)
	}
	return paths, nil
}

// StageAll is WriteAll that adds the files to b instead of putting them in
// place: they appear when the caller commits b, with its other outputs. On
// error the files it added are still in b, for the caller's b.Abort.
func StageAll(b *atomicfile.Batch, dir string, rs []results.Result, opt Options) error {
	if len(rs) == 0 {
		return ErrNoResults
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("plots: %w", err)
	}
	var order []string
	groups := map[string][]results.Result{}
	for _, r := range rs {
		if _, ok := groups[r.Trace]; !ok {
			order = append(order, r.Trace)
		}
		groups[r.Trace] = append(groups[r.Trace], r)
	}
	used := map[string]bool{}
	for _, trace := range order {
		name := results.TraceName(trace)
		for n := 2; used[strings.ToLower(name)]; n++ {
			name = results.TraceName(trace) + "-" + strconv.Itoa(n)
		}
		used[strings.ToLower(name)] = true
		for _, ch := range charts {
			p, err := ch.build(groups[trace], opt)
			if err != nil {
				return fmt.Errorf("plots: %s chart of %s: %w", ch.suffix, trace, err)
			}
			for _, format := range Formats {
				path := filepath.Join(dir, name+"-"+ch.suffix+"."+format)
				if err := stage(b, path, func(w io.Writer) error { return Render(w, p, format) }); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// stage writes a file at path through write into b (see
// atomicfile.Batch.WriteFile).
func stage(b *atomicfile.Batch, path string, write func(io.Writer) error) error {
	if err := b.WriteFile(path, write); err != nil {
		return fmt.Errorf("plots: writing %s: %w", path, err)
	}
	return nil
}

package replaycli

import (
	"encoding/xml"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReport writes a report from replay sim and replay fit results of two
// traces and checks that the page parses, holds the memory,
// fragmentation and latency charts of each trace with their data, and
// that --plots writes each chart as PNG and SVG.
func TestReport(t *testing.T) {
	dir := t.TempDir()
	simJSON, fitJSON := filepath.Join(dir, "sim.json"), filepath.Join(dir, "fit.json")
	if _, _, err := runCmd(t, "sim", "--policy", "pytorch,cuda", "--json", simJSON, splitFragOOM, tokenLengths); err != nil {
		t.Fatal(err)
	}
	if _, _, err := runCmd(t, "fit", "--policy", "pytorch,cuda", "--json", fitJSON, splitFragOOM); err != nil {
		t.Fatal(err)
	}
	html, slides := filepath.Join(dir, "report.html"), filepath.Join(dir, "slides")
	stdout, _, err := runCmd(t, "report", "-o", html, "--plots", slides, "--title", "Review", simJSON, fitJSON)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stdout, "report: 4 results, 2 fit answers, 0 comparisons: ") || !strings.Contains(stdout, "report: 24 chart files in "+slides) {
		t.Errorf("stdout: %s", stdout)
	}
	data, err := os.ReadFile(html)
	if err != nil {
		t.Fatal(err)
	}
	d := xml.NewDecoder(strings.NewReader(string(data)))
	d.Strict = true
	var charts, blocks []string
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("report.html is not well-formed: %v", err)
		}
		if e, ok := tok.(xml.StartElement); ok {
			for _, a := range e.Attr {
				switch {
				case e.Name.Local == "figure" && a.Name.Local == "id":
					charts = append(charts, a.Value)
				case e.Name.Local == "script" && a.Name.Local == "id":
					blocks = append(blocks, a.Value)
				}
			}
		}
	}
	want := "chart-split_frag_oom-memory chart-split_frag_oom-fragmentation chart-split_frag_oom-latency chart-token_lengths-memory chart-token_lengths-fragmentation chart-token_lengths-latency"
	if got := strings.Join(charts, " "); got != want {
		t.Errorf("charts %s\nwant %s", got, want)
	}
	if got := strings.Join(blocks, " "); got != "data-t-split_frag_oom data-t-token_lengths" {
		t.Errorf("data %s", got)
	}
	// --plots: overview, then for each trace memory, fragmentation, peaks,
	// calls and latency, and the fit chart, as PNG and SVG.
	files, _ := filepath.Glob(filepath.Join(slides, "*"))
	if len(files) != 24 {
		t.Errorf("%d files in --plots, want 24", len(files))
	}
	for _, f := range []string{"overview.png", "split_frag_oom-memory.svg", "token_lengths-calls.png", "split_frag_oom-fit.png"} {
		if _, err := os.Stat(filepath.Join(slides, f)); err != nil {
			t.Errorf("--plots: %v", err)
		}
	}
	// A sweep's directory is an input too; a file of another shape is not.
	sweep := filepath.Join(dir, "sweep")
	if _, _, err := runCmd(t, "sweep", "--traces", tokenLengths, "--policy", "cuda", "--progress", "none", "-o", sweep); err != nil {
		t.Fatal(err)
	}
	if _, _, err := runCmd(t, "report", "-o", html, sweep); err != nil {
		t.Errorf("report of a sweep directory: %v", err)
	}
	bad := filepath.Join(dir, "bad.json")
	os.WriteFile(bad, []byte(`{"rows": []}`), 0o644)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"report", simJSON}, "no output file"},
		{[]string{"report", "-o", html}, "no results given"},
		{[]string{"report", "-o", html, bad}, `no "results" list`},
	} {
		if _, _, err := runCmd(t, tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.args, err, tc.want)
		}
	}
}

// TestOldResultsFiles reads results files written before files said their
// kind (no kind or version keys): report tells their records apart by
// their keys and merge takes sim results; merge refuses fit answers.
func TestOldResultsFiles(t *testing.T) {
	dir := t.TempDir()
	simJSON, fitJSON := filepath.Join(dir, "sim.json"), filepath.Join(dir, "fit.json")
	if _, _, err := runCmd(t, "sim", "--policy", "pytorch,cuda", "--json", simJSON, tokenLengths); err != nil {
		t.Fatal(err)
	}
	if _, _, err := runCmd(t, "fit", "--policy", "cuda", "--json", fitJSON, tokenLengths); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{simJSON, fitJSON} {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.SplitN(string(data), "\n", 4)
		if !strings.HasPrefix(lines[1], ` "kind": `) || lines[2] != ` "version": 2,` {
			t.Fatalf("%s starts %q", p, lines[:3])
		}
		os.WriteFile(p, []byte(lines[0]+"\n"+lines[3]), 0o644)
	}
	stdout, _, err := runCmd(t, "report", "-o", filepath.Join(dir, "report.html"), simJSON, fitJSON)
	if err != nil || !strings.Contains(stdout, "report: 2 results, 1 fit answer,") {
		t.Errorf("report of old files: %v\n%s", err, stdout)
	}
	if stdout, _, err := runCmd(t, "merge", "-o", filepath.Join(dir, "merged"), simJSON); err != nil || !strings.Contains(stdout, "merge: 2 results from 1 inputs") {
		t.Errorf("merge of an old file: %v\n%s", err, stdout)
	}
	_, _, err = runCmd(t, "merge", "-o", filepath.Join(dir, "merged"), fitJSON)
	if err == nil || !strings.HasPrefix(err.Error(), fitJSON+": result 0, byte offset ") || !strings.HasSuffix(err.Error(), ": a fit result, not a sim one") {
		t.Errorf("merge of fit answers: %v, want %q", err, fitJSON+": result 0, byte offset N: a fit result, not a sim one")
	}
}

// TestReportTune: replay report on tune's --json (kind tune) makes a
// section of its own: the recorded setting's and the recommendation's
// figures, and every candidate by rank in one table, bars for the best
// (TuneBars) only; no per-result chart or overview column per candidate.
func TestReportTune(t *testing.T) {
	dir := t.TempDir()
	js, page := filepath.Join(dir, "tune.json"), filepath.Join(dir, "tune.html")
	churn := "../../../testdata/pytorch/churn.pickle.gz"
	if _, _, err := runCmd(t, "tune", "--grid", "garbage_collection_threshold=", "--json", js, churn); err != nil {
		t.Fatal(err)
	}
	out, _, err := runCmd(t, "report", "-o", page, js)
	if err != nil || !strings.Contains(out, "0 results, 0 fit answers, 0 comparisons, 61 tune candidates") {
		t.Fatalf("report: %v\n%s", err, out)
	}
	data, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	html := string(data)
	for _, want := range []string{
		"<h1>Allocator settings ranked</h1>", "replay tune: 60 settings ranked, of 1 trace.",
		`<h2>Tune: churn.pickle.gz</h2>`, "<h3>Settings ranked</h3>",
		`PYTORCH_CUDA_ALLOC_CONF=&#34;roundup_power2_divisions:16,expandable_segments:True&#34;: peak reserved 1666.0 MiB (1746927616 bytes)`,
		"(default): peak reserved 1734.0 MiB (1818230784 bytes), 31 device calls",
	} {
		if !strings.Contains(html, want) {
			t.Errorf("the page has no %q", want)
		}
	}
	if n := strings.Count(html, `class="fill"`); n != 1+20 {
		t.Errorf("%d bars, want 21 (the recorded setting and the 20 best)", n)
	}
	if strings.Contains(html, `id="overview"`) || strings.Contains(html, `data-kind="memory"`) {
		t.Error("a tune report draws the overview or the memory charts of 61 results")
	}
}

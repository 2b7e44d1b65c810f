package replaycli

import (
	"encoding/csv"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/sim"
)

// Small real traces for the sweep tests.
var (
	tokenLengths = "../../../testdata/pytorch/token_lengths.pickle.gz"
	growingBatch = "../../../testdata/pytorch/growing_batch.pickle.gz"
)

func readCSV(t *testing.T, path string) [][]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

func column(t *testing.T, rows [][]string, name string) []string {
	t.Helper()
	k := -1
	for i, h := range rows[0] {
		if h == name {
			k = i
		}
	}
	if k < 0 {
		t.Fatalf("no column %q in %v", name, rows[0])
	}
	var out []string
	for _, r := range rows[1:] {
		out = append(out, r[k])
	}
	return out
}

// TestSweep sweeps two traces, three policies, a grid of two settings of
// first-fit and two capacities: 2 x 2 x (2 + 4) = 24 cells, each the same
// result as replay sim gives for it, then reruns it (nothing to do).
func TestSweep(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "sweep")
	args := []string{"sweep", "--traces", "../../../testdata/pytorch/*g_b*.pickle.gz", "--traces", tokenLengths, "--policy", "pytorch,cuda,first-fit",
		"--grid", "first-fit.segment_size=2MiB,20MiB", "--grid", "first-fit.release=true,false",
		"--capacity", "0,3GiB", "--progress", "lines", "-j", "3", "-o", out}
	stdout, stderr, err := runCmd(t, args...)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	if !strings.Contains(stdout, "sweep: 24 cells (2 traces x 6 policies and settings x 2 capacities): 24 run, 0 already done, 0 failed") {
		t.Errorf("stdout:\n%s", stdout)
	}
	if n := len(regexp.MustCompile(`(?m)^sweep: \d+/24 `).FindAllString(stderr, -1)); n == 0 {
		t.Errorf("no progress lines:\n%s", stderr)
	}
	rs := readResults(t, filepath.Join(out, "results.json"))
	if len(rs) != 24 {
		t.Fatalf("%d results, want 24", len(rs))
	}
	// Plan order: trace, capacity, policy, grid point.
	if rs[0].Trace != growingBatch || rs[0].Policy != "pytorch" || rs[0].Capacity != 0 ||
		rs[2].Policy != "first-fit" || rs[2].Settings["segment_size"] != "2MiB" || rs[2].Settings["release"] != "true" ||
		rs[6].Capacity != 3<<30 || rs[12].Trace != tokenLengths {
		t.Errorf("order: %+v / %+v / %+v / %+v", rs[0].Policy, rs[2].Settings, rs[6].Capacity, rs[12].Trace)
	}
	// The same figures as replay sim.
	simJSON := filepath.Join(dir, "sim.json")
	if _, _, err := runCmd(t, "sim", "--policy", "first-fit", "--set", "first-fit.segment_size=20MiB", "--set", "first-fit.release=false",
		"--capacity", "3GiB", "--json", simJSON, tokenLengths); err != nil {
		t.Fatal(err)
	}
	want := readResults(t, simJSON)[0]
	var got *sim.Result
	for i := range rs {
		r := &rs[i]
		if r.Trace == tokenLengths && r.Policy == "first-fit" && r.Capacity == 3<<30 && r.Settings["segment_size"] == "20MiB" && r.Settings["release"] == "false" {
			got = r
		}
	}
	if got == nil || !reflect.DeepEqual(*got, want) {
		t.Errorf("sweep cell %+v\nwant (replay sim) %+v", got, want)
	}
	// CSV: a row per cell, the JSON keys and a column per setting.
	rows := readCSV(t, filepath.Join(out, "results.csv"))
	if len(rows) != 25 {
		t.Fatalf("%d CSV rows, want 25", len(rows))
	}
	if got := column(t, rows, "set:segment_size")[2]; got != "2MiB" {
		t.Errorf("set:segment_size = %q", got)
	}
	if got := column(t, rows, "peak_reserved_bytes")[0]; got == "" || got == "0" {
		t.Errorf("peak_reserved_bytes = %q", got)
	}
	column(t, rows, "sim_alloc_time_ns")
	cells, _ := filepath.Glob(filepath.Join(out, "cells", "*.json"))
	if len(cells) != 24 {
		t.Errorf("%d cell files", len(cells))
	}

	// A rerun finds every cell done; a lost cell is run again.
	os.Remove(cells[5])
	stdout, _, err = runCmd(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stdout, "1 run, 23 already done") {
		t.Errorf("rerun: %s", stdout)
	}
	if again := readResults(t, filepath.Join(out, "results.json")); !reflect.DeepEqual(again, rs) {
		t.Errorf("rerun changed the results")
	}
}

// TestSweepShardsMerge runs a sweep as three shards and merges them: the
// same results as the whole sweep, in the same order.
func TestSweepShardsMerge(t *testing.T) {
	dir := t.TempDir()
	base := []string{"sweep", "--traces", tokenLengths, "--traces", growingBatch, "--policy", "cuda,best-fit,buddy", "--progress", "none"}
	whole := filepath.Join(dir, "whole")
	if _, _, err := runCmd(t, append(base, "-o", whole)...); err != nil {
		t.Fatal(err)
	}
	var shards []string
	for i := range 3 {
		d := filepath.Join(dir, "shard"+string(rune('0'+i)))
		shards = append(shards, d)
		if i == 1 {
			continue // run later
		}
		if _, _, err := runCmd(t, append(base, "--shard", string(rune('0'+i))+"/3", "-o", d)...); err != nil {
			t.Fatal(err)
		}
	}
	merged := filepath.Join(dir, "merged")
	_, stderr, err := runCmd(t, append([]string{"merge", "-o", merged}, shards[0], shards[2])...)
	if err == nil || !strings.Contains(stderr, "shard 1/3 missing") {
		t.Errorf("merge without shard 1: %v\n%s", err, stderr)
	}
	if _, err := os.Stat(filepath.Join(merged, "results.json")); err == nil {
		t.Error("an incomplete merge was written")
	}
	if _, _, err := runCmd(t, append([]string{"merge", "--partial", "-o", merged}, shards[0], shards[2])...); err != nil {
		t.Errorf("merge --partial: %v", err)
	}
	if got := readResults(t, filepath.Join(merged, "results.json")); len(got) != 4 {
		t.Errorf("partial merge: %d results, want 4", len(got))
	}
	if _, _, err := runCmd(t, append(base, "--shard", "1/3", "-o", shards[1])...); err != nil {
		t.Fatal(err)
	}
	// A shard's directory is its own.
	if _, _, err := runCmd(t, append(base, "--shard", "0/3", "-o", shards[1])...); err == nil || !strings.Contains(err.Error(), "own directory") {
		t.Errorf("shard 0 into shard 1's directory: %v", err)
	}
	stdout, _, err := runCmd(t, append([]string{"merge", "-o", merged, filepath.Join(whole, "results.json")}, shards...)...)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stdout, "merge: 6 results from 4 inputs (6 duplicates dropped)") {
		t.Errorf("stdout: %s", stdout)
	}
	want := readResults(t, filepath.Join(whole, "results.json"))
	got := readResults(t, filepath.Join(merged, "results.json"))
	if !reflect.DeepEqual(got, want) {
		t.Errorf("merged shards differ from the whole sweep")
	}
	if a, b := readCSV(t, filepath.Join(merged, "results.csv")), readCSV(t, filepath.Join(whole, "results.csv")); !reflect.DeepEqual(a, b) {
		t.Errorf("merged CSV differs from the whole sweep's")
	}
}

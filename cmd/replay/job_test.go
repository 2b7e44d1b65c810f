package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestSimJob replays a job of two ranks made from two real one-GPU
// recordings (testdata/pytorch: mlp as rank 0, churn as rank 1; there is no
// real multi-GPU recording yet) under a 1 GiB device per rank: mlp fits
// (792 MiB reserved, as its table row says), churn runs out of memory
// first at its event 310, and the job's line names rank 1 as the largest
// and failing rank, with the spread (1024-792)/1024 = 22.7%.
func TestSimJob(t *testing.T) {
	dir := t.TempDir()
	for rank, name := range []string{"mlp", "churn"} {
		raw, err := os.ReadFile(filepath.Join("..", "..", "testdata", "pytorch", name+".pickle.gz"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "job.rank"+strconv.Itoa(rank)+".pickle.gz"), raw, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out, _, err := runCmd(t, "sim", "--policy", "pytorch", "--capacity", "1GiB", filepath.Join(dir, "job.rank0.pickle.gz"), filepath.Join(dir, "job.rank1.pickle.gz"))
	if err != nil {
		t.Fatal(err)
	}
	var line string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "job.rank*.pickle.gz") {
			line = l
		}
	}
	fields := strings.Fields(line)
	want := []string{filepath.Join(dir, "job.rank*.pickle.gz"), "pytorch", "2", "1024.0", "1", "792.0", "0", "22.7%", "1024.0", "1", "1", "rank", "1,", "event", "310"}
	if strings.Join(fields, " ") != strings.Join(want, " ") {
		t.Errorf("job line %q, want the fields %q\n%s", line, want, out)
	}
}

package replaycli

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/gpualloc/allocsim/cmd/internal/cli"

	"github.com/spf13/pflag"

	"github.com/gpualloc/allocsim/sim/results"
	"github.com/gpualloc/allocsim/sim/results/columnar"
	"github.com/gpualloc/allocsim/sim/sweep"
	"github.com/gpualloc/allocsim/trace/atomicfile"
)

const mergeUsage = `usage: replay merge [--partial] [--parquet] -o DIR INPUT...

Joins the results of a sweep's shards (each shard's output directory, with
its plan.json and cells/) or of sim results files (as replay sim --json,
sweep and merge write) into DIR/results.json and DIR/results.csv, in plan
order, each cell once. It fails when a shard or a cell of a plan is missing,
unless --partial.

Flags:
`

func runMerge(stdout, stderr io.Writer, args []string) error {
	fs := pflag.NewFlagSet("merge", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), mergeUsage)
		fs.PrintDefaults()
	}
	outDir := fs.StringP("out", "o", "", "write results.json and results.csv into `DIR` (required)")
	partial := fs.Bool("partial", false, "write what there is when shards or cells are missing")
	parquetOut := fs.Bool("parquet", false, "also write DIR/results.parquet: one row per result, typed columns (DuckDB, pandas)")
	if help, err := cli.Parse(fs, args, stdout); help || err != nil {
		return err
	}
	if *outDir == "" {
		return cli.UsageError{Err: fmt.Errorf("merge: no output directory (-o DIR)")}
	}
	if fs.NArg() == 0 {
		return cli.UsageError{Err: fmt.Errorf("merge: no input given")}
	}
	// The files merge reads (a results file, a directory's results.json
	// that is no sweep's) are not among those it writes, checked before
	// anything is read.
	var read []string
	for _, in := range fs.Args() {
		if st, err := os.Stat(in); err == nil && st.IsDir() {
			if _, err := os.Stat(filepath.Join(in, "plan.json")); err != nil {
				read = append(read, filepath.Join(in, "results.json"))
			}
			continue
		}
		read = append(read, in)
	}
	jsonPath, csvPath := filepath.Join(*outDir, "results.json"), filepath.Join(*outDir, "results.csv")
	parquetPath := filepath.Join(*outDir, "results.parquet")
	if err := checkOutputs(read, "out", jsonPath, "out", csvPath, "parquet", parquetPath); err != nil {
		return err
	}
	m := sweep.NewMerger(stderr)
	for _, in := range fs.Args() {
		if err := m.Add(in); err != nil {
			return err
		}
	}
	missing := m.Missing()
	for _, line := range missing[:min(len(missing), 10)] {
		fmt.Fprintf(stderr, "merge: %s\n", cli.Safe(line))
	}
	if len(missing) > 10 {
		fmt.Fprintf(stderr, "merge: ... and %d more\n", len(missing)-10)
	}
	if len(missing) > 0 && !*partial {
		return fmt.Errorf("merge: the inputs are incomplete (%d missing); --partial writes what there is", len(missing))
	}
	rs := m.Results()
	// Both files appear together or neither does.
	var batch atomicfile.Batch
	defer batch.Abort()
	if err := batch.WriteFile(jsonPath, func(w io.Writer) error { return results.WriteSim(w, rs) }); err != nil {
		return err
	}
	if err := batch.WriteFile(csvPath, func(w io.Writer) error { return results.WriteCSV(w, rs) }); err != nil {
		return err
	}
	if *parquetOut {
		if err := batch.WriteFile(parquetPath, func(w io.Writer) error { return columnar.Write(w, rs) }); err != nil {
			return err
		}
	}
	if err := batch.Commit(); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "merge: %d results from %d inputs", len(rs), fs.NArg())
	if m.Dups() > 0 {
		fmt.Fprintf(stdout, " (%d duplicates dropped)", m.Dups())
	}
	fmt.Fprintf(stdout, " into %s\n", *outDir)
	return nil
}

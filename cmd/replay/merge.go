package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"

	"github.com/spf13/pflag"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/sim/results"
	"github.com/gpualloc/allocsim/trace/atomicfile"
)

const mergeUsage = `usage: replay merge [--partial] -o DIR INPUT...

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
		fmt.Fprint(stderr, mergeUsage)
		fs.PrintDefaults()
	}
	outDir := fs.StringP("out", "o", "", "write results.json and results.csv into `DIR` (required)")
	partial := fs.Bool("partial", false, "write what there is when shards or cells are missing")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil
		}
		return err
	}
	if *outDir == "" {
		return fmt.Errorf("merge: no output directory (-o DIR)")
	}
	if fs.NArg() == 0 {
		return fmt.Errorf("merge: no input given")
	}
	m := &merger{byKey: map[string]*mergedResult{}, plans: map[string]*planShards{}, stderr: stderr}
	for _, in := range fs.Args() {
		if err := m.add(in); err != nil {
			return err
		}
	}
	missing := m.missing()
	for _, line := range missing[:min(len(missing), 10)] {
		fmt.Fprintf(stderr, "merge: %s\n", line)
	}
	if len(missing) > 10 {
		fmt.Fprintf(stderr, "merge: ... and %d more\n", len(missing)-10)
	}
	if len(missing) > 0 && !*partial {
		return fmt.Errorf("merge: the inputs are incomplete (%d missing); --partial writes what there is", len(missing))
	}
	rs := m.ordered()
	if err := atomicfile.WriteFile(filepath.Join(*outDir, "results.json"), func(w io.Writer) error { return results.WriteSim(w, rs) }); err != nil {
		return err
	}
	if err := atomicfile.WriteFile(filepath.Join(*outDir, "results.csv"), func(w io.Writer) error { return results.WriteCSV(w, rs) }); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "merge: %d results from %d inputs", len(rs), fs.NArg())
	if m.dups > 0 {
		fmt.Fprintf(stdout, " (%d duplicates dropped)", m.dups)
	}
	fmt.Fprintf(stdout, " into %s\n", *outDir)
	return nil
}

// merger collects results by cell.
type merger struct {
	byKey  map[string]*mergedResult
	n      int // results added, for input order
	dups   int
	plans  map[string]*planShards // by plan ID
	order  []string               // plan IDs in order of first appearance
	stderr io.Writer
}

type mergedResult struct {
	r *sim.Result
	// plan and index place a result of a sweep: its plan's position among
	// the plans seen and its cell index; results files come after, in
	// input order.
	plan, index int
	seq         int
}

// planShards is what the inputs hold of one sweep plan.
type planShards struct {
	id     string
	shards int
	total  int
	seen   map[int]string // shard -> its directory
	cells  map[int]sweepCell
	found  map[int]bool // cells with a result
	pos    int
}

func (m *merger) add(in string) error {
	st, err := os.Stat(in)
	if err != nil {
		return err
	}
	if !st.IsDir() {
		rs, err := results.ReadSim(in)
		if err != nil {
			return err
		}
		for _, r := range rs {
			m.put(r, -1, 0, in)
		}
		return nil
	}
	data, err := os.ReadFile(filepath.Join(in, "plan.json"))
	if errors.Is(err, fs.ErrNotExist) {
		rs, err := results.ReadSim(filepath.Join(in, "results.json"))
		if err != nil {
			return fmt.Errorf("%s: neither a sweep directory (plan.json) nor one with results.json: %w", in, err)
		}
		for _, r := range rs {
			m.put(r, -1, 0, in)
		}
		return nil
	}
	if err != nil {
		return err
	}
	var plan sweepPlan
	if err := json.Unmarshal(data, &plan); err != nil {
		return fmt.Errorf("%s: %w", filepath.Join(in, "plan.json"), err)
	}
	if plan.Version != sweepPlanVersion || plan.Shards < 1 {
		return fmt.Errorf("%s: plan version %d with %d shards, want version %d", filepath.Join(in, "plan.json"), plan.Version, plan.Shards, sweepPlanVersion)
	}
	ps := m.plans[plan.ID]
	if ps == nil {
		ps = &planShards{id: plan.ID, shards: plan.Shards, total: plan.Total, seen: map[int]string{}, cells: map[int]sweepCell{}, found: map[int]bool{}, pos: len(m.order)}
		m.plans[plan.ID] = ps
		m.order = append(m.order, plan.ID)
	}
	if ps.shards != plan.Shards {
		return fmt.Errorf("%s: shard %d/%d of plan %s, whose other shards say /%d", in, plan.Shard, plan.Shards, plan.ID, ps.shards)
	}
	if prev, dup := ps.seen[plan.Shard]; dup {
		fmt.Fprintf(m.stderr, "merge: %s and %s are both shard %d/%d of plan %s\n", prev, in, plan.Shard, plan.Shards, plan.ID)
	}
	ps.seen[plan.Shard] = in
	for _, c := range plan.Cells {
		ps.cells[c.Index] = c
		cf, err := readCell(filepath.Join(in, "cells", c.File))
		if err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				fmt.Fprintf(m.stderr, "merge: %v\n", err)
			}
			continue
		}
		if cf.Cell.key() != c.key() {
			fmt.Fprintf(m.stderr, "merge: %s: cell %d holds another cell's result\n", filepath.Join(in, "cells", c.File), c.Index)
			continue
		}
		ps.found[c.Index] = true
		m.put(cf.Result, ps.pos, c.Index, in)
	}
	return nil
}

func (m *merger) put(r *sim.Result, plan, index int, from string) {
	k := resultKey(r)
	if old, dup := m.byKey[k]; dup {
		m.dups++
		if old.r.PeakReserved != r.PeakReserved || old.r.OOMs != r.OOMs || old.r.DeviceAllocs != r.DeviceAllocs || old.r.Events != r.Events {
			fmt.Fprintf(m.stderr, "merge: %s: %s x %s given twice with different figures; the first kept\n", from, r.Trace, r.Policy)
		}
		return
	}
	m.n++
	if plan < 0 {
		plan = 1 << 30 // after every plan
	}
	m.byKey[k] = &mergedResult{r: r, plan: plan, index: index, seq: m.n}
}

// missing lists the shards and cells of the plans seen that no input
// holds.
func (m *merger) missing() []string {
	var out []string
	for _, id := range m.order {
		ps := m.plans[id]
		for i := range ps.shards {
			if _, ok := ps.seen[i]; !ok {
				out = append(out, fmt.Sprintf("plan %s: shard %d/%d missing", id, i, ps.shards))
			}
		}
		var idx []int
		for i := range ps.cells {
			idx = append(idx, i)
		}
		sort.Ints(idx)
		for _, i := range idx {
			c := ps.cells[i]
			if !ps.found[i] {
				out = append(out, fmt.Sprintf("plan %s: cell %d (%s x %s%s) has no result", id, i, filepath.Base(c.Trace), c.Policy, settingsNote(c.Settings)))
			}
		}
	}
	return out
}

func settingsNote(s map[string]string) string {
	if len(s) == 0 {
		return ""
	}
	return " " + policies.Settings(s).Join(" ")
}

// ordered returns the results by plan and cell index, then those of
// results files in input order.
func (m *merger) ordered() []*sim.Result {
	all := make([]*mergedResult, 0, len(m.byKey))
	for _, mr := range m.byKey {
		all = append(all, mr)
	}
	sort.Slice(all, func(i, j int) bool {
		a, b := all[i], all[j]
		if a.plan != b.plan {
			return a.plan < b.plan
		}
		if a.index != b.index {
			return a.index < b.index
		}
		return a.seq < b.seq
	})
	out := make([]*sim.Result, len(all))
	for i, mr := range all {
		out[i] = mr.r
	}
	return out
}

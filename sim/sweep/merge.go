package sweep

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/sim/results"
)

// Merger joins the results of a sweep's shards (their directories) and of
// sim results files, each cell once, in plan order.
type Merger struct {
	byKey map[string]*mergedResult
	n     int // results added, for input order
	dups  int
	plans map[string]*planShards // by plan ID
	order []string               // plan IDs in order of first appearance
	// Log, if not nil, gets a line for each input that is doubtful: a
	// cell file unusable or holding another cell, a result given twice
	// with different figures. (A shard given twice is an error of Add.)
	Log io.Writer
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
	cells  map[int]Cell
	found  map[int]bool // cells with a result
	pos    int
}

// NewMerger returns an empty Merger that logs to log (nil: nowhere).
func NewMerger(log io.Writer) *Merger {
	return &Merger{byKey: map[string]*mergedResult{}, plans: map[string]*planShards{}, Log: log}
}

// Add adds the results of in: a sweep's directory (its plan.json and
// cells/), a directory with a results.json, or a results file of sim
// results. Errors name the input.
func (m *Merger) Add(in string) error {
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
	plan, err := ReadPlan(filepath.Join(in, "plan.json"))
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
	ps := m.plans[plan.ID]
	if ps == nil {
		ps = &planShards{id: plan.ID, shards: plan.Shards, total: plan.Total, seen: map[int]string{}, cells: map[int]Cell{}, found: map[int]bool{}, pos: len(m.order)}
		m.plans[plan.ID] = ps
		m.order = append(m.order, plan.ID)
	}
	if ps.shards != plan.Shards {
		return fmt.Errorf("%s: shard %d/%d of plan %s, whose other shards say /%d", in, plan.Shard, plan.Shards, plan.ID, ps.shards)
	}
	if prev, dup := ps.seen[plan.Shard]; dup {
		return fmt.Errorf("%s: shard %d/%d of plan %s, as is %s: a shard given twice (a task run in two directories?); give each shard once", in, plan.Shard, plan.Shards, plan.ID, prev)
	}
	ps.seen[plan.Shard] = in
	for _, c := range plan.Cells {
		ps.cells[c.Index] = c
		cf, err := ReadCell(filepath.Join(in, "cells", c.File))
		if err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				m.logf("merge: %v\n", err)
			}
			continue
		}
		if cf.Cell.Key() != c.Key() {
			m.logf("merge: %s: cell %d holds another cell's result\n", filepath.Join(in, "cells", c.File), c.Index)
			continue
		}
		ps.found[c.Index] = true
		m.put(cf.Result, ps.pos, c.Index, in)
	}
	return nil
}

func (m *Merger) put(r *sim.Result, plan, index int, from string) {
	k := ResultKey(r)
	if old, dup := m.byKey[k]; dup {
		m.dups++
		if old.r.PeakReserved != r.PeakReserved || old.r.OOMs != r.OOMs || old.r.DeviceAllocs != r.DeviceAllocs || old.r.Events != r.Events {
			m.logf("merge: %s: %s x %s given twice with different figures; the first kept\n", from, r.Trace, r.Policy)
		}
		return
	}
	m.n++
	if plan < 0 {
		plan = 1 << 30 // after every plan
	}
	m.byKey[k] = &mergedResult{r: r, plan: plan, index: index, seq: m.n}
}

// Missing lists the shards and cells of the plans seen that no input
// holds.
func (m *Merger) Missing() []string {
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

// Results returns the results by plan and cell index, then those of
// results files in input order, with their PeakOffline from the offline
// results among them (FillOffline).
func (m *Merger) Results() []*sim.Result {
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
	FillOffline(out)
	return out
}

// Dups returns the number of results given more than once (the first
// kept).
func (m *Merger) Dups() int { return m.dups }

func (m *Merger) logf(format string, args ...any) {
	if m.Log != nil {
		fmt.Fprintf(m.Log, format, args...)
	}
}

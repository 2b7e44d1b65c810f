package viz

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/sim/results"
	"github.com/gpualloc/allocsim/trace/atomicfile"
)

// Dir is the directory of `replay sim --viz`: one PyTorch memory
// snapshot per (trace, policy), DIR/NAME.POLICY.pickle, where NAME is the
// trace's results.TraceName (NAME-2, NAME-3, ... for traces that share one)
// and POLICY the policy's name with every character but letters, digits
// and ._+- made _ (an exec: policy's command holds spaces and slashes),
// POLICY-2, ... where two such names meet.
// A nil *Dir writes nothing.
type Dir struct {
	dir   string
	used  map[string]bool   // trace names given, lower case
	files map[string]bool   // file names given, lower case, without .pickle
	batch *atomicfile.Batch // the command's outputs, committed together
	// replaced counts the strings of the files written that were not
	// UTF-8 (Recorder.Replaced).
	replaced int
}

// NewDir returns the Dir of dir, whose snapshots go into batch, to
// appear when the caller commits it; nil for no directory.
func NewDir(dir string, batch *atomicfile.Batch) *Dir {
	if dir == "" {
		return nil
	}
	return &Dir{dir: dir, used: map[string]bool{}, files: map[string]bool{}, batch: batch}
}

// Run is the snapshots of one trace being written.
type Run struct {
	d     *Dir
	files []*atomicfile.File
	recs  []*Recorder
	paths []string
}

// Start opens a snapshot for each of cfgs, all of trace, and sets the
// configs' Observers to their recorders.
func (d *Dir) Start(trace string, cfgs []sim.Config) (*Run, error) {
	if d == nil {
		return nil, nil
	}
	base := results.TraceName(trace)
	name := base
	for n := 2; d.used[strings.ToLower(name)]; n++ {
		name = base + "-" + strconv.Itoa(n)
	}
	d.used[strings.ToLower(name)] = true
	v := &Run{d: d}
	for k := range cfgs {
		file := name + "." + fileSafe(cfgs[k].Policy)
		for n := 2; d.files[strings.ToLower(file)]; n++ {
			file = name + "." + fileSafe(cfgs[k].Policy) + "-" + strconv.Itoa(n)
		}
		d.files[strings.ToLower(file)] = true
		path := filepath.Join(d.dir, file+".pickle")
		f, err := d.batch.Create(path)
		if err != nil {
			v.Abort()
			return nil, fmt.Errorf("--viz: %w", err)
		}
		settings := map[string]string{"policy": cfgs[k].Policy, "trace": trace, "capacity_bytes": strconv.FormatUint(cfgs[k].Capacity, 10)}
		for key, val := range cfgs[k].Settings {
			settings[cfgs[k].Policy+"."+key] = val
		}
		rec := NewRecorder(f, settings)
		cfgs[k].Observer = rec
		v.files = append(v.files, f)
		v.recs = append(v.recs, rec)
		v.paths = append(v.paths, path)
	}
	return v, nil
}

// Finish completes the snapshots and closes their files, which the
// batch puts in place with the command's other outputs.
func (v *Run) Finish() error {
	if v == nil {
		return nil
	}
	for k, rec := range v.recs {
		if err := rec.Close(); err != nil {
			v.Abort()
			return fmt.Errorf("--viz: %s: %w", v.paths[k], err)
		}
		if err := v.files[k].Close(); err != nil {
			v.Abort()
			return fmt.Errorf("--viz: %w", err)
		}
		v.d.replaced += rec.Replaced()
	}
	return nil
}

// Warning returns the line that says the snapshots hold U+FFFD for
// strings of the traces that were not UTF-8, or "" when none was.
func (d *Dir) Warning() string {
	if d == nil || d.replaced == 0 {
		return ""
	}
	return fmt.Sprintf("--viz: warning: %s of the traces (frame or file names, settings) not valid UTF-8: written with U+FFFD in place of the bad bytes, as Python reads only UTF-8", plural(d.replaced, "string"))
}

// Abort removes the snapshots not yet in place.
func (v *Run) Abort() {
	if v == nil {
		return
	}
	for _, f := range v.files {
		f.Abort()
	}
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// fileSafe returns policy with every byte but ASCII letters, digits and
// "._+-" made '_', for a file name in the directory: no separator, no
// space, nothing a shell or another system reads otherwise.
func fileSafe(policy string) string {
	b := []byte(policy)
	for i, c := range b {
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '.', c == '_', c == '+', c == '-':
		default:
			b[i] = '_'
		}
	}
	return string(b)
}

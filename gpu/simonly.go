package gpu

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/sim/sweep"
	"github.com/gpualloc/allocsim/trace/tracefile"
)

// SimulateFiles replays the traces at paths on the simulated device
// alone, as the simulation alongside a replay of each target of names on
// the GPU would (ShadowConfig: cfg.Sim's cost model, a device of
// cfg.MaxBytes, unlimited when 0), and returns the results, trace after
// trace. A target with no simulated policy is left out, and skipped is
// told its name once. It returns an error when no target has one, or the
// first trace's error.
func SimulateFiles(paths []string, opts tracefile.Options, cfg Config, names []string, settings map[string]policies.Settings, skipped func(name string)) ([]*sim.Result, error) {
	var rs []*sim.Result
	for _, path := range paths {
		var cfgs []sim.Config
		for _, n := range names {
			c := cfg
			c.Trace, c.Policy, c.Settings = path, n, settings[n]
			if sc, ok := ShadowConfig(c, cfg.MaxBytes); ok {
				cfgs = append(cfgs, sc)
			} else if path == paths[0] && skipped != nil {
				skipped(n)
			}
		}
		if len(cfgs) == 0 {
			return nil, fmt.Errorf("--sim-only: none of %s is a simulated policy", strings.Join(names, ", "))
		}
		res, err := sweep.RunFile(path, opts, cfgs...)
		if err != nil {
			return nil, err
		}
		rs = append(rs, res...)
	}
	return rs, nil
}

// CallsPath returns the call log's path for one run of replay gpu --calls
// base: base itself for a single run, else base with -TRACE-TARGET before
// its extension.
func CallsPath(base string, runs int, trace, target string) string {
	if base == "" || runs == 1 {
		return base
	}
	t := filepath.Base(trace)
	for _, ext := range []string{".gz", ".pickle", ".trace", ".txt"} {
		t = strings.TrimSuffix(t, ext)
	}
	ext := filepath.Ext(base)
	return strings.TrimSuffix(base, ext) + "-" + t + "-" + target + ext
}

// CallLogs names the call logs of replay gpu --calls Base, Runs runs in
// all: CallsPath, and for a second trace of one name a number before the
// extension (-2, -3, ...).
type CallLogs struct {
	Base string
	Runs int
	used map[string]bool
}

// Next returns the call log of the run of target on trace, "" for none.
func (l *CallLogs) Next(trace, target string) string {
	if l.used == nil {
		l.used = map[string]bool{}
	}
	log := CallsPath(l.Base, l.Runs, trace, target)
	for n, first := 2, log; log != "" && l.used[log]; n++ {
		ext := filepath.Ext(first)
		log = fmt.Sprintf("%s-%d%s", strings.TrimSuffix(first, ext), n, ext)
	}
	l.used[log] = true
	return log
}

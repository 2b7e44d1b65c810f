package sweep

import (
	"fmt"
	"strconv"

	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/sim/sites"
	"github.com/gpualloc/allocsim/sim/viz"
	"github.com/gpualloc/allocsim/trace/tracefile"
)

// Inputs is what RunInputs replays: trace files, each (or each of its
// devices) against the configs that Configs gives for it.
type Inputs struct {
	// Paths are the trace files, in order.
	Paths []string
	// From is the traces' format (tracefile.Options.From).
	From string
	// Device is the device of a trace that holds several; with AllDevices
	// every device of a multi-device PyTorch snapshot is replayed, each as
	// a rank of a job named PATH#rankN.
	Device     int
	AllDevices bool
	// Jobs is how many groups of configs replay at once
	// (RunFileParallel); a Viz directory replays them in one group.
	Jobs int
	// Configs returns the configs to replay the trace of the given name
	// (a path, or PATH#rankN) against, a new slice per call.
	Configs func(name string) []sim.Config
	// Viz, when not nil, records each replay as a PyTorch memory snapshot
	// (viz.Dir).
	Viz *viz.Dir
	// Sites, when not nil, gives each result its memory at the peak by
	// allocation site (sites.AddFile: a second replay).
	Sites *sites.Options
}

// RunInputs replays each trace of in against its configs and returns the
// results, trace after trace, in the order of the configs. It returns the
// first error: a trace that cannot be read or replayed (named), or a
// snapshot that cannot be written.
func RunInputs(in Inputs) ([]*sim.Result, error) {
	var rs []*sim.Result
	for _, path := range in.Paths {
		devs := []int{in.Device}
		if in.AllDevices {
			n, err := deviceCount(path, in.From)
			if err != nil {
				return nil, err
			}
			devs = devs[:0]
			for d := range n {
				devs = append(devs, d)
			}
		}
		for _, d := range devs {
			name := path
			if len(devs) > 1 {
				name = fmt.Sprintf("%s#rank%d", path, d)
			}
			cfgs := in.Configs(name)
			vr, err := in.Viz.Start(name, cfgs)
			if err != nil {
				return nil, err
			}
			j := in.Jobs
			if in.Viz != nil {
				j = 1 // one history recorder for the trace's policies
			}
			opts := tracefile.Options{From: in.From, Device: d}
			res, err := RunFileParallel(path, opts, j, cfgs...)
			if err == nil {
				err = tracefile.NameError(path, vr.Finish())
			} else {
				vr.Abort()
			}
			if err == nil && in.Sites != nil {
				err = sites.AddFile(path, opts, cfgs, res, *in.Sites)
			}
			if err != nil {
				return nil, err
			}
			rs = append(rs, res...)
		}
	}
	return rs, nil
}

// deviceCount returns the number of devices the trace at path holds: a
// PyTorch snapshot's device traces (its Metadata "devices"), 1 for the
// other formats.
func deviceCount(path, from string) (int, error) {
	f, err := tracefile.Open(path, tracefile.Options{From: from})
	if err != nil {
		return 0, err
	}
	defer f.Close()
	if n, err := strconv.Atoi(f.Header().Metadata["devices"]); err == nil && n > 0 {
		return n, nil
	}
	return 1, nil
}

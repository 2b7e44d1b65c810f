// Package cli holds what the record and replay commands share about their
// command lines: the exit status of a usage error and the version line.
package cli

import (
	"fmt"
	"runtime/debug"

	"github.com/gpualloc/allocsim/sim/results"
	"github.com/gpualloc/allocsim/trace"
)

// UsageError is a command line the command cannot take (an unknown flag
// or command, a missing argument): exit status 2, as for the tools people
// know; runtime errors exit 1.
type UsageError struct{ Err error }

func (e UsageError) Error() string { return e.Err.Error() }
func (e UsageError) Unwrap() error { return e.Err }

// ExitCode returns 2.
func (e UsageError) ExitCode() int { return 2 }

// commit and buildDate are set by the Makefile's build (-ldflags -X), so
// that --version names the commit even where the go command stamps no
// VCS information (a build from a tree copied without .git, or with
// -buildvcs=false).
var commit, buildDate string

// Version returns the line --version prints for the command name: the
// module's version (or the commit it was built from, "+dirty" for a
// modified tree: the Makefile's stamp, else the go command's), the build
// date where the Makefile stamped it, and the versions of the native
// trace format and of the results files.
func Version(name string) string {
	v := "(unknown)"
	if commit != "" {
		v = commit
		if buildDate != "" {
			v += ", built " + buildDate
		}
	} else if bi, ok := debug.ReadBuildInfo(); ok {
		v = bi.Main.Version
		var rev, dirty string
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				if s.Value == "true" {
					dirty = "+dirty"
				}
			}
		}
		if rev != "" && (v == "" || v == "(devel)") {
			v = rev[:min(12, len(rev))] + dirty
		}
	}
	return fmt.Sprintf("%s (allocsim) %s; trace format version %d; results version %d", name, v, trace.Version, results.Version)
}

// DeviceDoc is the doc of the --device flag of every command that reads
// traces: which device of a trace that holds several it picks.
const DeviceDoc = "device `N` of a trace that holds several: a PyTorch snapshot's device, a torch.profiler trace's Device Id, a CuPy log's device_id, an XSpace's allocator GPU_N_bfc"

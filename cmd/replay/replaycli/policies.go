package replaycli

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/gpualloc/allocsim/cmd/internal/cli"

	"github.com/spf13/pflag"

	"github.com/gpualloc/allocsim/gpu"
	"github.com/gpualloc/allocsim/policies"
)

const policiesUsage = `usage: replay policies [--json]

Lists every policy: the design it follows (and the source file of the real
allocator it copies), its abilities, and its settings with their defaults.

Flags:
`

// runPolicies lists every registered policy: the design it follows, its
// abilities and its settings with their defaults, as a text table, or with
// --json as {"policies": [...], "gpu_targets": [...]}, and the direct
// targets of replay gpu.
func runPolicies(stdout, stderr io.Writer, args []string) error {
	fs := pflag.NewFlagSet("policies", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), policiesUsage)
		fs.PrintDefaults()
	}
	jsonOut := fs.Bool("json", false, "print JSON instead of a table")
	if help, err := cli.Parse(fs, args, stdout); help || err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("policies: takes no arguments, got %q", fs.Arg(0))
	}
	infos, targets := policies.Infos(), gpu.TargetInfos()
	if *jsonOut {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", " ")
		return enc.Encode(struct {
			Policies []policies.Info `json:"policies"`
			Targets  []policies.Info `json:"gpu_targets"`
		}{infos, targets})
	}
	if err := policies.WriteTable(stdout, infos); err != nil {
		return err
	}
	fmt.Fprintln(stdout, "\nreplay gpu also takes these targets, which make the calls themselves:")
	return policies.WriteTable(stdout, targets)
}

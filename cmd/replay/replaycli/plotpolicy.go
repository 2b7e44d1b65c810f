package replaycli

import (
	"fmt"
	"slices"
	"strings"

	"github.com/gpualloc/allocsim/cmd/internal/cli"
)

// plotPolicyDoc is the help of --plot-policy.
const plotPolicyDoc = "the policies the memory and fragmentation charts of --plots draw, a comma-separated `LIST` of replayed ones (default: the recorded allocator, the 3 lowest peaks reserved without OOM, cuda as the baseline; every policy is in NAME-memory-all)"

// plotPolicies parses --plot-policy: the names of list, each one of
// replayed (nil: any), or nil for "" (the default set). It returns a usage
// error for a name not replayed and for a list without --plots.
func plotPolicies(list string, plotDir string, replayed []string) ([]string, error) {
	if list == "" {
		return nil, nil
	}
	if plotDir == "" {
		return nil, cli.UsageError{Err: fmt.Errorf("--plot-policy without --plots")}
	}
	var out []string
	for _, n := range strings.Split(list, ",") {
		n = strings.TrimSpace(n)
		if n == "" {
			return nil, cli.UsageError{Err: fmt.Errorf("--plot-policy %q: an empty name", list)}
		}
		if replayed != nil && !slices.Contains(replayed, n) {
			return nil, cli.UsageError{Err: fmt.Errorf("--plot-policy: %q is not replayed (--policy %s)", n, strings.Join(replayed, ","))}
		}
		out = append(out, n)
	}
	return out, nil
}

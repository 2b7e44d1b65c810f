package replaycli

import (
	"fmt"
	"io"
	"path/filepath"
	"sort"
	"strings"

	"github.com/gpualloc/allocsim/cmd/internal/cli"
	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
)

// writeSettingsUsed writes, under the table, the settings each replay used
// that has any: the user's (--set) and those the trace records (a replay
// as recorded), each marked so.
func writeSettingsUsed(w io.Writer, results []*sim.Result, user map[string]policies.Settings) {
	for _, r := range results {
		if len(r.Settings) == 0 {
			continue
		}
		keys := make([]string, 0, len(r.Settings))
		for k := range r.Settings {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		parts := make([]string, len(keys))
		for i, k := range keys {
			from := "recorded"
			if v, ok := user[r.Policy][k]; ok && v == r.Settings[k] {
				from = "--set"
			}
			parts[i] = fmt.Sprintf("%s=%s (%s)", k, r.Settings[k], from)
		}
		fmt.Fprintf(w, "%s: %s settings: %s\n", cli.Safe(filepath.Base(r.Trace)), cli.Safe(r.Policy), cli.Safe(strings.Join(parts, ", ")))
	}
}

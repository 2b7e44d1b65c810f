package replaycli

import (
	"path/filepath"
	"strings"

	"github.com/gpualloc/allocsim/cmd/internal/cli"

	"github.com/gpualloc/allocsim/sim"
)

// traceNames returns, for each trace path, the shortest tail of its path
// (its file name, or the folders above it as far as needed) that no other
// of the paths ends with, so that rows of two traces with one file name in
// different folders tell apart (a/x.pickle and b/x.pickle show as such;
// a lone x.pickle as x.pickle).
func traceNames(paths []string) map[string]string {
	split := func(p string) []string {
		return strings.Split(filepath.ToSlash(filepath.Clean(p)), "/")
	}
	tail := func(parts []string, n int) string {
		return strings.Join(parts[max(0, len(parts)-n):], "/")
	}
	uniq := map[string][]string{}
	for _, p := range paths {
		if _, ok := uniq[p]; !ok {
			uniq[p] = split(p)
		}
	}
	out := make(map[string]string, len(uniq))
	for p, parts := range uniq {
		n := 1
		for ; n < len(parts); n++ {
			clash := false
			for q, other := range uniq {
				if q != p && tail(other, n) == tail(parts, n) {
					clash = true
					break
				}
			}
			if !clash {
				break
			}
		}
		out[p] = cli.Safe(tail(parts, n))
	}
	return out
}

// resultNames is traceNames of the results' traces.
func resultNames(rs []*sim.Result) map[string]string {
	paths := make([]string, len(rs))
	for i, r := range rs {
		paths[i] = r.Trace
	}
	return traceNames(paths)
}

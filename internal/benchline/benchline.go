// Package benchline collects the BENCH lines of a package's benchmarks,
// one per key (the last reported wins), and prints them sorted by key
// after the run, so that `make bench` ends with one line per measurement
// whatever order the benchmarks ran in.
package benchline

import (
	"fmt"
	"io"
	"slices"
	"sync"
)

var lines = struct {
	sync.Mutex
	m map[string]string
}{m: map[string]string{}}

// Report keeps line as the BENCH line of key. It is safe for concurrent
// use.
func Report(key, line string) {
	lines.Lock()
	lines.m[key] = line
	lines.Unlock()
}

// Print writes the lines reported so far to w, sorted by key, one per
// line, and returns w's first error.
func Print(w io.Writer) error {
	lines.Lock()
	defer lines.Unlock()
	keys := make([]string, 0, len(lines.m))
	for k := range lines.m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if _, err := fmt.Fprintln(w, lines.m[k]); err != nil {
			return err
		}
	}
	return nil
}

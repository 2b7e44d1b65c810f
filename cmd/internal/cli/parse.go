package cli

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/gpualloc/allocsim/internal/spell"
	"github.com/spf13/pflag"
)

// Parse parses a command's flags from args. With -h or --help among them
// (before any "--"), it prints the command's usage (fs.Usage, which writes
// to fs.Output()) on stdout, as the top-level help does, and returns help
// true and a nil error. A flag it cannot take is a UsageError, with the
// flag of fs nearest in spelling offered ("did you mean --capacity?").
func Parse(fs *pflag.FlagSet, args []string, stdout io.Writer) (help bool, err error) {
	for _, a := range args {
		if a == "--" {
			break
		}
		if a == "-h" || a == "--help" {
			out := fs.Output()
			fs.SetOutput(stdout)
			fs.Usage()
			fs.SetOutput(out)
			return true, nil
		}
	}
	err = fs.Parse(args)
	if err == nil {
		return false, nil
	}
	if errors.Is(err, pflag.ErrHelp) {
		return true, nil
	}
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "unknown flag: --"); ok {
		var names []string
		fs.VisitAll(func(f *pflag.Flag) { names = append(names, f.Name) })
		if s := spell.Suggest(name, names); s != "" {
			return false, UsageError{Err: fmt.Errorf("%s (did you mean --%s?)", msg, s)}
		}
	}
	return false, UsageError{Err: err}
}

// UnknownError returns the error for a name of kind ("command", "policy",
// "setting") that is none of known, with the nearest of them offered.
func UnknownError(kind, name string, known []string) error {
	if s := spell.Suggest(name, known); s != "" {
		return fmt.Errorf("unknown %s %q (did you mean %q?)", kind, name, s)
	}
	sorted := slices.Clone(known)
	slices.Sort(sorted)
	return fmt.Errorf("unknown %s %q (known: %s)", kind, name, strings.Join(sorted, ", "))
}

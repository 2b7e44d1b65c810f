package cli

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func TestParseHelpOnStdout(t *testing.T) {
	var stdout, stderr bytes.Buffer
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	fs.SetOutput(&stderr)
	fs.Usage = func() { fs.Output().Write([]byte("usage: x\n")); fs.PrintDefaults() }
	fs.String("capacity", "", "the `SIZE`")
	help, err := Parse(fs, []string{"a", "--help"}, &stdout)
	if !help || err != nil {
		t.Fatalf("Parse(--help) = %v, %v", help, err)
	}
	if !strings.Contains(stdout.String(), "usage: x") || !strings.Contains(stdout.String(), "--capacity SIZE") || stderr.Len() != 0 {
		t.Errorf("help: stdout %q, stderr %q", stdout.String(), stderr.String())
	}
	stdout.Reset()
	_, err = Parse(fs, []string{"--capacty", "1"}, &stdout)
	var ue UsageError
	if !errors.As(err, &ue) || err.Error() != "unknown flag: --capacty (did you mean --capacity?)" {
		t.Errorf("Parse(--capacty) = %v", err)
	}
	if stdout.Len() != 0 {
		t.Errorf("usage error: stdout %q, stderr %q", stdout.String(), stderr.String())
	}
}

// TestVersionStamped: the Makefile's stamp names the commit and the date,
// whatever the go command stamped.
func TestVersionStamped(t *testing.T) {
	defer func(c, d string) { commit, buildDate = c, d }(commit, buildDate)
	commit, buildDate = "0123456789ab", "2026-12-03T10:00:00Z"
	if got, want := Version("replay"), "replay (allocsim) 0123456789ab, built 2026-12-03T10:00:00Z; trace format version"; !strings.HasPrefix(got, want) {
		t.Errorf("Version = %q, want it to begin %q", got, want)
	}
}

package replaycli

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/pflag"

	"github.com/gpualloc/allocsim/cmd/internal/cli"
	"github.com/gpualloc/allocsim/trace"
	"github.com/gpualloc/allocsim/trace/tracefile"
)

const dumpUsage = `usage: replay dump [--from FORMAT] [--device N] TRACE

Prints a trace (a native trace, or any format replay reads) in the text form
on stdout, one event a line, as 'record import' reads it back: the header
line, then the events.

Flags:
`

func runDump(stdout, stderr io.Writer, args []string) error {
	fs := pflag.NewFlagSet("dump", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), dumpUsage)
		fs.PrintDefaults()
	}
	from := fs.String("from", "auto", "`FORMAT` of the trace: auto, "+strings.Join(tracefile.Formats, ", "))
	device := fs.Int("device", 0, cli.DeviceDoc)
	if help, err := cli.Parse(fs, args, stdout); help || err != nil {
		return err
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return cli.UsageError{Err: fmt.Errorf("dump: want one TRACE, got %d", fs.NArg())}
	}
	path := fs.Arg(0)
	f, err := tracefile.Open(path, tracefile.Options{From: *from, Device: *device})
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := trace.WriteTextSource(stdout, f); err != nil {
		return tracefile.NameError(path, err)
	}
	return nil
}

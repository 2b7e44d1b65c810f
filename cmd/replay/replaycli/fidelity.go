package replaycli

import (
	"bytes"
	"fmt"
	"io"
	"strings"

	"github.com/gpualloc/allocsim/cmd/internal/cli"
	"github.com/gpualloc/allocsim/sim/fidelity"

	"github.com/spf13/pflag"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/trace/tracefile"
)

// runFidelity is `replay fidelity`: each trace replayed as recorded (the
// settings it records, the addresses it records) against the policy that
// simulates its allocator, compared with the recording event by event
// (sim.Fidelity). It prints "identical" or the first divergence per trace,
// then a line per multi-GPU job among the traces (fidelityJob), and
// returns an error when any trace diverges. The output is printed whole
// or, on an error other than a divergence, not at all.
func runFidelity(stdout, stderr io.Writer, args []string) error {
	fs := pflag.NewFlagSet("fidelity", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	capacity := fs.String("capacity", "", "device capacity `SIZE`: bytes or a size like 4000MiB (the recording's memory cap; 0 = none; default: the mem_cap_bytes (a CuPy log's limit_bytes) of the measured figures beside the trace, else none)")
	policy := fs.String("policy", "", "the `POLICY` that simulates the recorded allocator (default: the one of the trace's source: pytorch for PyTorch snapshots and torch.profiler traces, cupy for CuPy logs, bfc for XSpaces)")
	from := fs.String("from", "auto", "`FORMAT` of the traces: auto, "+strings.Join(tracefile.Formats, ", "))
	device := fs.Int("device", 0, cli.DeviceDoc)
	sets := fs.StringArray("set", nil, "a setting `NAME.key=value` over the recorded ones (repeatable): what the trace does not record, such as a torch.profiler trace's pytorch.expandable_segments=True")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: replay fidelity [--policy NAME] [--capacity SIZE] [--set NAME.key=value] [--from FORMAT] [--device N] TRACE|DIR|GLOB...

Replays each trace as recorded and compares the simulated device calls and
placements with the recorded ones, event by event, and, where the real
allocator's figures lie beside the trace (NAME.stats.json for NAME.pickle.gz
or NAME.pt.trace.json.gz: max_memory_reserved, max_memory_allocated,
memory_stats, mem_cap_bytes; for a CuPy log NAME.jsonl: peak_total_bytes,
device_allocs, limit_bytes, ooms_caught), the peaks and counters with them:
peak reserved and allocated bytes, device allocations and frees, retries and
OOMs (exit 1 if anything differs). For an XSpace the figures are JAX's
memory_stats() in NAME.json beside NAME.xplane.pb.gz (under "stats" or
"memory_stats"), else those its BFC events record: peak allocated bytes and
mallocs; bfc then runs with the memory limit and the preallocation
memory_stats() implies (bytes_limit; allow_growth=false where the pool
peaked at the whole limit), --set over them. A figures file beside a trace
that holds none of these figures is an error.

A multi-GPU job is replayed rank by rank, each rank on a device of its own:
a directory (the traces in it) or a glob (quote it) of per-rank traces is a
job, the rank of each trace taken from its name (rank0.pickle.gz,
job_rank_1.pickle.gz, snap-rank3.pickle.gz, or a folder rank2/) when every
trace names one, several jobs where the names say so, else from the order
of the traces (sorted by name); traces given one by one form a job when
their names say their ranks. After the traces, a line per job of two ranks
or more: the largest and smallest rank's peak reserved bytes and their
spread, the first rank to fail (out of memory first in time), and the ranks
whose replay differs from their recording.

Flags:
`)
		fs.PrintDefaults()
	}
	if help, err := cli.Parse(fs, args, stdout); help || err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return cli.UsageError{Err: fmt.Errorf("fidelity: no trace given")}
	}
	setNames := []string{*policy}
	if *policy == "" {
		setNames = policies.Names() // the policy is chosen per trace
	}
	settings, err := parseSets(*sets, setNames)
	if err != nil {
		return err
	}
	var capBytes uint64
	if *capacity != "" {
		c, err := policies.ParseCapacity(*capacity)
		if err != nil {
			return cli.UsageError{Err: fmt.Errorf("--capacity: %v", err)}
		}
		capBytes = c
	}
	inputs, jobs, notes, err := fidelity.Inputs(fs.Args())
	if err != nil {
		return err
	}
	for _, n := range notes {
		fmt.Fprintf(stderr, "fidelity: %s\n", cli.Safe(n))
	}
	var out bytes.Buffer
	run := fidelity.Run{Policy: *policy, Settings: settings, Capacity: capBytes, CapacityGiven: *capacity != "", Opts: tracefile.Options{From: *from, Device: *device}}
	diverged, err := fidelity.Check(&out, inputs, jobs, run)
	if err != nil {
		return err
	}
	if _, err := stdout.Write(out.Bytes()); err != nil {
		return err
	}
	if diverged > 0 {
		return fmt.Errorf("fidelity: %d of %d traces diverge from their recording", diverged, len(inputs))
	}
	return nil
}

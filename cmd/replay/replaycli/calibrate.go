package replaycli

import (
	"bytes"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/gpualloc/allocsim/cmd/internal/cli"

	"github.com/spf13/pflag"

	"github.com/gpualloc/allocsim/gpu"
	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/trace"
	"github.com/gpualloc/allocsim/trace/atomicfile"
	"github.com/gpualloc/allocsim/trace/tracefile"
)

const calibrateUsage = `usage: replay calibrate [-o FILE] [flags]

Measures the latency of each device call by size on this GPU and writes a
cost model as CSV (the columns of the embedded H200 model), for
'replay gpu --cost-model FILE'. Last come the wake-up curves: how much
slower a cudaMalloc (20 MiB, and 4 KiB placed in a mapped page) and the
cudaFree after it are when the driver has been idle from 0.1 ms to 200 ms
(rows wake, wake_next, wake_suballoc and wake_suballoc_next, the idle time
in nanoseconds in the size column; about 0.8 s per --wake-reps). Progress
and a comparison with the embedded model go to stderr. Everything allocated
is freed at the end, on error and on Ctrl-C.

Flags:
`

func runCalibrate(stdout, stderr io.Writer, args []string) error {
	fs := pflag.NewFlagSet("calibrate", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(fs.Output(), calibrateUsage); fs.PrintDefaults() }
	out := fs.StringP("output", "o", "", "write the cost model to `FILE` (default: stdout)")
	cudart := fs.String("cudart", "", "`PATH` of the CUDA runtime library")
	maxSize := fs.String("max-size", "4GiB", "largest `SIZE` measured")
	maxBytes := fs.String("max-bytes", "0", "device memory `SIZE` held at once, never exceeded (0: free memory at the start minus 1 GiB)")
	n := fs.Int("n", 100, "`N` calls per size up to 256 MiB (fewer above)")
	events := fs.Int("workload-events", 50000, "`N` events of each workload replayed for the sub-allocation costs")
	wakeReps := fs.Int("wake-reps", 7, "`N` calls timed at each idle time for the wake-up curves")
	workloads := fs.StringArray("workload", nil, "a `TRACE` replayed for the sub-allocation costs (repeatable; default: the synthetic workloads train, inference, kvcache and service)")
	quiet := fs.Bool("quiet", false, "no progress lines")
	if help, err := cli.Parse(fs, args, stdout); help || err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("calibrate: unexpected arguments %q", fs.Args())
	}
	if err := checkOutputs(*workloads, "output", *out); err != nil {
		return err
	}
	var opt gpu.CalibrateOptions
	var err error
	if opt.MaxSize, err = policies.ParseSize(*maxSize); err != nil {
		return fmt.Errorf("--max-size: %v", err)
	}
	if opt.MaxBytes, err = policies.ParseSize(*maxBytes); err != nil {
		return fmt.Errorf("--max-bytes: %v", err)
	}
	if *n < 1 {
		return fmt.Errorf("--n %d: must be at least 1", *n)
	}
	if *events < 1 {
		return fmt.Errorf("--workload-events %d: must be at least 1", *events)
	}
	if *wakeReps < 1 {
		return fmt.Errorf("--wake-reps %d: must be at least 1", *wakeReps)
	}
	opt.N, opt.WorkloadEvents, opt.WakeReps = *n, *events, *wakeReps
	for _, path := range *workloads {
		// Opened once here, so that a bad file is reported before the GPU
		// is touched.
		f, err := tracefile.Open(path, tracefile.Options{})
		if err != nil {
			return fmt.Errorf("--workload: %w", err)
		}
		f.Close()
		opt.Workloads = append(opt.Workloads, gpu.Workload{Name: path, Open: func() (trace.Source, io.Closer, error) {
			f, err := tracefile.Open(path, tracefile.Options{})
			if err != nil {
				return nil, nil, err
			}
			return f, f, nil
		}})
	}
	if !*quiet {
		opt.Progress = stderr
	}
	rt, err := gpu.Open(*cudart)
	if err != nil {
		return err
	}
	defer rt.Close()
	fmt.Fprintf(stderr, "calibrating %s on %s (CUDA runtime %d, driver %d)\n", rt.Path, rt.DeviceName, rt.Version, rt.DriverVersion)
	ctx, stop, interrupted := interruptible()
	defer stop()
	rows, err := gpu.Calibrate(ctx, rt, opt)
	if err != nil {
		if ctx.Err() != nil {
			return interrupted("interrupted: everything allocated was freed")
		}
		return err
	}
	var buf bytes.Buffer
	made := fmt.Sprintf("made by replay calibrate on %s (CUDA runtime %d, driver %d), %s", rt.DeviceName, rt.Version, rt.DriverVersion, time.Now().UTC().Format(time.RFC3339))
	if err := gpu.WriteCostModel(&buf, made, rows); err != nil {
		return err
	}
	// The file must read back as a cost model.
	model, err := sim.ParseCostModel(bytes.NewReader(buf.Bytes()), "calibration")
	if err != nil {
		return fmt.Errorf("the calibration is not a usable cost model: %w", err)
	}
	if *out == "" {
		_, err = stdout.Write(buf.Bytes())
	} else {
		err = atomicfile.WriteFile(*out, func(w io.Writer) error { _, err := w.Write(buf.Bytes()); return err })
	}
	if err != nil {
		return err
	}
	compareModels(stderr, model, sim.DefaultCostModel())
	return nil
}

// compareModels prints the calibrated and embedded latencies of cudaMalloc
// and cudaFree side by side, then the extra latencies of the wake-up curves
// after 1, 10 and 100 ms idle (- where a model has no such curve).
func compareModels(w io.Writer, cal, def *sim.CostModel) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "call\tsize\tcalibrated us\t%s us\t\n", def.Source)
	for _, call := range []string{sim.CostMalloc, sim.CostFree, sim.CostMallocSuballoc, sim.CostFreeSuballoc} {
		for _, size := range gpu.CalibrationSizes {
			if call != sim.CostMalloc && call != sim.CostFree && size > sim.SubAllocMax {
				continue
			}
			a, ok := cal.Latency(call, size)
			b, _ := def.Latency(call, size)
			if ok {
				fmt.Fprintf(tw, "%s\t%d\t%.2f\t%.2f\t\n", call, size, float64(a)/1e3, float64(b)/1e3)
			}
		}
	}
	us := func(m *sim.CostModel, row string, gap int64) string {
		if ns, ok := m.Wake(row, gap); ok {
			return fmt.Sprintf("+%.2f", float64(ns)/1e3)
		}
		return "-"
	}
	for _, row := range []string{sim.CostWake, sim.CostWakeNext, sim.CostWakeSuballoc, sim.CostWakeSuballocNext} {
		for _, gap := range []int64{1e6, 10e6, 100e6} {
			if _, ok := cal.Wake(row, gap); ok {
				fmt.Fprintf(tw, "%s\t%d ms idle\t%s\t%s\t\n", row, gap/1e6, us(cal, row, gap), us(def, row, gap))
			}
		}
	}
	tw.Flush()
}

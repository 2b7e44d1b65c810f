package replaycli

import (
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"text/tabwriter"

	"github.com/gpualloc/allocsim/cmd/internal/cli"
	"github.com/gpualloc/allocsim/gpu"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/sim/results/tables"
)

// writeSimOnlyTable prints replay gpu --sim-only's table: per trace and
// policy, the simulated reserved bytes, device calls and allocator time,
// and the simulated latencies by call.
func writeSimOnlyTable(w io.Writer, rs []*sim.Result, pace bool, model string) {
	if pace {
		fmt.Fprintf(w, "paced: the trace's idle times charged as wake-ups (cost model %s)\n", model)
	} else {
		fmt.Fprintf(w, "unpaced: calls back to back, no wake-ups (cost model %s)\n", model)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "trace\tpolicy\treserved MiB\tfootprint MiB\tdevice allocs\tdevice frees\tretries\tOOMs\tsim alloc ms\tof it wake-ups\t")
	for _, r := range rs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%.3f\t%.3f\t\n", cli.Safe(filepath.Base(r.Trace)), cli.Safe(r.Policy), tables.MiB(r.PeakReserved), tables.MiB(r.PeakFootprint),
			r.DeviceAllocs, r.DeviceFrees, r.AllocRetries, r.OOMs, ms(r.SimAllocTimeNS), ms(r.SimWakeTimeNS))
	}
	tw.Flush()
	for _, r := range rs {
		fmt.Fprintf(w, "\n%s, %s: simulated latency by call\n", cli.Safe(filepath.Base(r.Trace)), cli.Safe(r.Policy))
		writeLatency(w, r.Latency)
	}
}

func writeGPUTable(w io.Writer, results []*gpu.Result) {
	if len(results) == 0 {
		return
	}
	fmt.Fprintf(w, "%s on %s\n", cli.Safe(results[0].Runtime), cli.Safe(results[0].Device))
	if m := results[0].SimCostModel; m != "" {
		fmt.Fprintf(w, "simulated alongside with cost model %s; sim/measured is the simulated allocator time over the measured\n", cli.Safe(m))
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "trace\ttarget\trequested MiB\treserved MiB\tsim reserved MiB\tdevice allocs\tdevice frees\tretries\tOOMs\talloc ms\tsim alloc ms\tof it wake-ups\tsim/measured\tsync ms\twall ms\t")
	for _, r := range results {
		simRes, simMS, wakeMS, ratio := "-", "-", "-", "-"
		if r.SimPolicy != "" {
			simRes, simMS = tables.MiB(r.SimPeakReserved), strconv.FormatFloat(ms(r.SimAllocTimeNS), 'f', 3, 64)
			wakeMS = strconv.FormatFloat(ms(r.SimWakeTimeNS), 'f', 3, 64)
			if r.AllocTimeNS > 0 {
				ratio = strconv.FormatFloat(float64(r.SimAllocTimeNS)/float64(r.AllocTimeNS), 'f', 3, 64)
			}
		}
		target := r.Policy
		if r.Paced {
			target += " (paced)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%.3f\t%s\t%s\t%s\t%.3f\t%.1f\t\n",
			cli.Safe(filepath.Base(r.Trace)), cli.Safe(target), tables.MiB(r.PeakRequested), tables.MiB(r.PeakReserved), simRes,
			r.DeviceAllocs, r.DeviceFrees, r.AllocRetries, r.OOMs, ms(r.AllocTimeNS), simMS, wakeMS, ratio, ms(r.SyncTimeNS), ms(r.ReplayWallNS))
	}
	tw.Flush()
	for _, r := range results {
		fmt.Fprintf(w, "\n%s, %s: measured latency by call\n", cli.Safe(filepath.Base(r.Trace)), cli.Safe(r.Policy))
		writeLatency(w, r.Latency)
		d := r.Driver
		fmt.Fprintf(w, "driver: cudaMemGetInfo free %s MiB at the start, %s MiB at least (%s MiB used), %s MiB at the end; limit %s MiB",
			tables.MiB(d.FreeAtStart), tables.MiB(d.MinFree), tables.MiB(d.FreeAtStart-min(d.FreeAtStart, d.MinFree)), tables.MiB(d.FreeAtEnd), tables.MiB(r.MaxBytes))
		if d.PoolReservedHigh > 0 || d.PoolUsedHigh > 0 {
			fmt.Fprintf(w, "; pool reserved high %s MiB, used high %s MiB", tables.MiB(d.PoolReservedHigh), tables.MiB(d.PoolUsedHigh))
		}
		fmt.Fprintln(w)
		if len(r.Runs) > 1 {
			fmt.Fprintf(w, "%d runs, allocator ms:", len(r.Runs))
			for _, run := range r.Runs {
				fmt.Fprintf(w, " %.3f", ms(run.AllocTimeNS))
			}
			fmt.Fprint(w, " (the median run is shown)")
			if lo, hi, ok := simOverRuns(r); ok {
				// The measurement's own spread beside the model's error:
				// runs minutes apart differ by up to half on an H200.
				fmt.Fprintf(w, "; sim/measured %.2f to %.2f over the runs", lo, hi)
			}
			fmt.Fprintln(w)
		}
		if c := r.CLoop; c != nil {
			fmt.Fprintf(w, "C loop of the same %d calls: %.3f ms plain (median; %.3f ms timing each call, %.3f ms in the calls); harness %.3f ms (median): %.0f ns per call over the plain loop (median of the runs, each against its own loop); outside the calls %.0f ns per call in the harness, %.0f in the timed loop\n",
				c.Calls, ms(c.WallNS), ms(c.TimedWallNS), ms(c.CallsNS), ms(c.HarnessWallNS), c.OverheadPerCallNS, c.OutsideCallsPerCallNS, c.LoopOutsideCallsPerCallNS)
		}
		switch {
		case r.Interrupted && r.Events == 0:
			fmt.Fprintf(w, "interrupted before the first event was replayed (while the trace was read)\n")
		case r.Interrupted:
			fmt.Fprintf(w, "interrupted after %d events\n", r.Events)
		}
		if r.Anomalies > 0 {
			fmt.Fprintf(w, "%d events could not be replayed as recorded; first: %s\n", r.Anomalies, cli.Safe(r.FirstAnomaly))
		}
	}
}

func writeLatency(w io.Writer, rows []sim.LatencyRow) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "call\tsize\tcount\tmedian us\tp90 us\tp99 us\tmax us\ttotal ms\t")
	us := func(ns int64) string { return strconv.FormatFloat(float64(ns)/1e3, 'f', 2, 64) }
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%.3f\t\n", r.Call, r.SizeClass, r.Count, us(r.MedianNS), us(r.P90NS), us(r.P99NS), us(r.MaxNS), ms(r.TotalNS))
	}
	tw.Flush()
}

// ms converts nanoseconds to milliseconds.
func ms(ns int64) float64 { return float64(ns) / 1e6 }

// simOverRuns returns the least and the most simulated allocator time
// over a run's measured one among r's runs, and false when r was not
// simulated alongside or a run measured no allocator time.
func simOverRuns(r *gpu.Result) (lo, hi float64, ok bool) {
	if r.SimAllocTimeNS <= 0 {
		return 0, 0, false
	}
	for i, run := range r.Runs {
		if run.AllocTimeNS <= 0 {
			return 0, 0, false
		}
		x := float64(r.SimAllocTimeNS) / float64(run.AllocTimeNS)
		if i == 0 || x < lo {
			lo = x
		}
		if i == 0 || x > hi {
			hi = x
		}
	}
	return lo, hi, len(r.Runs) > 0
}

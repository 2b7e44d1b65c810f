// Package progress shows on a terminal how far a long command has come:
// a count of replays (fit, tune) or of a sweep's cells.
package progress

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/gpualloc/allocsim/internal/termsafe"
	"github.com/gpualloc/allocsim/sim/sweep"
	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// Counter shows on stderr, where it is a terminal, how many replays
// a long command (fit, tune) has made, with a spinner and the time spent;
// elsewhere it is silent. Its Done is a sim.Config.Progress.
type Counter struct {
	bar *progressbar.ProgressBar
}

// NewCounter returns a counter described by desc, and total the
// replays to come (-1 where unknown: a spinner).
func NewCounter(stderr io.Writer, desc string, total int) *Counter {
	f, ok := stderr.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return &Counter{}
	}
	return &Counter{bar: progressbar.NewOptions(total,
		progressbar.OptionSetWriter(stderr),
		progressbar.OptionSetDescription(desc),
		progressbar.OptionShowCount(),
		progressbar.OptionSetItsString("replays"),
		progressbar.OptionShowIts(),
		progressbar.OptionShowElapsedTimeOnFinish(),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionClearOnFinish(),
	)}
}

// Done counts one replay; it may be called from several goroutines.
func (c *Counter) Done() {
	if c.bar != nil {
		c.bar.Add(1)
	}
}

// Progress returns Done as a sim.Config.Progress, nil where silent.
func (c *Counter) Progress() func() {
	if c.bar == nil {
		return nil
	}
	return c.Done
}

// Finish clears the display.
func (c *Counter) Finish() {
	if c.bar != nil {
		c.bar.Finish()
	}
}

// Sweep shows a sweep's progress on stderr: a bar on a terminal, a line
// per finished job elsewhere (NewSweep).
type Sweep interface {
	JobDone(j sweep.Job)
	Finish()
}

// NewSweep returns the display of mode (auto: a bar on a terminal, lines
// elsewhere; bar, lines or none) for total cells of which done are done
// already. It returns an error naming --progress for another mode.
func NewSweep(mode string, w io.Writer, total, done int) (Sweep, error) {
	if mode == "auto" {
		mode = "lines"
		if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
			mode = "bar"
		}
	}
	switch mode {
	case "none":
		return noProgress{}, nil
	case "lines":
		return &lineProgress{w: w, total: total, done: done}, nil
	case "bar":
		bar := progressbar.NewOptions(total,
			progressbar.OptionSetWriter(w),
			progressbar.OptionSetDescription("sweep"),
			progressbar.OptionShowCount(),
			progressbar.OptionSetItsString("cells"),
			progressbar.OptionShowIts(),
			progressbar.OptionSetPredictTime(true),
			progressbar.OptionFullWidth(),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionOnCompletion(func() { fmt.Fprintln(w) }),
		)
		if done > 0 {
			bar.Add(done)
		}
		return &barProgress{bar: bar}, nil
	}
	return nil, fmt.Errorf("--progress %q: want auto, bar, lines or none", mode)
}

type noProgress struct{}

func (noProgress) JobDone(sweep.Job) {}
func (noProgress) Finish()           {}

// lineProgress writes a line per finished job.
type lineProgress struct {
	w           io.Writer
	total, done int
}

func (p *lineProgress) JobDone(j sweep.Job) {
	p.done += len(j.Cells)
	status := fmt.Sprintf("%d cells in %.1f s", len(j.Cells), j.Elapsed.Seconds())
	if j.Err != nil {
		status = "failed: " + j.Err.Error()
	}
	fmt.Fprintf(p.w, "sweep: %d/%d %s: %s\n", p.done, p.total, termsafe.String(filepath.Base(j.Trace)), termsafe.String(status))
}

func (p *lineProgress) Finish() {}

type barProgress struct{ bar *progressbar.ProgressBar }

func (p *barProgress) JobDone(j sweep.Job) {
	p.bar.Describe("sweep " + termsafe.String(filepath.Base(j.Trace)))
	p.bar.Add(len(j.Cells))
}

func (p *barProgress) Finish() { p.bar.Finish() }

package replaycli

import (
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// replayCounter shows on stderr, where it is a terminal, how many replays
// a long command (fit, tune) has made, with a spinner and the time spent;
// elsewhere it is silent. Its Done is a sim.Config.Progress.
type replayCounter struct {
	bar *progressbar.ProgressBar
}

// newReplayCounter returns a counter described by desc, and total the
// replays to come (-1 where unknown: a spinner).
func newReplayCounter(stderr io.Writer, desc string, total int) *replayCounter {
	f, ok := stderr.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return &replayCounter{}
	}
	return &replayCounter{bar: progressbar.NewOptions(total,
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
func (c *replayCounter) Done() {
	if c.bar != nil {
		c.bar.Add(1)
	}
}

// Progress returns Done as a sim.Config.Progress, nil where silent.
func (c *replayCounter) Progress() func() {
	if c.bar == nil {
		return nil
	}
	return c.Done
}

// Finish clears the display.
func (c *replayCounter) Finish() {
	if c.bar != nil {
		c.bar.Finish()
	}
}

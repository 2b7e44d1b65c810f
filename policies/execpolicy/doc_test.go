package execpolicy_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/trace"
)

// TestProtocolDoc plays the session that docs/exec-protocol.md shows from
// both sides: a scripted child writes the session's child lines and checks
// that the engine, replaying the page's trace, writes the session's engine
// lines; and python/examples/firstfit.py, given a stream_sync hook and fed
// the session's engine lines, writes the session's child lines.
func TestProtocolDoc(t *testing.T) {
	needPython(t)
	page, err := os.ReadFile("../../docs/exec-protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	block := func(lang string) string {
		m := regexp.MustCompile("(?s)```" + lang + "\n(.*?)```").FindSubmatch(page)
		if m == nil {
			t.Fatalf("docs/exec-protocol.md has no ```%s block", lang)
		}
		return string(m[1])
	}
	text, session := block("trace"), block("session")
	var engine, child strings.Builder
	for _, l := range strings.Split(strings.TrimSpace(session), "\n") {
		switch {
		case strings.HasPrefix(l, "> "):
			engine.WriteString(l[2:] + "\n")
		case strings.HasPrefix(l, "< "):
			child.WriteString(l[2:] + "\n")
		default:
			t.Fatalf("session line %q: want '> ' or '< '", l)
		}
	}

	t.Run("engine", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "session")
		if err := os.WriteFile(file, []byte(session), 0o644); err != nil {
			t.Fatal(err)
		}
		h, evs := parse(t, text)
		rs, err := sim.Run(trace.NewSliceSource(h, evs), sim.Config{Policy: "exec:python3 testdata/script.py " + file, Capacity: 7 * mib})
		if err != nil {
			t.Fatal(err)
		}
		r := rs[0]
		if r.Mallocs != 3 || r.OOMs != 1 || r.DeviceAllocs != 2 || r.DeviceFrees != 1 || r.PeakReserved != 6*mib {
			t.Errorf("%d mallocs, %d OOMs, %d device allocs, %d device frees, peak reserved %d; the page says 3, 1, 2, 1, 6 MiB",
				r.Mallocs, r.OOMs, r.DeviceAllocs, r.DeviceFrees, r.PeakReserved)
		}
	})

	t.Run("child", func(t *testing.T) {
		cmd := exec.Command("python3", "-c", `
import io, sys
sys.path.insert(0, "../../python/examples")
import firstfit
from allocsim_policy import run

class Synced(firstfit.FirstFit):
    def stream_sync(self, stream):
        pass

out = io.BytesIO()
run(Synced(), io.BytesIO(sys.stdin.buffer.read()), out)
sys.stdout.buffer.write(out.getvalue())
`)
		cmd.Stdin = strings.NewReader(engine.String())
		got, err := cmd.Output()
		if err != nil {
			t.Fatalf("%v: %s", err, got)
		}
		if string(got) != child.String() {
			t.Errorf("firstfit.py wrote:\n%s\nthe page says:\n%s", got, child.String())
		}
	})
}

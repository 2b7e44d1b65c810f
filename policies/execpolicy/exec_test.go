package execpolicy_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/policies/execpolicy"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/trace"
	"github.com/gpualloc/allocsim/trace/tracefile"
)

// The tests run python3 children: the examples of python/ and the children
// of testdata/. Without python3 they are skipped, saying so.

const (
	mib = 1 << 20
	// devBase is the address of the simulated device's first segment;
	// later segments follow at 2 MiB-aligned, ascending, never reused
	// addresses.
	devBase = 0x7f0000000000
	// firstFit is the command of the Python first-fit example.
	firstFit = "python3 ../../python/examples/firstfit.py"
)

func needPython(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 is not installed: the exec policy's tests run Python children")
	}
}

func parse(t testing.TB, text string) (trace.Header, []trace.Event) {
	t.Helper()
	h, evs, err := trace.ParseText(t.Name(), strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	return h, evs
}

// noLeak fails t when goroutines started since before (a count) are still
// running after a while.
func noLeak(t *testing.T, before int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); runtime.NumGoroutine() > before; {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			t.Errorf("%d goroutines left running, %d before:\n%s", runtime.NumGoroutine(), before, buf[:runtime.Stack(buf, true)])
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// drive replays the mallocs and frees of a text-form trace against p by
// hand and returns the blocks of the mallocs in order (an OOM as the zero
// Block).
func drive(t *testing.T, p policies.Policy, text string) []policies.Block {
	t.Helper()
	_, evs := parse(t, text)
	var blocks []policies.Block
	live := map[uint64]uint64{} // trace address -> block address
	for i, ev := range evs {
		switch ev.Op {
		case trace.OpMalloc:
			b, err := p.Malloc(ev.Size, ev.Stream)
			if err != nil && !errors.Is(err, policies.ErrOutOfMemory) {
				t.Fatalf("event %d: %v", i, err)
			}
			blocks = append(blocks, b)
			live[ev.Addr] = b.Addr
		case trace.OpFree:
			if err := p.Free(live[ev.Addr], ev.Stream); err != nil {
				t.Fatalf("event %d: %v", i, err)
			}
		}
	}
	return blocks
}

// TestFirstFitBlocks replays a trace worked out by hand against the Python
// first-fit example and checks every block's address and size and the
// device's figures (the case of policies' TestFitReplay for the built-in
// first-fit, which the example follows).
func TestFirstFitBlocks(t *testing.T) {
	needPython(t)
	const seg = 2 * mib
	dev := sim.NewDevice(0)
	p, err := execpolicy.New(firstFit, dev, execpolicy.Options{Timeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	got := drive(t, p, `
malloc id=1 size=1000      # 1024 B at devBase, a 2 MiB segment
malloc id=2 size=512       # devBase+1024
malloc id=3 size=4096      # devBase+1536
free id=2                  # [devBase+1024, 512 B] free between two live blocks
malloc id=4 size=100       # 512 B: the hole at devBase+1024 (lowest, and an exact fit)
free id=1                  # [devBase, 1024 B] free
free id=4                  # coalesces with it: [devBase, 1536 B]
malloc id=5 size=1536      # devBase
free id=3                  # coalesces with the tail: [devBase+1536, 2 MiB - 1536]
malloc id=6 size=2095616   # 2 MiB - 1536: the whole tail, no remainder
malloc id=7 size=1         # segment full: a second one at devBase+2MiB
`)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	want := []policies.Block{
		{Addr: devBase, Size: 1024}, {Addr: devBase + 1024, Size: 512}, {Addr: devBase + 1536, Size: 4096},
		{Addr: devBase + 1024, Size: 512}, {Addr: devBase, Size: 1536}, {Addr: devBase + 1536, Size: seg - 1536},
		{Addr: devBase + seg, Size: 512},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("blocks:\n got %#v\nwant %#v", got, want)
	}
	if dev.PeakReserved() != 2*seg || dev.Allocs() != 2 || dev.Frees() != 0 {
		t.Errorf("device: peak reserved %d, %d allocs, %d frees; want %d, 2, 0", dev.PeakReserved(), dev.Allocs(), dev.Frees(), 2*seg)
	}
	if p.ChildName() != "firstfit.py" || p.Hooks() != (execpolicy.Hooks{EmptyCache: true, Pipeline: true}) {
		t.Errorf("handshake: name %q, hooks %+v; want firstfit.py, empty_cache and pipeline", p.ChildName(), p.Hooks())
	}
}

// capped is a trace for a device of 8 MiB, worked out by hand for the
// first-fit of the Python example (and of the built-in first-fit): a
// device OOM passed back to the child, which answers oom; a refusal that
// the release of a wholly free segment cures; empty_cache.
const capped = `
malloc id=1 size=3MiB   # segment A of 4 MiB at devBase; reserved 4 MiB
malloc id=2 size=1MiB   # devBase+3MiB, A's tail
malloc id=3 size=6MiB   # a 6 MiB segment: 4+6 > 8 refused, nothing wholly free: OOM
free id=1
free id=2               # A wholly free, cached
malloc id=4 size=6MiB   # refused again; A given back (device free 1); B of 6 MiB at devBase+4MiB
malloc id=5 size=1MiB   # B full: C of 2 MiB at devBase+10MiB; reserved 8 MiB, the peak
empty_cache             # B and C hold blocks: nothing given back
free id=5               # C wholly free
empty_cache             # C given back (device free 2); reserved 6 MiB
`

// TestCapacityThroughRun replays capped through sim.Run with a capacity:
// the device's OOM reaches the child, whose oom the replay counts.
func TestCapacityThroughRun(t *testing.T) {
	needPython(t)
	before := runtime.NumGoroutine()
	h, evs := parse(t, capped)
	rs, err := sim.Run(trace.NewSliceSource(h, evs),
		sim.Config{Policy: "exec:" + firstFit, Capacity: 8 * mib},
		sim.Config{Policy: "first-fit", Capacity: 8 * mib})
	if err != nil {
		t.Fatal(err)
	}
	type figures struct {
		Mallocs, OOMs, FirstOOMEvent, DeviceAllocs, DeviceFrees int64
		PeakReserved, PeakAllocated                             uint64
	}
	want := figures{Mallocs: 5, OOMs: 1, FirstOOMEvent: 2, DeviceAllocs: 3, DeviceFrees: 2, PeakReserved: 8 * mib, PeakAllocated: 7 * mib}
	for _, r := range rs {
		got := figures{r.Mallocs, r.OOMs, r.FirstOOMEvent, r.DeviceAllocs, r.DeviceFrees, r.PeakReserved, r.PeakAllocated}
		if got != want {
			t.Errorf("%s:\n got %+v\nwant %+v", r.Policy, got, want)
		}
	}
	noLeak(t, before)
}

// TestSameAsBuiltin replays a real PyTorch recording under a capacity that
// makes it run out of memory against the Python first-fit and the built-in
// first-fit, which must agree on every figure but those of the abilities
// an exec policy lacks (free space, retries).
func TestSameAsBuiltin(t *testing.T) {
	needPython(t)
	f, err := tracefile.Open("../../testdata/pytorch/churn.pickle.gz", tracefile.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	evs, err := trace.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := sim.Run(trace.NewSliceSource(f.Header(), evs),
		sim.Config{Policy: "exec:" + firstFit, Capacity: 1 << 30},
		sim.Config{Policy: "first-fit", Capacity: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	ex, ff := *rs[0], *rs[1]
	if ff.OOMs == 0 || ff.DeviceFrees == 0 {
		t.Fatalf("the built-in first-fit had %d OOMs and %d device frees: the trace no longer tests them", ff.OOMs, ff.DeviceFrees)
	}
	sameFigures(t, &ex, &ff)
}

// sameFigures reports whether the result of an exec policy ex has the
// figures of the built-in policy's, ff, but those of the abilities an
// exec policy lacks (free space, retries) and its name, and fails t
// naming each field that differs.
func sameFigures(t interface {
	Helper()
	Errorf(string, ...any)
}, ex, ff *sim.Result) bool {
	t.Helper()
	e := *ex
	e.Policy, e.Series, e.AllocRetries, e.Warnings = ff.Policy, ff.Series, ff.AllocRetries, ff.Warnings
	if reflect.DeepEqual(e, *ff) {
		return true
	}
	ev, fv := reflect.ValueOf(e), reflect.ValueOf(*ff)
	for i := range ev.NumField() {
		if a, b := ev.Field(i).Interface(), fv.Field(i).Interface(); !reflect.DeepEqual(a, b) {
			t.Errorf("%s: %s %v, %s %v", ev.Type().Field(i).Name, ex.Policy, a, ff.Policy, b)
		}
	}
	return false
}

// TestHooks checks what a child gets: the hooks it asks for, in trace
// order, a marker's label escaped and back, and nothing it did not ask for.
func TestHooks(t *testing.T) {
	needPython(t)
	h, evs := parse(t, `
malloc id=1 size=100 stream=1
stream_sync stream=1
device_sync
event_record event=7 stream=1
stream_wait_event event=7 stream=2
event_sync event=7
marker label=X
free id=1 stream=1
empty_cache
malloc id=2 size=200
`)
	for i := range evs {
		if evs[i].Op == trace.OpMarker {
			evs[i].Label = "step 1\nback\\slash \\n"
		}
	}
	all := fmt.Sprintf(`malloc 100 1
stream_sync 1
device_sync
event_record 7 1
stream_wait_event 2 7
event_sync 7
marker 'step 1\nback\\slash \\n'
free %#x 1
empty_cache
malloc 200 0
`, devBase)
	for _, tc := range []struct {
		mode, want string
	}{
		{"all", all},
		{"ack", all},
		{"nohooks", fmt.Sprintf("malloc 100 1\nfree %#x 1\nmalloc 200 0\n", devBase)},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			log := filepath.Join(t.TempDir(), "log")
			name := fmt.Sprintf("exec:python3 testdata/logger.py %s %s", log, tc.mode)
			if _, err := sim.Run(trace.NewSliceSource(h, evs), sim.Config{Policy: name}); err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(log)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want {
				t.Errorf("the child got:\n%s\nwant:\n%s", got, tc.want)
			}
		})
	}
}

// TestBadChildren checks that a child that breaks the protocol fails the
// replay with one line that names the command and the line at fault,
// without a panic, a hang or a goroutine left behind.
func TestBadChildren(t *testing.T) {
	needPython(t)
	const two = `
malloc id=1 size=4096
malloc id=2 size=4096
free id=1
malloc id=3 size=4096
`
	for _, tc := range []struct {
		name, command, trace string
		kind                 error
		want                 []string // substrings of the error
	}{
		{"exits at once", `python3 -c "import sys; sys.exit(3)"`, two, execpolicy.ErrExited,
			[]string{`exec policy "python3 -c \"import sys; sys.exit(3)\""`, "it closed its output while the engine waited for an answer to \"the handshake\": exit status 3"}},
		{"no such command", "./no-such-child", two, execpolicy.ErrExited, []string{"cannot start"}},
		{"garbage handshake", "python3 testdata/bad.py garbage-hello", two, execpolicy.ErrProtocol,
			[]string{`output line 1 "hello there": want the handshake: allocsim-policy VERSION NAME [HOOK...]`}},
		{"other version", "python3 testdata/bad.py version", two, execpolicy.ErrProtocol,
			[]string{"the child speaks protocol version 2; this engine speaks version 1"}},
		{"garbage answer", "python3 testdata/bad.py garbage-answer", two, execpolicy.ErrProtocol,
			[]string{`output line 2 "banana 12": want the answer to malloc: ok ADDR [SIZE] or oom [TEXT]`}},
		{"address outside its segments", "python3 testdata/bad.py outside", two, execpolicy.ErrPlacement,
			[]string{`output line 2 "ok 4096 4096": block [0x1000, +4096) is not inside a device segment it got (device_alloc)`}},
		{"block past its segment's end", "python3 testdata/bad.py past-end", two, execpolicy.ErrPlacement,
			[]string{"block [0x7f00001ffe00, +4096) runs past the end of its device segment [0x7f0000000000, +2097152)"}},
		{"overlapping blocks", "python3 testdata/bad.py overlap", two, execpolicy.ErrPlacement,
			[]string{"block [0x7f0000000100, +4096) overlaps block [0x7f0000000000, +4096), handed out before and not freed"}},
		{"block in a segment given back", "python3 testdata/bad.py free-live-segment", two, execpolicy.ErrPlacement,
			[]string{`output line 4 "ok 139637976727552": block [0x7f0000000000, +4096) is not inside a device segment it got (device_alloc)`}},
		{"exits mid-replay", "python3 testdata/bad.py exit-after-hello", two, execpolicy.ErrExited,
			[]string{"exit status 4", "(its stderr: bad.py: giving up)"}},
		{"raises in malloc", "python3 testdata/raises.py", two, execpolicy.ErrChild,
			[]string{`output line 4 "error malloc 4096 0: ValueError: no second malloc here": the child failed`, "(its stderr: ValueError: no second malloc here)"}},
		{"raises in a free", "python3 testdata/raises.py", "malloc id=1 size=10\nfree id=1\n", execpolicy.ErrChild,
			[]string{"error free_malloc 1 0: KeyError: 139637976727552"}},
		{"hangs", "python3 -S testdata/bad.py hang", two, execpolicy.ErrTimeout,
			[]string{`no answer to "malloc 4096 0" within 2s: killed`}},
		{"asks again and again for what the device refuses", "python3 testdata/bad.py retry-device", two, execpolicy.ErrProtocol,
			[]string{"4096 device_alloc refused while handling one event"}},
		{"hangs after its input closed", "python3 -S testdata/bad.py hang-exit", "marker label=iteration\n", execpolicy.ErrTimeout,
			[]string{"did not exit within 2s of the end of its input: killed"}},
		{"hangs before its handshake", "python3 -S testdata/bad.py hang-hello", two, execpolicy.ErrTimeout,
			[]string{`no answer to "the handshake" within 2s: killed`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if strings.Contains(tc.name, "hangs") {
				// The timeout bounds the child's start too: python3 -S
				// starts without site-packages, which some machines are
				// slow to load (half a second, more under load).
				t.Setenv(execpolicy.TimeoutEnv, "2s")
			}
			before := runtime.NumGoroutine()
			h, evs := parse(t, tc.trace)
			start := time.Now()
			_, err := sim.Run(trace.NewSliceSource(h, evs), sim.Config{Policy: "exec:" + tc.command})
			if err == nil {
				t.Fatal("no error")
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Errorf("took %v", d)
			}
			if !errors.Is(err, tc.kind) {
				t.Errorf("error %q is not %v", err, tc.kind)
			}
			msg := err.Error()
			if strings.Contains(msg, "\n") {
				t.Errorf("error of more than one line: %q", msg)
			}
			if !strings.HasPrefix(msg, "policy exec:"+tc.command+": ") {
				t.Errorf("error %q does not start with the policy's name", msg)
			}
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q\nwant it to hold %q", msg, w)
				}
			}
			noLeak(t, before)
		})
	}
}

// TestSegmentFreedUnderBlock: a child that gives back a segment in which a
// block it handed out is live.
func TestSegmentFreedUnderBlock(t *testing.T) {
	needPython(t)
	dir := t.TempDir()
	child := filepath.Join(dir, "child.py")
	os.WriteFile(child, []byte(`import sys
print("allocsim-policy 1 x", flush=True)
sys.stdin.readline()
print("device_alloc 2097152", flush=True)
seg = int(sys.stdin.readline().split()[1])
print("ok %d" % seg, flush=True)
sys.stdin.readline()
print("device_free %d" % seg)
print("oom", flush=True)
sys.stdin.read()
`), 0o644)
	dev := sim.NewDevice(0)
	p, err := execpolicy.New("python3 "+child, dev, execpolicy.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := p.Malloc(100, 0); err != nil {
		t.Fatal(err)
	}
	_, err = p.Malloc(100, 0)
	want := `output line 4 "device_free 139637976727552": device_free of segment [0x7f0000000000, +2097152) with block [0x7f0000000000, +100) live in it`
	if !errors.Is(err, execpolicy.ErrPlacement) || !strings.Contains(err.Error(), want) {
		t.Errorf("error %v, want %q", err, want)
	}
	if p.Close() != err {
		t.Errorf("Close does not return the policy's failure")
	}
}

// TestCloseReportsLateError: an error of a free that nothing waited for is
// reported at Close, the end of the replay.
func TestCloseReportsLateError(t *testing.T) {
	needPython(t)
	p, err := execpolicy.New("python3 testdata/raises.py", sim.NewDevice(0), execpolicy.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.Malloc(10, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Free(b.Addr, 0); err != nil {
		t.Fatalf("Free: %v (the free is not waited for)", err)
	}
	err = p.Close()
	if !errors.Is(err, execpolicy.ErrChild) || !strings.Contains(err.Error(), "KeyError") {
		t.Errorf("Close: %v, want the child's KeyError", err)
	}
}

// TestScheme checks the registration: Lookup's abilities without a
// process, a bad command, settings refused.
func TestScheme(t *testing.T) {
	in, ok := policies.Lookup("exec:python3 x.py")
	if !ok {
		t.Fatal("exec:python3 x.py is unknown")
	}
	want := policies.Abilities{Syncer: true, Marker: true, Releaser: true}
	if in.Name != "exec:python3 x.py" || in.Abilities != want {
		t.Errorf("Lookup: %q %+v, want abilities %+v", in.Name, in.Abilities, want)
	}
	if err := policies.Known("exec:python3 'x.py"); err == nil || !strings.Contains(err.Error(), "unclosed single quote") {
		t.Errorf("Known of an unclosed quote: %v", err)
	}
	if err := policies.Known("exec:"); err == nil || !strings.Contains(err.Error(), "no command") {
		t.Errorf("Known of exec: with no command: %v", err)
	}
	_, err := policies.New("exec:python3 x.py", sim.NewDevice(0), policies.Settings{"k": "v"})
	if err == nil || !strings.Contains(err.Error(), "takes no settings") {
		t.Errorf("New with settings: %v", err)
	}
	// Built and dropped without an event: nothing started, nothing to close.
	p, err := policies.New("exec:./no-such-child", sim.NewDevice(0), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.(*execpolicy.Policy).Close(); err != nil {
		t.Errorf("Close of a policy never started: %v", err)
	}
}

func TestSplit(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
		err  string
	}{
		{in: "python3 my_policy.py", want: []string{"python3", "my_policy.py"}},
		{in: "  python3\t-u  a.py ", want: []string{"python3", "-u", "a.py"}},
		{in: `python3 'my policy.py' --name="a b" x\ y`, want: []string{"python3", "my policy.py", "--name=a b", "x y"}},
		{in: `sh -c "echo \"hi\" \\ \$HOME"`, want: []string{"sh", "-c", `echo "hi" \ \$HOME`}},
		{in: `a '' b`, want: []string{"a", "", "b"}},
		{in: "a 'b", err: "unclosed single quote"},
		{in: `a "b`, err: "unclosed double quote"},
		{in: `a \`, err: "trailing backslash"},
		{in: "   ", err: "no command"},
	} {
		got, err := execpolicy.Split(tc.in)
		switch {
		case tc.err != "":
			if err == nil || err.Error() != tc.err {
				t.Errorf("Split(%q): error %v, want %q", tc.in, err, tc.err)
			}
		case err != nil:
			t.Errorf("Split(%q): %v", tc.in, err)
		case !reflect.DeepEqual(got, tc.want):
			t.Errorf("Split(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

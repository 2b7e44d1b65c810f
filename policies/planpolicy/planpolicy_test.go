package planpolicy_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/policies/planpolicy"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/trace"
	"github.com/gpualloc/allocsim/trace/minimalloc"
)

// testdata is the repository's testdata/plan, from this package's directory.
const testdata = "../../testdata/plan"

// planner is the command of the test planner, greedy by size with first fit.
const planner = "python3 " + testdata + "/planner.py"

// tinyPeak is the peak of tiny.solution.csv, worked by hand: buffer 2 at
// 20480, 2048 bytes.
const tinyPeak = 22528

// tinyOffsets are the offsets of tiny.solution.csv's buffers by id.
var tinyOffsets = []uint64{8192, 0, 20480, 16384, 0}

func readTiny(t *testing.T) (trace.Header, []trace.Event) {
	t.Helper()
	f, err := os.Open(filepath.Join(testdata, "tiny.trace"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h, evs, err := trace.ParseText("tiny.trace", f)
	if err != nil {
		t.Fatal(err)
	}
	return h, evs
}

func needPython(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 is not on PATH: the test planner testdata/plan/planner.py cannot run")
	}
}

// script writes a planner shell script to dir and returns the command
// that runs it.
func script(t *testing.T, dir, name, body string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return "sh " + path
}

// device is a Device that hands out addresses from 1<<40 and refuses
// what passes its capacity (0: none).
type device struct {
	capacity, reserved, next uint64
	allocs                   int
}

func (d *device) Alloc(size uint64) (uint64, error) {
	if d.capacity > 0 && d.reserved+size > d.capacity {
		return 0, fmt.Errorf("device alloc of %d bytes: %w", size, policies.ErrOutOfMemory)
	}
	d.allocs++
	d.reserved += size
	addr := 1<<40 + d.next
	d.next += size
	return addr, nil
}

func (d *device) Free(addr uint64) error { return nil }

// TestProblem checks the problem the policy writes of tiny.trace byte for
// byte against tiny.problem.csv, written by hand, through the policy
// itself (a planner that copies its input aside and answers with the
// hand-worked tiny.solution.csv, no python needed).
func TestProblem(t *testing.T) {
	_, evs := readTiny(t)
	dir := t.TempDir()
	kept := filepath.Join(dir, "problem.csv")
	cmd := script(t, dir, "copy.sh", fmt.Sprintf("cp \"$1\" %q && cp %q \"$2\"\n", kept, filepath.Join(testdata, "tiny.solution.csv")))
	p, err := planpolicy.New(cmd, &device{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Plan(evs); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(kept)
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(filepath.Join(testdata, "tiny.problem.csv"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("problem written:\n%s\nwant (tiny.problem.csv):\n%s", got, want)
	}
	st := p.Stats()
	if st.Buffers != 5 || st.NeverFreed != 1 || st.Failed != 1 || st.Peak != tinyPeak {
		t.Errorf("stats %+v, want 5 buffers, 1 never freed, 1 failed, peak %d", st, tinyPeak)
	}
}

// TestProblemRoundTrip reads the problem written back with package
// minimalloc: its trace's mallocs and frees come in the order of the
// trace's own device mallocs and frees (of the buffers), which is what
// makes lower and upper mean the same thing in both directions.
func TestProblemRoundTrip(t *testing.T) {
	_, evs := readTiny(t)
	bufs := planpolicy.Buffers(evs)
	var b bytes.Buffer
	if err := planpolicy.WriteProblem(&b, bufs); err != nil {
		t.Fatal(err)
	}
	read, err := minimalloc.Read(&b, "problem.csv")
	if err != nil {
		t.Fatal(err)
	}
	if len(read) != len(bufs) {
		t.Fatalf("%d buffers read back, %d written", len(read), len(bufs))
	}
	for k, r := range read {
		w := bufs[k]
		if r.ID != fmt.Sprint(w.ID) || r.Lower != w.Lower || r.Upper != w.Upper || r.Size != w.Size {
			t.Errorf("buffer %d read back as %+v, written %+v", k, r, w)
		}
	}
	// The order of the lifetimes' ends: by buffer, "+" a malloc, "-" a free.
	var got []string
	for _, ev := range minimalloc.Events(read) {
		sign := "+"
		if ev.Op == trace.OpFree {
			sign = "-"
		}
		got = append(got, fmt.Sprintf("%s%d", sign, ev.Addr-1))
	}
	// Worked by hand from tiny.trace: buffer 3 never freed and buffer 4,
	// failed, freed at the next event.
	want := []string{"+0", "+1", "-0", "+2", "-1", "+3", "+4", "-4", "-2", "-3"}
	if !slices.Equal(got, want) {
		t.Errorf("events read back %v, want %v", got, want)
	}
}

// TestPlannerTiny runs planner.py on tiny.trace: its solution is
// tiny.solution.csv byte for byte, the policy serves every malloc at the
// hand-worked offsets, and a replay reserves the plan's peak once.
func TestPlannerTiny(t *testing.T) {
	needPython(t)
	h, evs := readTiny(t)
	dir := t.TempDir()
	kept := filepath.Join(dir, "solution.csv")
	cmd := fmt.Sprintf("%s \"$1\" \"$2\" && cp \"$2\" %q && :", planner, kept)

	d := &device{}
	p, err := planpolicy.New(cmd, d, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Plan(evs); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(kept)
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(filepath.Join(testdata, "tiny.solution.csv"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("planner.py's solution:\n%s\nwant (tiny.solution.csv):\n%s", got, want)
	}
	if st := p.Stats(); st.Peak != tinyPeak {
		t.Errorf("peak %d, want %d", st.Peak, tinyPeak)
	}
	// The malloc calls a replay makes, in order: buffers 0..3, the null
	// block between 4 (failed) and its free.
	const base = 1 << 40
	for k, c := range []struct{ size, addr uint64 }{
		{4096, base + tinyOffsets[0]}, {8192, base + tinyOffsets[1]}, {2048, base + tinyOffsets[2]},
		{4096, base + tinyOffsets[3]}, {16384, base + tinyOffsets[4]}, {0, 0},
	} {
		b, err := p.Malloc(c.size, 0)
		if err != nil {
			t.Fatalf("malloc #%d: %v", k, err)
		}
		if b.Addr != c.addr || b.Size != c.size {
			t.Errorf("malloc #%d of %d bytes: block %+v, want {Addr:%#x Size:%d}", k, c.size, b, c.addr, c.size)
		}
	}
	if _, err := p.Malloc(1, 0); err == nil || !strings.Contains(err.Error(), "does not follow the plan (expected none") {
		t.Errorf("a malloc past the plan: %v", err)
	}
	if d.allocs != 1 || d.reserved != tinyPeak {
		t.Errorf("%d device allocations of %d bytes, want one of %d", d.allocs, d.reserved, tinyPeak)
	}

	res, err := sim.Run(trace.NewSliceSource(h, evs), sim.Config{Policy: planpolicy.SchemeName + ":" + cmd, Check: true})
	if err != nil {
		t.Fatal(err)
	}
	r := res[0]
	if r.PeakReserved != tinyPeak || r.OOMs != 0 || r.SourceOOMsServed != 1 {
		t.Errorf("replay: peak reserved %d, %d OOMs, %d source OOMs served; want %d, 0, 1", r.PeakReserved, r.OOMs, r.SourceOOMsServed, tinyPeak)
	}
}

// TestCapacity replays tiny.trace under a capacity below the plan's peak:
// the region is refused, and every malloc of non-zero size is an OOM.
func TestCapacity(t *testing.T) {
	h, evs := readTiny(t)
	dir := t.TempDir()
	cmd := script(t, dir, "answer.sh", fmt.Sprintf("cp %q \"$2\"\n", filepath.Join(testdata, "tiny.solution.csv")))
	res, err := sim.Run(trace.NewSliceSource(h, evs), sim.Config{Policy: "plan:" + cmd, Capacity: tinyPeak - 1, Check: true})
	if err != nil {
		t.Fatal(err)
	}
	if r := res[0]; r.OOMs != 5 || r.PeakReserved != 0 {
		t.Errorf("under a capacity of %d: %d OOMs, peak reserved %d; want 5 (4 mallocs, 1 failed malloc) and 0", tinyPeak-1, r.OOMs, r.PeakReserved)
	}
	res, err = sim.Run(trace.NewSliceSource(h, evs), sim.Config{Policy: "plan:" + cmd, Capacity: tinyPeak, Check: true})
	if err != nil {
		t.Fatal(err)
	}
	if r := res[0]; r.OOMs != 0 || r.PeakReserved != tinyPeak {
		t.Errorf("under a capacity of %d: %d OOMs, peak reserved %d; want 0 and %d", tinyPeak, r.OOMs, r.PeakReserved, tinyPeak)
	}
}

// TestMallocOffPlan: a malloc of a size the plan does not have next is an
// error, not an OOM.
func TestMallocOffPlan(t *testing.T) {
	_, evs := readTiny(t)
	cmd := script(t, t.TempDir(), "answer.sh", fmt.Sprintf("cp %q \"$2\"\n", filepath.Join(testdata, "tiny.solution.csv")))
	p, err := planpolicy.New(cmd, &device{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Malloc(4096, 0); err == nil || !strings.Contains(err.Error(), "no plan") {
		t.Errorf("malloc before Plan: %v", err)
	}
	if err := p.Plan(evs); err != nil {
		t.Fatal(err)
	}
	_, err = p.Malloc(4097, 0)
	if err == nil || errors.Is(err, policies.ErrOutOfMemory) || !strings.Contains(err.Error(), "malloc #0 of 4097 bytes on stream 0x0 does not follow the plan (expected 4096 bytes)") {
		t.Errorf("malloc of another size: %v", err)
	}
}

// TestBadPlanners: a planner that answers wrongly, fails or hangs gives
// one clear line of error, naming what is wrong.
func TestBadPlanners(t *testing.T) {
	_, evs := readTiny(t)
	dir := t.TempDir()
	answer := func(name, csv string) string {
		path := filepath.Join(dir, name+".csv")
		if err := os.WriteFile(path, []byte(csv), 0o644); err != nil {
			t.Fatal(err)
		}
		return script(t, dir, name+".sh", fmt.Sprintf("cp %q \"$2\"\n", path))
	}
	const head = "id,lower,upper,size,offset\n"
	for _, tc := range []struct {
		name, command string
		timeout       string
		want          string
	}{
		{"overlap", answer("overlap", head+"0,0,2,4096,8192\n1,1,6,8192,0\n2,3,11,2048,6144\n3,7,13,4096,16384\n4,8,9,16384,0\n"),
			"", "buffers 1 and 2 overlap: 1 at [0, 8192), 2 at [6144, 8192), both live at event 3 (lifetimes [1, 6) and [3, 11))"},
		{"overlap-failed", answer("overlap-failed", head+"0,0,2,4096,8192\n1,1,6,8192,0\n2,3,11,2048,20480\n3,7,13,4096,16000\n4,8,9,16384,0\n"),
			"", "buffers 4 and 3 overlap: 4 at [0, 16384), 3 at [16000, 20096), both live at event 8"},
		{"dropped", answer("dropped", head+"0,0,2,4096,8192\n1,1,6,8192,0\n3,7,13,4096,16384\n4,8,9,16384,0\n"),
			"", "buffer 2 (lower 3, upper 11, size 2048) has no offset"},
		{"twice", answer("twice", head+"0,0,2,4096,8192\n1,1,6,8192,0\n2,3,11,2048,20480\n2,3,11,2048,20480\n3,7,13,4096,16384\n4,8,9,16384,0\n"),
			"", ":5: buffer 2: a second offset (the first on line 4)"},
		{"unknown-id", answer("unknown-id", head+"7,0,2,4096,8192\n"),
			"", `:2: id "7": no such buffer in the problem (ids 0 to 4)`},
		{"resized", answer("resized", head+"0,0,2,4096,8192\n1,1,6,4096,0\n"),
			"", `:3: buffer 1: size "4096", the problem's is 8192`},
		{"moved", answer("moved", "id,start,end,size,offset\n0,0,2,4096,8192\n"),
			"", `:2: buffer 0: end "2", the problem's is 1`},
		{"no-offset", answer("no-offset", "id,lower,upper,size\n0,0,2,4096\n"),
			"", "not a solution (no id,...,size,offset header): no offset column"},
		{"bad-offset", answer("bad-offset", head+"0,0,2,4096,-1\n"),
			"", `:2: buffer 0: offset "-1": not an unsigned integer`},
		{"past-2^64", answer("past-2^64", head+"0,0,2,4096,18446744073709551615\n1,1,6,8192,0\n2,3,11,2048,20480\n3,7,13,4096,16384\n4,8,9,16384,0\n"),
			"", "buffer 0: offset 18446744073709551615 + size 4096 passes 2^64"},
		{"no-output", script(t, dir, "silent.sh", "exit 0\n"),
			"", "exited 0 but wrote no solution"},
		{"exit", script(t, dir, "fail.sh", "echo 'reading problem' >&2\necho 'infeasible under 1048576 bytes' >&2\nexit 3\n"),
			"", `exited with status 3; stderr: "reading problem | infeasible under 1048576 bytes"`},
		{"not-found", "/nonexistent/planner",
			"", "exited with status 127; stderr:"},
		{"hang", script(t, dir, "hang.sh", "echo 'thinking' >&2\nsleep 30\n"),
			"300ms", `its time limit (the timeout setting, or ALLOCSIM_PLAN_TIMEOUT); stderr: "thinking"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s policies.Settings
			if tc.timeout != "" {
				s = policies.Settings{"timeout": tc.timeout}
			}
			p, err := planpolicy.New(tc.command, &device{}, s)
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			err = p.Plan(evs)
			if err == nil {
				t.Fatalf("Plan: no error, want one with %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Plan: %v\nwant it to say %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("Plan's error is more than one line: %q", err)
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Errorf("Plan took %v", d)
			}
			if _, err := p.Malloc(4096, 0); err == nil {
				t.Error("Malloc after a failed Plan: no error")
			}
		})
	}
}

// TestSettings: the scheme's name, abilities and settings.
func TestSettings(t *testing.T) {
	in, ok := policies.Lookup("plan:python3 x.py")
	if !ok || !in.Abilities.Planner || in.Name != "plan:python3 x.py" {
		t.Errorf("Lookup: %+v, %v; want a Planner named plan:python3 x.py", in, ok)
	}
	if err := policies.Known("plan:"); err == nil || !strings.Contains(err.Error(), "needs a command") {
		t.Errorf("Known(plan:): %v", err)
	}
	p, err := policies.New("plan:true", &device{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := p.(policies.Planner); !ok {
		t.Error("policies.New(plan:true) is no Planner")
	}
	for _, tc := range []struct {
		s    policies.Settings
		want string
	}{
		{policies.Settings{"timeout": "soon"}, `setting timeout="soon": not a positive duration`},
		{policies.Settings{"timeout": "-1s"}, `setting timeout="-1s": not a positive duration`},
		{policies.Settings{"alignment": "256"}, `unknown setting "alignment" (known: timeout)`},
	} {
		if _, err := planpolicy.New("true", &device{}, tc.s); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New with %v: %v, want %q", tc.s, err, tc.want)
		}
	}
	t.Setenv(planpolicy.TimeoutEnv, "never")
	if _, err := planpolicy.New("true", &device{}, nil); err == nil || !strings.Contains(err.Error(), `ALLOCSIM_PLAN_TIMEOUT="never"`) {
		t.Errorf("New with %s=never: %v", planpolicy.TimeoutEnv, err)
	}
}

// miniMallocDir is where the MiniMalloc benchmarks are looked for:
// $ALLOCSIM_TRACES/minimalloc, else the shared trace collection.
func miniMallocDir() string {
	if d := os.Getenv("ALLOCSIM_TRACES"); d != "" {
		return filepath.Join(d, "minimalloc")
	}
	return filepath.Join("..", "..", "..", "shared", "traces", "minimalloc")
}

// TestMiniMalloc replays MiniMalloc's benchmarks A..K (each solvable in
// 1048576 bytes) under plan: with planner.py: the replay's peak reserved
// bytes are the planner's own peak, the largest offset+size of its
// solution. $PLAN_ORDER=best runs planner.py's portfolio and search
// instead of greedy by size (slower).
func TestMiniMalloc(t *testing.T) {
	needPython(t)
	paths, _ := filepath.Glob(filepath.Join(miniMallocDir(), "[A-K].1048576.csv"))
	if len(paths) == 0 {
		t.Skipf("no MiniMalloc benchmarks in %s (set ALLOCSIM_TRACES to the trace collection)", miniMallocDir())
	}
	order := "size"
	if o := os.Getenv("PLAN_ORDER"); o != "" {
		order = o
	}
	dir := t.TempDir()
	for _, path := range paths {
		name := strings.TrimSuffix(filepath.Base(path), ".1048576.csv")
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f, err := os.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			src, err := minimalloc.Import(f, path)
			f.Close()
			if err != nil {
				t.Fatal(err)
			}
			kept := filepath.Join(dir, name+".solution.csv")
			cmd := fmt.Sprintf("%s --order %s \"$1\" \"$2\" && cp \"$2\" %q && :", planner, order, kept)
			res, err := sim.Run(src, sim.Config{Policy: "plan:" + cmd, Check: true})
			if err != nil {
				t.Fatal(err)
			}
			peak := solutionPeak(t, kept)
			r := res[0]
			if r.PeakReserved != peak || r.OOMs != 0 {
				t.Errorf("peak reserved %d with %d OOMs, the planner's peak %d", r.PeakReserved, r.OOMs, peak)
			}
			t.Logf("%s: planner.py --order %s: peak %d (%.3f of 1048576)", name, order, peak, float64(peak)/1048576)
		})
	}
}

// solutionPeak returns the largest offset+size of the solution at path.
func solutionPeak(t *testing.T, path string) uint64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var peak uint64
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n")[1:] {
		var id string
		var lower, upper int64
		var size, off uint64
		if _, err := fmt.Sscanf(strings.ReplaceAll(line, ",", " "), "%s %d %d %d %d", &id, &lower, &upper, &size, &off); err != nil {
			t.Fatalf("%s: %q: %v", path, line, err)
		}
		peak = max(peak, off+size)
	}
	return peak
}

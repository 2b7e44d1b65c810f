package sopolicy_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/policies/policytest"
	"github.com/gpualloc/allocsim/policies/sopolicy"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/trace"
)

// The tests build the libraries of testdata/ with the C compiler; without
// one they are skipped, saying so.

const (
	mib = 1 << 20
	// devBase is the address of the simulated device's first segment;
	// later segments follow at 2 MiB-aligned, ascending addresses.
	devBase = 0x7f0000000000
)

var libs struct {
	once sync.Once
	dir  string
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if libs.dir != "" {
		os.RemoveAll(libs.dir)
	}
	os.Exit(code)
}

// lib returns the path of a test library built from testdata/:
// "cudart13" and "cudart12" (caching.c linked against a stub
// libcudart.so.13 or .12, as a real pluggable allocator links -lcudart),
// "bare" (caching.c linked against nothing), "null" (null.c),
// "transitive" (a library needing one that needs a libcudart.so.11.0 that
// is not the shim).
func lib(t testing.TB, name string) string {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skipf("no gcc to build the test libraries: %v", err)
	}
	libs.once.Do(buildLibs)
	if libs.err != nil {
		t.Fatalf("building the test libraries: %v", libs.err)
	}
	return filepath.Join(libs.dir, name+".so")
}

func buildLibs() {
	dir, err := os.MkdirTemp("", "sopolicy-test-")
	if err != nil {
		libs.err = err
		return
	}
	libs.dir = dir
	src := func(f string) string { s, _ := filepath.Abs(filepath.Join("testdata", f)); return s }
	for _, v := range []string{"12", "13", "11.0"} {
		stub := filepath.Join(dir, "stub"+v)
		if err := os.MkdirAll(stub, 0o755); err != nil {
			libs.err = err
			return
		}
		if libs.err = gcc("-shared", "-fPIC", "-Wl,-soname,libcudart.so."+v, "-o", filepath.Join(stub, "libcudart.so"), src("stubcudart.c")); libs.err != nil {
			return
		}
	}
	for _, c := range [][]string{
		{"-o", "cudart13.so", src("caching.c"), "-Lstub13", "-lcudart"},
		{"-o", "cudart12.so", src("caching.c"), "-Lstub12", "-lcudart"},
		{"-o", "bare.so", src("caching.c")},
		{"-o", "null.so", src("null.c")},
		// transitive.so needs libhelper.so, which needs libcudart.so.11.0,
		// all found by their RUNPATH.
		{"-o", "libcudart.so.11.0", src("stubcudart.c"), "-Wl,-soname,libcudart.so.11.0"},
		{"-o", "libhelper.so", src("null.c"), "-Wl,--no-as-needed", "-L.", "-l:libcudart.so.11.0", "-Wl,-rpath,$ORIGIN"},
		{"-o", "transitive.so", src("caching.c"), "-Wl,--no-as-needed", "-L.", "-lhelper", "-Wl,-rpath,$ORIGIN"},
	} {
		if libs.err = gcc(append([]string{"-shared", "-fPIC", "-O2"}, c...)...); libs.err != nil {
			return
		}
	}
}

func gcc(args ...string) error {
	cmd := exec.Command("gcc", args...)
	cmd.Dir = libs.dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return errors.New("gcc " + strings.Join(args, " ") + ": " + err.Error() + ": " + string(out))
	}
	return nil
}

func parse(t testing.TB, text string) (trace.Header, []trace.Event) {
	t.Helper()
	h, evs, err := trace.ParseText(t.Name(), strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	return h, evs
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

// lastStats returns the last "# stats" line of the library's log.
func lastStats(t *testing.T, log string) string {
	t.Helper()
	f, err := os.Open(log)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var last string
	for s := bufio.NewScanner(f); s.Scan(); {
		if strings.HasPrefix(s.Text(), "# stats ") {
			last = strings.TrimPrefix(s.Text(), "# stats ")
		}
	}
	return last
}

// worked is a trace worked out by hand for testdata/caching.c: requests
// rounded to 512 B; at most 1 MiB from 2 MiB segments, larger from their
// own rounded up to 2 MiB; best fit within pool and stream.
const worked = `
header source=text
malloc id=1 size=1000             # 1024 B: small segment S1 (2 MiB) at devBase, cudaMalloc 1
malloc id=2 size=3MiB             # large segment L1 (4 MiB) at devBase+2MiB, cudaMalloc 2
malloc id=3 size=1MiB             # small: S1's free tail, at devBase+1024
free id=2                         # L1 wholly free, cached
malloc id=4 size=2MiB             # L1 split: devBase+2MiB, 2 MiB free left at devBase+4MiB
malloc id=5 size=2MiB             # that rest, an exact fit
malloc id=6 size=512KiB stream=1  # S1's free blocks are stream 0's: S2 at devBase+6MiB, cudaMalloc 3; reserved 8 MiB
free id=1                         # S1: [1 KiB free][1 MiB][rest free]
free id=3                         # S1 coalesces: all free
malloc id=7 size=700KiB           # S1 whole is the best fit: devBase
`

// TestWorkedBlocks replays worked against each build of the caching
// allocator and checks every block and the device's and the library's
// figures.
func TestWorkedBlocks(t *testing.T) {
	want := []policies.Block{
		{Addr: devBase, Size: 1000}, {Addr: devBase + 2*mib, Size: 3 * mib}, {Addr: devBase + 1024, Size: mib},
		{Addr: devBase + 2*mib, Size: 2 * mib}, {Addr: devBase + 4*mib, Size: 2 * mib},
		{Addr: devBase + 6*mib, Size: 512 << 10}, {Addr: devBase, Size: 700 << 10},
	}
	for _, name := range []string{"cudart13", "cudart12", "bare"} {
		t.Run(name, func(t *testing.T) {
			log := filepath.Join(t.TempDir(), "log")
			t.Setenv("CACHING_LOG", log)
			dev := sim.NewDevice(0)
			p, err := sopolicy.New(lib(t, name), dev)
			if err != nil {
				t.Fatal(err)
			}
			got := drive(t, p, worked)
			if err := p.Close(); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("blocks:\n got %#v\nwant %#v", got, want)
			}
			if dev.PeakReserved() != 8*mib || dev.Allocs() != 3 || dev.Frees() != 0 {
				t.Errorf("device: peak reserved %d, %d allocs, %d frees; want %d, 3, 0", dev.PeakReserved(), dev.Allocs(), dev.Frees(), 8*mib)
			}
			if s, w := lastStats(t, log), "mallocs=3 frees=0 refused=0 reserved=8388608 peak=8388608"; s != w {
				t.Errorf("the library's figures: %q, want %q", s, w)
			}
		})
	}
}

// capped is a trace for a device of 8 MiB, worked out by hand for
// testdata/caching.c: a refusal the library answers with NULL (an OOM), a
// refusal that its release of a wholly free segment cures.
const capped = `
header source=text
malloc id=1 size=3MiB     # L1 (4 MiB) at devBase; reserved 4 MiB
malloc id=2 size=5MiB     # 6 MiB: 4+6 > 8 refused, nothing wholly free to give back, refused again: NULL, OOM
free id=1                 # L1 wholly free, cached
malloc id=3 size=5MiB     # L1 too small; 6 MiB refused; L1 given back (device free 1); L2 of 6 MiB at devBase+4MiB
malloc id=4 size=1000     # S1 of 2 MiB at devBase+10MiB; reserved 8 MiB, the peak
malloc id=5 size=1049000  # large: 1049088 B in a 2 MiB segment: refused, nothing wholly free: OOM
free id=3
free id=4
`

// TestCapacityThroughRun replays capped through sim.Run with a capacity:
// the device's refusals reach the library as cudaErrorMemoryAllocation,
// and its NULLs are the replay's OOMs.
func TestCapacityThroughRun(t *testing.T) {
	log := filepath.Join(t.TempDir(), "log")
	t.Setenv("CACHING_LOG", log)
	path := lib(t, "cudart13")
	h, evs := parse(t, capped)
	rs, err := sim.Run(trace.NewSliceSource(h, evs), sim.Config{Policy: "so:" + path, Capacity: 8 * mib})
	if err != nil {
		t.Fatal(err)
	}
	type figures struct {
		Mallocs, OOMs, FirstOOMEvent, DeviceAllocs, DeviceFrees int64
		PeakReserved, PeakAllocated                             uint64
	}
	r := rs[0]
	got := figures{r.Mallocs, r.OOMs, r.FirstOOMEvent, r.DeviceAllocs, r.DeviceFrees, r.PeakReserved, r.PeakAllocated}
	want := figures{Mallocs: 5, OOMs: 2, FirstOOMEvent: 1, DeviceAllocs: 3, DeviceFrees: 1, PeakReserved: 8 * mib, PeakAllocated: 5*mib + 1000}
	if got != want {
		t.Errorf("\n got %+v\nwant %+v", got, want)
	}
	// The library's own count: 5 refusals (2 for id 2, 1 for id 3, 2 for
	// id 5), 3 cudaMallocs, 1 cudaFree.
	if s, w := lastStats(t, log), "mallocs=3 frees=1 refused=5 reserved=8388608 peak=8388608"; s != w {
		t.Errorf("the library's figures: %q, want %q", s, w)
	}
}

// TestTwoAtOnce replays worked against two so: policies of the same
// library and against another build in one sim.Run, and against two
// policies driven from two goroutines: each library keeps its own state
// and each device its own figures.
func TestTwoAtOnce(t *testing.T) {
	h, evs := parse(t, worked)
	a, b := lib(t, "cudart13"), lib(t, "bare")
	rs, err := sim.Run(trace.NewSliceSource(h, evs),
		sim.Config{Policy: "so:" + a}, sim.Config{Policy: "so:" + a + ":my_malloc:my_free"}, sim.Config{Policy: "so:" + b})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		if r.PeakReserved != 8*mib || r.DeviceAllocs != 3 || r.Mallocs != 7 || r.OOMs != 0 {
			t.Errorf("%s: peak reserved %d, %d device allocs, %d mallocs, %d OOMs; want 8 MiB, 3, 7, 0", r.Policy, r.PeakReserved, r.DeviceAllocs, r.Mallocs, r.OOMs)
		}
	}
	var wg sync.WaitGroup
	devs := []*sim.Device{sim.NewDevice(0), sim.NewDevice(0)}
	for _, dev := range devs {
		wg.Go(func() {
			p, err := sopolicy.New(a, dev)
			if err != nil {
				t.Error(err)
				return
			}
			defer p.Close()
			for range 50 {
				var addrs []uint64
				for _, ev := range evs {
					if ev.Op == trace.OpMalloc {
						b, err := p.Malloc(ev.Size, ev.Stream)
						if err != nil {
							t.Error(err)
							return
						}
						addrs = append(addrs, b.Addr)
					}
				}
				for _, addr := range addrs {
					if err := p.Free(addr, 0); err != nil {
						t.Error(err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	if devs[0].Allocs() != devs[1].Allocs() || devs[0].PeakReserved() != devs[1].PeakReserved() {
		t.Errorf("two devices: %d and %d allocs, peaks %d and %d", devs[0].Allocs(), devs[1].Allocs(), devs[0].PeakReserved(), devs[1].PeakReserved())
	}
}

// TestBadLibraries checks the one-line errors of libraries that cannot
// be loaded or misbehave.
func TestBadLibraries(t *testing.T) {
	notELF := filepath.Join(t.TempDir(), "text.so")
	if err := os.WriteFile(notELF, []byte("not a library\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, arg string
		kind      error
		msg       string // a substring of the error
	}{
		{"missing file", "testdata/nosuch.so", sopolicy.ErrLoad, "so policy testdata/nosuch.so: open testdata/nosuch.so: no such file or directory"},
		{"not ELF", notELF, sopolicy.ErrLoad, ": not an ELF shared library"},
		{"missing alloc", lib(t, "cudart13") + ":nosuch:my_free", sopolicy.ErrLoad, ": no function nosuch in it"},
		// free is libc's, found through the library's dependencies: not
		// the library's own.
		{"libc's free", lib(t, "cudart13") + ":my_malloc:free", sopolicy.ErrLoad, ": no function free in it"},
		{"real runtime", lib(t, "transitive"), sopolicy.ErrLoad, "libcudart.so.11.0, is loaded in this process"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := sopolicy.New(tc.arg, sim.NewDevice(0))
			if !errors.Is(err, tc.kind) || !strings.Contains(err.Error(), tc.msg) || strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q (%v); want one line of kind %v holding %q", err, err, tc.kind, tc.msg)
			}
			if tc.name == "missing file" || tc.name == "not ELF" {
				if _, err := sopolicy.Info(tc.arg); !errors.Is(err, tc.kind) {
					t.Errorf("Info: %v; want an error of kind %v", err, tc.kind)
				}
			}
		})
	}
	// The refused library unloaded what it loaded: a good one loads.
	p, err := sopolicy.New(lib(t, "cudart13"), sim.NewDevice(0))
	if err != nil {
		t.Fatalf("after the refusals: %v", err)
	}
	p.Close()

	for _, tc := range []struct{ name, arg, msg string }{
		{"NULL", lib(t, "null"), "my_malloc returned NULL for a malloc of 4096 bytes on stream 0, and the device refused none of its cudaMalloc calls"},
		{"bogus pointer", lib(t, "null") + ":bogus_malloc:my_free", "bogus_malloc returned 0x1000 for a malloc of 4096 bytes, not inside a segment it got from cudaMalloc"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := sopolicy.New(tc.arg, sim.NewDevice(0))
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			_, err = p.Malloc(4096, 0)
			if !errors.Is(err, sopolicy.ErrLibrary) || errors.Is(err, policies.ErrOutOfMemory) || !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("error %v; want an ErrLibrary holding %q", err, tc.msg)
			}
			if _, err2 := p.Malloc(4096, 0); err2 != err {
				t.Errorf("the next malloc: %v; want the same failure", err2)
			}
		})
	}
}

// TestParseArg checks the forms of so:ARG.
func TestParseArg(t *testing.T) {
	for _, tc := range []struct {
		arg  string
		want sopolicy.Spec
	}{
		{"lib.so", sopolicy.Spec{Path: "lib.so", Alloc: "my_malloc", Free: "my_free"}},
		{"/a/lib.so:alloc:free_fn", sopolicy.Spec{Path: "/a/lib.so", Alloc: "alloc", Free: "free_fn"}},
		{"/a:b/lib.so:alloc:free", sopolicy.Spec{Path: "/a:b/lib.so", Alloc: "alloc", Free: "free"}},
		{"/a:b/lib.so", sopolicy.Spec{Path: "/a:b/lib.so", Alloc: "my_malloc", Free: "my_free"}},
		{"lib.so:x:1y", sopolicy.Spec{Path: "lib.so:x:1y", Alloc: "my_malloc", Free: "my_free"}},
	} {
		got, err := sopolicy.ParseArg(tc.arg)
		if err != nil || got != tc.want {
			t.Errorf("ParseArg(%q) = %+v, %v; want %+v", tc.arg, got, err, tc.want)
		}
	}
	if _, err := sopolicy.ParseArg(":a:b"); err == nil {
		t.Error("ParseArg(\":a:b\"): no error")
	}
}

// TestConformance holds so: of the caching allocator to the conformance
// kit (policytest): random traces under the invariant checker.
func TestConformance(t *testing.T) {
	policytest.Run(t, "so:"+lib(t, "cudart13"), &policytest.Options{Rounds: 1})
}

// TestH200Job replays the requests PyTorch made of caching.c inside a real
// training job on an H200 (testdata/h200: the library's own log of them)
// through so: on caching.c built here: the device calls and the peak are
// those the library made inside PyTorch, as it measured them
// (mlp_stats.json: 23 cudaMalloc, 0 cudaFree, 373293056 bytes at the
// peak). (The addresses differ: the simulated device hands out its own.)
func TestH200Job(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("testdata", "h200", "mlp_stats.json"))
	if err != nil {
		t.Fatal(err)
	}
	var real struct {
		Mallocs int64  `json:"cudaMalloc"`
		Frees   int64  `json:"cudaFree"`
		Peak    uint64 `json:"peak_reserved"`
	}
	if err := json.Unmarshal(raw, &real); err != nil {
		t.Fatal(err)
	}
	if real.Mallocs == 0 || real.Peak == 0 {
		t.Fatalf("mlp_stats.json holds no figures: %s", raw)
	}
	text, err := os.ReadFile(filepath.Join("testdata", "h200", "mlp_requests.trace"))
	if err != nil {
		t.Fatal(err)
	}
	h, evs := parse(t, string(text))
	rs, err := sim.Run(trace.NewSliceSource(h, evs), sim.Config{Policy: "so:" + lib(t, "bare")})
	if err != nil {
		t.Fatal(err)
	}
	r := rs[0]
	if r.DeviceAllocs != real.Mallocs || r.DeviceFrees != real.Frees || r.PeakReserved != real.Peak || r.Mallocs != 138 || r.OOMs != 0 {
		t.Errorf("so: %d cudaMalloc, %d cudaFree, peak %d, %d mallocs, %d OOMs; inside PyTorch %d, %d, %d, 138, 0",
			r.DeviceAllocs, r.DeviceFrees, r.PeakReserved, r.Mallocs, r.OOMs, real.Mallocs, real.Frees, real.Peak)
	}
}

package sim_test

import (
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpualloc/allocsim/trace/pytorch"
)

// bigSnapshot returns the large synthetic snapshot the import benchmark
// reads: $ALLOCSIM_BIG_SNAPSHOT, or the file trace/pytorch/testdata/bigsnap.py
// writes by default ($TMPDIR/allocsim-big-snapshot.pickle); "" if neither is
// there.
func bigSnapshot() string {
	p := os.Getenv("ALLOCSIM_BIG_SNAPSHOT")
	if p == "" {
		p = filepath.Join(os.TempDir(), "allocsim-big-snapshot.pickle")
	}
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
}

// bigChildEnv names the snapshot a child process of the test binary
// imports (TestBigImportChild), so that its peak RSS is the import's.
const bigChildEnv = "ALLOCSIM_BIG_IMPORT_CHILD"

// TestBigImportChild imports the snapshot $ALLOCSIM_BIG_IMPORT_CHILD names
// and reads every event, for the benchmarks' measure of the time and peak
// RSS of a process that does only that (compareImport); without it, it
// does nothing.
func TestBigImportChild(t *testing.T) {
	p := os.Getenv(bigChildEnv)
	if p == "" {
		t.Skip("the child of BenchmarkImportBig and BenchmarkImport")
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	src, err := pytorch.Import(f, p, pytorch.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := src.Next(); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
	}
	printHWM()
}

// hwmScript is the Python that prints the VmHWM line of the process's
// /proc/self/status, where there is one, as printHWM does.
const hwmScript = "\ntry:\n    print(next(l for l in open('/proc/self/status') if l.startswith('VmHWM:')), end='')\nexcept OSError:\n    pass"

// printHWM prints the VmHWM line of /proc/self/status (the peak resident
// memory of this process's own image), where there is one, for
// runMeasured.
func printHWM() {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return
	}
	for _, l := range strings.Split(string(status), "\n") {
		if strings.HasPrefix(l, "VmHWM:") {
			fmt.Println(l)
		}
	}
}

var bigOnce sync.Once

// BenchmarkImportBig measures importing a large synthetic snapshot shaped
// as PyTorch writes one recorded with stacks (frame dicts and frames
// lists shared between entries through the pickle memo; see
// trace/pytorch/testdata/bigsnap.py, which writes one of about 1 GiB), pickle
// to events, and once, each in a process of its own, the same import and
// CPython's pickle.load of the file (what torch.cuda._memory_viz does),
// with their peak resident memory. It skips when there is no such file.
// It prints
//
//	BENCH trace=bigsnap stage=file bytes=B events=N
//	BENCH trace=bigsnap stage=import seconds=S
//
// where import is the benchmark's own rounds, and then compareImport's
// lines (input=pickle): the median of 5 rounds, side by side, of the child
// processes' wall time, CPU time and peak RSS (ru_maxrss), and their
// ratios. A round of CPython takes about a minute and 4 GB at 1 GiB: run
// it alone.
func BenchmarkImportBig(b *testing.B) {
	p := bigSnapshot()
	if p == "" {
		b.Skip("no big snapshot: run python3 trace/pytorch/testdata/bigsnap.py, or set ALLOCSIM_BIG_SNAPSHOT")
	}
	st, err := os.Stat(p)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(st.Size())
	var n int
	for i := 0; i < b.N; i++ {
		f, err := os.Open(p)
		if err != nil {
			b.Fatal(err)
		}
		src, err := pytorch.Import(f, p, pytorch.Options{})
		if err != nil {
			b.Fatal(err)
		}
		n = drain(b, src)
		f.Close()
	}
	sec := b.Elapsed().Seconds() / float64(b.N)
	benchReport("bigsnap 0file", fmt.Sprintf("BENCH trace=bigsnap stage=file bytes=%d events=%d", st.Size(), n))
	benchReport("bigsnap 1import", fmt.Sprintf("BENCH trace=bigsnap stage=import seconds=%.4f", sec))
	b.ReportMetric(float64(n)/sec, "events/s")
	bigOnce.Do(func() { compareImport(b, "bigsnap", p, false) })
}

// measured is what runMeasured measures of a process.
type measured struct {
	wall, cpu float64 // seconds: wall-clock, user+system
	rss       int64   // peak resident bytes
}

// runMeasured runs cmd and returns its wall time and CPU time in seconds
// and its peak resident memory in bytes: the VmHWM line the process
// prints (printHWM, hwmScript), else its rusage's. On Linux the rusage's
// is not the child's own: a child forked from this process, which holds
// the memory of the benchmarks before (gigabytes after
// BenchmarkImportBig's own import), is charged this process's resident
// memory up to its exec.
func runMeasured(cmd *exec.Cmd) (measured, error) {
	start := time.Now()
	out, err := cmd.CombinedOutput()
	m := measured{wall: time.Since(start).Seconds()}
	if err != nil {
		return m, fmt.Errorf("%v\n%s", err, out)
	}
	m.cpu = (cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()).Seconds()
	for _, l := range strings.Split(string(out), "\n") {
		if kb, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(kb), "kB")), 10, 64)
			if err != nil {
				return m, fmt.Errorf("the child's peak RSS %q: %v", l, err)
			}
			m.rss = n * 1024
			return m, nil
		}
	}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		m.rss = ru.Maxrss * 1024 // kilobytes on Linux
	}
	return m, nil
}

// importRounds is how many rounds compareImport runs
// ($ALLOCSIM_IMPORT_ROUNDS, default 5).
func importRounds() int {
	if n, err := strconv.Atoi(os.Getenv("ALLOCSIM_IMPORT_ROUNDS")); err == nil && n > 0 {
		return n
	}
	return 5
}

// compareImport times, in processes of their own and side by side, our
// import of the snapshot at p (TestBigImportChild: Import and every event
// read, frames included) and CPython's pickle.load of the same file
// (through gzip.open when gz, so that both gunzip it), in importRounds()
// rounds of one each, and prints the medians:
//
//	BENCH trace=NAME stage=import-process input=IN rounds=R seconds=S cpu_seconds=C peak_rss_bytes=B
//	BENCH trace=NAME stage=pickle.load impl=cpython input=IN rounds=R seconds=S cpu_seconds=C peak_rss_bytes=B
//	BENCH trace=NAME stage=import-vs-cpython input=IN rounds=R ratio=X ratio_min=X ratio_max=X cpu_ratio=X rss_ratio=X
//
// where IN is gz or pickle, ratio is the median of ours over CPython's
// (wall-clock seconds), ratio_min and ratio_max those of one round's pair,
// cpu_ratio the same of user+system seconds, and rss_ratio that of the
// peak RSS. Without python3 only the first line is printed.
func compareImport(b *testing.B, name, p string, gz bool) {
	self, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	in := "pickle"
	script := "import pickle, sys\nwith open(sys.argv[1], 'rb') as f: pickle.load(f)" + hwmScript
	if gz {
		in = "gz"
		script = "import gzip, pickle, sys\nwith gzip.open(sys.argv[1], 'rb') as f: pickle.load(f)" + hwmScript
	}
	py, _ := exec.LookPath("python3")
	n := importRounds()
	var ours, theirs []measured
	for i := 0; i < n; i++ {
		child := exec.Command(self, "-test.run=^TestBigImportChild$", "-test.count=1")
		child.Env = append(os.Environ(), bigChildEnv+"="+p)
		m, err := runMeasured(child)
		if err != nil {
			b.Fatalf("the import's process: %v", err)
		}
		ours = append(ours, m)
		if py == "" {
			continue
		}
		m, err = runMeasured(exec.Command(py, "-c", script, p))
		if err != nil {
			b.Fatalf("python3 pickle.load: %v", err)
		}
		theirs = append(theirs, m)
	}
	wall := func(m measured) float64 { return m.wall }
	cpu := func(m measured) float64 { return m.cpu }
	rss := func(m measured) float64 { return float64(m.rss) }
	key := name + " 2" + in
	benchReport(key+" 1import-process", fmt.Sprintf("BENCH trace=%s stage=import-process input=%s rounds=%d seconds=%.2f cpu_seconds=%.2f peak_rss_bytes=%.0f",
		name, in, n, medianOf(ours, wall), medianOf(ours, cpu), medianOf(ours, rss)))
	if py == "" {
		return
	}
	benchReport(key+" 2pickle.load", fmt.Sprintf("BENCH trace=%s stage=pickle.load impl=cpython input=%s rounds=%d seconds=%.2f cpu_seconds=%.2f peak_rss_bytes=%.0f",
		name, in, n, medianOf(theirs, wall), medianOf(theirs, cpu), medianOf(theirs, rss)))
	lo, hi := math.Inf(1), math.Inf(-1)
	for i := range ours {
		r := ours[i].wall / theirs[i].wall
		lo, hi = min(lo, r), max(hi, r)
	}
	benchReport(key+" 3ratio", fmt.Sprintf("BENCH trace=%s stage=import-vs-cpython input=%s rounds=%d ratio=%.3f ratio_min=%.3f ratio_max=%.3f cpu_ratio=%.3f rss_ratio=%.4f",
		name, in, n, medianOf(ours, wall)/medianOf(theirs, wall), lo, hi, medianOf(ours, cpu)/medianOf(theirs, cpu), medianOf(ours, rss)/medianOf(theirs, rss)))
}

// medianOf returns the median of f over ms.
func medianOf(ms []measured, f func(measured) float64) float64 {
	xs := make([]float64, len(ms))
	for i, m := range ms {
		xs[i] = f(m)
	}
	return median(xs)
}

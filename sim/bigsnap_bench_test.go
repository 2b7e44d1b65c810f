package sim_test

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
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
// and reads every event, for BenchmarkImportBig's measure of the peak RSS
// of a process that does only that; without it, it does nothing.
func TestBigImportChild(t *testing.T) {
	p := os.Getenv(bigChildEnv)
	if p == "" {
		t.Skip("the child of BenchmarkImportBig")
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
			return
		} else if err != nil {
			t.Fatal(err)
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
//	BENCH trace=bigsnap stage=import-process seconds=S peak_rss_bytes=R
//	BENCH trace=bigsnap stage=pickle.load impl=cpython seconds=S peak_rss_bytes=R
//
// where import is the benchmark's own rounds, and the last two the child
// processes' wall time and peak RSS (ru_maxrss); pickle.load's line is left
// out without a python3.
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
	bigOnce.Do(func() {
		self, err := os.Executable()
		if err != nil {
			b.Fatal(err)
		}
		child := exec.Command(self, "-test.run=^TestBigImportChild$", "-test.count=1")
		child.Env = append(os.Environ(), bigChildEnv+"="+p)
		sec, rss, err := runMeasured(child)
		if err != nil {
			b.Fatalf("the import's process: %v", err)
		}
		benchReport("bigsnap 2import-process", fmt.Sprintf("BENCH trace=bigsnap stage=import-process seconds=%.2f peak_rss_bytes=%d", sec, rss))
		py, err := exec.LookPath("python3")
		if err != nil {
			return
		}
		sec, rss, err = runMeasured(exec.Command(py, "-c", "import pickle, sys\nwith open(sys.argv[1], 'rb') as f: pickle.load(f)", p))
		if err != nil {
			b.Fatalf("python3 pickle.load: %v", err)
		}
		benchReport("bigsnap 3pickle.load", fmt.Sprintf("BENCH trace=bigsnap stage=pickle.load impl=cpython seconds=%.2f peak_rss_bytes=%d", sec, rss))
	})
}

// runMeasured runs cmd and returns its wall time in seconds and its peak
// resident memory in bytes.
func runMeasured(cmd *exec.Cmd) (float64, int64, error) {
	start := time.Now()
	out, err := cmd.CombinedOutput()
	sec := time.Since(start).Seconds()
	if err != nil {
		return 0, 0, fmt.Errorf("%v\n%s", err, out)
	}
	ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	if !ok {
		return sec, 0, nil
	}
	return sec, ru.Maxrss * 1024, nil // kilobytes on Linux
}

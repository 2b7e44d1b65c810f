package sim_test

import (
	"bufio"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/sim/sweep"
	"github.com/gpualloc/allocsim/trace/tracefile"
)

// apCall is one allocation call of a pool: a malloc's requested bytes and
// the offset of its address from the pool's first, and the pool's reserved
// bytes after the call.
type apCall struct {
	malloc   bool
	size     uint64
	offset   uint64
	reserved uint64
	stream   uint64 // simulated calls only
}

// readPoolCalls reads the mallocs and frees of a `replay gpu --policy
// cuda-async --calls` log (call,size,ptr,ns,pool_reserved; gzipped if its
// name ends in .gz), with addresses as offsets from the first malloc's.
func readPoolCalls(path string) ([]apCall, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var r io.Reader = f
	if strings.HasSuffix(path, ".gz") {
		z, err := gzip.NewReader(f)
		if err != nil {
			return nil, err
		}
		r = z
	}
	sc := bufio.NewScanner(r)
	var calls []apCall
	var base uint64
	for line := 0; sc.Scan(); line++ {
		if line == 0 {
			continue
		}
		f := strings.Split(sc.Text(), ",")
		if len(f) != 5 {
			return nil, fmt.Errorf("%s:%d: %d fields", path, line+1, len(f))
		}
		var c apCall
		switch f[0] {
		case "cudaMallocAsync", "cudaMallocFromPoolAsync":
			c.malloc = true
		case "cudaFreeAsync":
		default:
			continue
		}
		size, err1 := strconv.ParseUint(f[1], 10, 64)
		ptr, err2 := strconv.ParseUint(strings.TrimPrefix(f[2], "0x"), 16, 64)
		res, err3 := strconv.ParseUint(f[4], 10, 64)
		if err1 != nil || err2 != nil || err3 != nil {
			return nil, fmt.Errorf("%s:%d: bad line %q", path, line+1, sc.Text())
		}
		if base == 0 {
			base = ptr
		}
		c.size, c.offset, c.reserved = size, ptr-base, res
		calls = append(calls, c)
	}
	return calls, sc.Err()
}

// poolLog wraps a policy and logs its mallocs and frees as apCalls, with
// the device's reserved bytes after each.
type poolLog struct {
	policies.Policy
	dev   policies.Capacitor
	base  uint64
	calls []apCall
}

func (l *poolLog) add(malloc bool, size, addr, stream uint64) {
	if l.base == 0 {
		l.base = addr
	}
	l.calls = append(l.calls, apCall{malloc, size, addr - l.base, l.dev.Reserved(), stream})
}

func (l *poolLog) Malloc(size, stream uint64) (policies.Block, error) {
	b, err := l.Policy.Malloc(size, stream)
	if err == nil && size > 0 {
		l.add(true, size, b.Addr, stream)
	}
	return b, err
}

func (l *poolLog) Free(addr, stream uint64) error {
	err := l.Policy.Free(addr, stream)
	if err == nil && addr != 0 {
		l.add(false, 0, addr, stream)
	}
	return err
}

func (l *poolLog) StreamSync(s uint64)          { l.Policy.(policies.Syncer).StreamSync(s) }
func (l *poolLog) DeviceSync()                  { l.Policy.(policies.Syncer).DeviceSync() }
func (l *poolLog) EventRecord(ev, s uint64)     { l.Policy.(policies.Syncer).EventRecord(ev, s) }
func (l *poolLog) StreamWaitEvent(s, ev uint64) { l.Policy.(policies.Syncer).StreamWaitEvent(s, ev) }
func (l *poolLog) EventSync(ev uint64)          { l.Policy.(policies.Syncer).EventSync(ev) }
func (l *poolLog) EmptyCache() error            { return l.Policy.(policies.Releaser).EmptyCache() }
func (l *poolLog) FreeSpace() (uint64, uint64)  { return l.Policy.(policies.FreeSpacer).FreeSpace() }

// poolCompare replays snapshot against async-pool and compares its calls
// with the real pool's log.
func poolCompare(t *testing.T, snap, log string, s policies.Settings) (real, got []apCall) {
	t.Helper()
	if log != "" {
		var err error
		if real, err = readPoolCalls(log); err != nil {
			t.Fatal(err)
		}
	}
	var pl *poolLog
	cfg := sim.Config{Trace: snap, Policy: "async-pool", Settings: s,
		NewPolicy: func(dev policies.Device, s policies.Settings) (policies.Policy, error) {
			p, err := policies.NewAsyncPool(dev, s)
			if err != nil {
				return nil, err
			}
			pl = &poolLog{Policy: p, dev: dev.(policies.Capacitor)}
			return pl, nil
		}}
	if _, err := sweep.RunFile(snap, tracefile.Options{}, cfg); err != nil {
		t.Fatal(err)
	}
	return real, pl.calls
}

// poolH200 is the CUDA pool measured on the H200 (CUDA 13.0, driver
// 580.159; 2026-12-01): `replay gpu --policy cuda-async --calls` on each
// snapshot, the pool's reserved high (cudaMemPoolAttrReservedMemHigh,
// bytes). The call logs of the small ones are in testdata/h200_pool
// (NAME.csv.gz, the pool's reserved bytes after every call).
var poolH200 = []struct {
	name         string // snapshot under the collection
	reservedHigh uint64
	// calls is the number of calls whose placement and reserved bytes
	// must match the log's, from the first; -1 for all.
	calls int
}{
	{name: "pytorch/train_gpt", reservedHigh: 8824815616, calls: 582},
	{name: "pytorch/kv_decode", reservedHigh: 671088640},
	{name: "pytorch/infer_dynbatch", reservedHigh: 3590324224},
	{name: "pytorch/infer_dynbatch_expandable", reservedHigh: 3590324224},
	{name: "pytorch/multistream", reservedHigh: 838860800, calls: 770},
	{name: "pytorch/hf_llama_train", reservedHigh: 4362076160},
	{name: "pytorch/hf_generate", reservedHigh: 704643072},
	{name: "pytorch_cases/token_lengths", reservedHigh: 1509949440, calls: -1},
	{name: "pytorch_cases/conv_forward", reservedHigh: 3959422976, calls: -1},
	{name: "pytorch_cases/growing_batch", reservedHigh: 301989888, calls: -1},
	{name: "pytorch_cases/split_frag_oom", reservedHigh: 4596957184, calls: -1},
	{name: "pytorch/churn", reservedHigh: 1711276032, calls: 136},
	{name: "pytorch/churn_mixed", reservedHigh: 1711276032},
	{name: "pytorch/mlp", reservedHigh: 738197504, calls: 446},
}

// TestAsyncPoolH200 replays the real snapshots against async-pool and
// compares the peak reserved bytes with the real pool's reserved high, and
// call by call with the logs kept.
func TestAsyncPoolH200(t *testing.T) {
	const chunk = 32 << 20
	for _, tc := range poolH200 {
		t.Run(filepath.Base(tc.name), func(t *testing.T) {
			snap, _ := ptFind(tc.name)
			if snap == "" {
				t.Skipf("%s.pickle.gz not found (set ALLOCSIM_TRACES to the trace collection)", tc.name)
			}
			if fi, err := os.Stat(snap); err == nil && fi.Size() > 1<<20 && testing.Short() {
				t.Skip("a large snapshot in -short mode")
			}
			log := filepath.Join("testdata", "h200_pool", filepath.Base(tc.name)+".csv.gz")
			if _, err := os.Stat(log); err != nil {
				log = ""
			}
			real, got := poolCompare(t, snap, log, nil)
			var high uint64
			for _, g := range got {
				high = max(high, g.reserved)
			}
			diff := int64(high) - int64(tc.reservedHigh)
			t.Logf("reserved high: simulated %d, real %d (%+d MiB)", high, tc.reservedHigh, diff>>20)
			if diff > chunk || diff < -chunk {
				t.Errorf("simulated reserved high %d, real %d: more than one chunk apart", high, tc.reservedHigh)
			}
			if log == "" {
				return
			}
			n := tc.calls
			if n < 0 {
				n = len(got)
			}
			if len(real) < len(got) {
				t.Fatalf("the log has %d calls, the replay made %d", len(real), len(got))
			}
			for i, g := range got[:n] {
				r := real[i]
				if r.malloc != g.malloc || (r.malloc && r.size != g.size) {
					t.Fatalf("call %d: real %+v, simulated %+v: not the same call", i, r, g)
				}
				if r.offset != g.offset || r.reserved != g.reserved {
					t.Fatalf("call %d: real offset %d, reserved %d; simulated %d, %d", i, r.offset, r.reserved, g.offset, g.reserved)
				}
			}
			if n < len(got) && real[n].offset == got[n].offset {
				t.Logf("call %d matches now: raise calls", n)
			}
		})
	}
}

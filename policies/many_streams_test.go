package policies_test

import (
	"runtime"
	"testing"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
)

// TestPyTorchManyStreamsMemory replays a malloc and free of 4 KiB on each
// of 4000 streams and bounds the bytes allocated per stream: each stream's
// cached segment costs its block and its stream's set of free blocks, a
// few hundred bytes (issue 36: a set took 8 KiB, 100000 streams 959 MB,
// and FreeSpace walked every set at each event).
func TestPyTorchManyStreamsMemory(t *testing.T) {
	const streams = 4000
	p, err := policies.NewPyTorch(sim.NewDevice(0), nil)
	if err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	var largest uint64
	for s := uint64(1); s <= streams; s++ {
		b, err := p.Malloc(4096, s)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Free(b.Addr, s); err != nil {
			t.Fatal(err)
		}
		_, largest = p.FreeSpace()
	}
	runtime.ReadMemStats(&after)
	if want := uint64(2 << 20); largest != want {
		t.Errorf("largest free block %d bytes, want %d", largest, want)
	}
	if total, _ := p.FreeSpace(); total != streams*(2<<20) {
		t.Errorf("free bytes %d, want %d", total, streams*(2<<20))
	}
	perStream := (after.TotalAlloc - before.TotalAlloc) / streams
	t.Logf("%d bytes allocated per stream", perStream)
	if perStream > 2048 {
		t.Errorf("%d bytes allocated per stream, want at most 2048", perStream)
	}
}

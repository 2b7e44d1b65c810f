package policies_test

import (
	"errors"
	"fmt"
	"math/rand"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/trace"
)

// This file holds a minimal driver for the tests of the cuda, first-fit,
// best-fit, buddy and slab policies: it replays a text-form trace against a
// policy on a simulated device and records what happened, so that each test
// compares exact block addresses and device figures with values worked out
// by hand.

// Sizes and addresses used in the expectations.
const (
	sKiB = 1 << 10
	sMiB = 1 << 20
	// devBase is the address of the simulated device's first segment; later
	// segments follow at 2 MiB-aligned, ascending, never reused addresses.
	devBase = 0x7f0000000000
)

// simpleCase is one hand-worked replay: a trace and what it must give.
type simpleCase struct {
	name     string
	policy   string
	settings policies.Settings
	capacity uint64 // device capacity in bytes, 0 for unlimited
	trace    string // text form

	blocks  []policies.Block // the blocks of the successful mallocs, in order
	ooms    []int            // indices of the events whose malloc was an OOM
	peak    uint64           // device.PeakReserved()
	allocs  int64            // device allocations
	frees   int64            // device frees
	retries int64            // Counter.Retries(), if the policy counts
	// free space at the end (FreeSpacer), checked when checkFree is set
	checkFree              bool
	freeTotal, freeLargest uint64
}

// simpleRun is the outcome of driveSimple.
type simpleRun struct {
	dev    *sim.Device
	policy policies.Policy
	blocks []policies.Block
	ooms   []int
}

// driveSimple replays the text-form trace text against the policy named
// name on a simulated device of capacity bytes. A malloc that fails with
// ErrOutOfMemory is recorded; any other error fails the test.
func driveSimple(t testing.TB, name string, s policies.Settings, capacity uint64, text string) simpleRun {
	t.Helper()
	_, evs, err := trace.ParseText(name, strings.NewReader(text))
	if err != nil {
		t.Fatalf("ParseText: %v", err)
	}
	dev := sim.NewDevice(capacity)
	p, err := policies.New(name, dev, s)
	if err != nil {
		t.Fatalf("New(%q, %v): %v", name, s, err)
	}
	if p.Name() != name {
		t.Errorf("Name() = %q, want %q", p.Name(), name)
	}
	run := simpleRun{dev: dev, policy: p}
	live := map[uint64]policies.Block{} // by trace address
	for i, ev := range evs {
		switch ev.Op {
		case trace.OpMalloc:
			b, err := p.Malloc(ev.Size, ev.Stream)
			if err != nil {
				if !errors.Is(err, policies.ErrOutOfMemory) {
					t.Fatalf("event %d: malloc of %d bytes: %v", i, ev.Size, err)
				}
				run.ooms = append(run.ooms, i)
				continue
			}
			live[ev.Addr] = b
			run.blocks = append(run.blocks, b)
		case trace.OpFree:
			b, ok := live[ev.Addr]
			if !ok {
				continue // its malloc was an OOM
			}
			delete(live, ev.Addr)
			if err := p.Free(b.Addr, ev.Stream); err != nil {
				t.Fatalf("event %d: free of %#x: %v", i, b.Addr, err)
			}
		case trace.OpEmptyCache:
			if r, ok := p.(policies.Releaser); ok {
				if err := r.EmptyCache(); err != nil {
					t.Fatalf("event %d: empty_cache: %v", i, err)
				}
			}
		}
	}
	return run
}

// runSimpleCases replays each case and compares every recorded figure.
func runSimpleCases(t *testing.T, cases []simpleCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			checkSimpleRun(t, driveSimple(t, tc.policy, tc.settings, tc.capacity, tc.trace), tc)
		})
	}
}

// checkSimpleRun compares the figures of a replay with those of its case.
func checkSimpleRun(t *testing.T, r simpleRun, tc simpleCase) {
	t.Helper()
	if !slices.Equal(r.blocks, tc.blocks) {
		t.Errorf("blocks:\n got %s\nwant %s", fmtBlocks(r.blocks), fmtBlocks(tc.blocks))
	}
	if !slices.Equal(r.ooms, tc.ooms) {
		t.Errorf("OOMs at events %v, want %v", r.ooms, tc.ooms)
	}
	if got := r.dev.PeakReserved(); got != tc.peak {
		t.Errorf("peak reserved = %d, want %d", got, tc.peak)
	}
	if got := r.dev.Allocs(); got != tc.allocs {
		t.Errorf("device allocs = %d, want %d", got, tc.allocs)
	}
	if got := r.dev.Frees(); got != tc.frees {
		t.Errorf("device frees = %d, want %d", got, tc.frees)
	}
	var retries int64
	if c, ok := r.policy.(policies.Counter); ok {
		retries = c.Retries()
	}
	if retries != tc.retries {
		t.Errorf("retries = %d, want %d", retries, tc.retries)
	}
	if tc.checkFree {
		total, largest := r.policy.(policies.FreeSpacer).FreeSpace()
		if total != tc.freeTotal || largest != tc.freeLargest {
			t.Errorf("FreeSpace() = %d, %d; want %d, %d", total, largest, tc.freeTotal, tc.freeLargest)
		}
	}
}

func fmtBlocks(bs []policies.Block) string {
	var b strings.Builder
	b.WriteString("[")
	for i, x := range bs {
		if i > 0 {
			b.WriteString(" ")
		}
		if x.Addr >= devBase {
			fmt.Fprintf(&b, "devBase+%#x:%d", x.Addr-devBase, x.Size)
		} else {
			fmt.Fprintf(&b, "%#x:%d", x.Addr, x.Size)
		}
	}
	b.WriteString("]")
	return b.String()
}

// settingCase is a bad setting: the error must name key.
type settingCase struct {
	policy   string
	settings policies.Settings
	key      string
}

func runSettingCases(t *testing.T, cases []settingCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(fmt.Sprint(tc.policy, tc.settings), func(t *testing.T) {
			_, err := policies.New(tc.policy, sim.NewDevice(0), tc.settings)
			if err == nil {
				t.Fatalf("New(%q, %v) succeeded, want an error naming %q", tc.policy, tc.settings, tc.key)
			}
			if !strings.Contains(err.Error(), tc.key) {
				t.Errorf("New(%q, %v) = %q, want it to name %q", tc.policy, tc.settings, err, tc.key)
			}
		})
	}
}

// checkInvariants replays a few thousand random mallocs and frees (and
// the odd empty_cache) against the policy and checks after each that no
// two live blocks overlap, that each lies inside a live device segment,
// and that the free space the policy reports adds up with the reserved
// bytes: reserved == allocated + free (exact) or reserved >= allocated +
// free (for a policy that wastes the tail of a segment).
func checkInvariants(t *testing.T, name string, s policies.Settings, capacity uint64, exact bool) {
	t.Helper()
	dev := trackPages(sim.NewDevice(capacity))
	p, err := policies.New(name, dev, s)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewSource(1))
	var live []policies.Block
	ooms := 0
	for op := range 4000 {
		switch {
		case op%500 == 499:
			if r, ok := p.(policies.Releaser); ok {
				if err := r.EmptyCache(); err != nil {
					t.Fatalf("op %d: EmptyCache: %v", op, err)
				}
			}
		case len(live) > 0 && rng.Intn(100) < 45:
			i := rng.Intn(len(live))
			b := live[i]
			live[i] = live[len(live)-1]
			live = live[:len(live)-1]
			if err := p.Free(b.Addr, 0); err != nil {
				t.Fatalf("op %d: free of %#x: %v", op, b.Addr, err)
			}
		default:
			size := randomSize(rng)
			b, err := p.Malloc(size, uint64(rng.Intn(2)))
			if err != nil {
				if !errors.Is(err, policies.ErrOutOfMemory) {
					t.Fatalf("op %d: malloc of %d bytes: %v", op, size, err)
				}
				ooms++
				continue
			}
			if b.Size < size {
				t.Fatalf("op %d: malloc of %d bytes gave a block of %d", op, size, b.Size)
			}
			if size > 0 {
				live = append(live, b)
			}
		}
		checkLayout(t, op, dev, p, live, exact)
	}
	var retries int64
	if c, ok := p.(policies.Counter); ok {
		retries = c.Retries()
	}
	t.Logf("%d live blocks at the end, %d OOMs, %d retries, %d device allocs, %d device frees, peak %d MiB",
		len(live), ooms, retries, dev.Allocs(), dev.Frees(), dev.PeakReserved()/sMiB)
}

// randomSize returns a request size: mostly small, some up to a few MiB,
// a few large, the odd zero.
func randomSize(rng *rand.Rand) uint64 {
	switch r := rng.Intn(100); {
	case r < 1:
		return 0
	case r < 70:
		return uint64(1 + rng.Intn(64*sKiB))
	case r < 95:
		return uint64(64*sKiB + rng.Intn(2*sMiB))
	default:
		return uint64(2*sMiB + rng.Intn(70*sMiB))
	}
}

// devicePages holds, by simulated device, its mapped 2 MiB pages
// (policies.Mapper), kept by trackPages.
var devicePages = map[*sim.Device]map[uint64]bool{}

// trackPages makes checkLayout take blocks on dev's mapped pages as inside
// a live segment. It returns dev.
func trackPages(dev *sim.Device) *sim.Device {
	pages := map[uint64]bool{}
	devicePages[dev] = pages
	dev.OnCall(func(c sim.DeviceCall) {
		for a := c.Addr; a < c.Addr+c.Size; a += 2 * sMiB {
			switch c.Op {
			case trace.OpSegmentMap:
				pages[a] = true
			case trace.OpSegmentUnmap:
				delete(pages, a)
			}
		}
	})
	return dev
}

// onPages reports whether [b.Addr, b.Addr+b.Size) lies on mapped pages of dev.
func onPages(dev *sim.Device, b policies.Block) bool {
	pages := devicePages[dev]
	if len(pages) == 0 {
		return false
	}
	for a := b.Addr &^ (2*sMiB - 1); a < b.Addr+b.Size; a += 2 * sMiB {
		if !pages[a] {
			return false
		}
	}
	return true
}

func checkLayout(t *testing.T, op int, dev *sim.Device, p policies.Policy, live []policies.Block, exact bool) {
	t.Helper()
	segs := make([][2]uint64, 0, len(dev.Segments()))
	for a, n := range dev.Segments() {
		segs = append(segs, [2]uint64{a, n})
	}
	slices.SortFunc(segs, func(a, b [2]uint64) int { return cmpUint(a[0], b[0]) })
	bs := slices.Clone(live)
	slices.SortFunc(bs, func(a, b policies.Block) int { return cmpUint(a.Addr, b.Addr) })
	var allocated uint64
	for i, b := range bs {
		allocated += b.Size
		if i > 0 && bs[i-1].Addr+bs[i-1].Size > b.Addr {
			t.Fatalf("op %d: blocks %#x+%d and %#x+%d overlap", op, bs[i-1].Addr, bs[i-1].Size, b.Addr, b.Size)
		}
		j, _ := slices.BinarySearchFunc(segs, b.Addr, func(s [2]uint64, a uint64) int {
			if s[0] > a {
				return 1
			}
			return -1
		})
		if (j == 0 || b.Addr+b.Size > segs[j-1][0]+segs[j-1][1]) && !onPages(dev, b) {
			t.Fatalf("op %d: block %#x+%d is not inside a live segment or on mapped pages", op, b.Addr, b.Size)
		}
	}
	fs, ok := p.(policies.FreeSpacer)
	if !ok {
		return
	}
	free, largest := fs.FreeSpace()
	if largest > free {
		t.Fatalf("op %d: largest free block %d > free bytes %d", op, largest, free)
	}
	switch reserved := dev.Reserved(); {
	case exact && reserved != allocated+free:
		t.Fatalf("op %d: reserved %d != allocated %d + free %d", op, reserved, allocated, free)
	case !exact && reserved < allocated+free:
		t.Fatalf("op %d: reserved %d < allocated %d + free %d", op, reserved, allocated, free)
	}
}

func cmpUint(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// benchSimple replays one million random malloc and free events (a live
// set of about a thousand blocks, sizes as randomSize without the large
// ones) against the policy on an unlimited device and reports events/s.
func benchSimple(b *testing.B, name string, s policies.Settings, newDev func() policies.Device) {
	const events = 1 << 20
	rng := rand.New(rand.NewSource(2))
	sizes := make([]uint64, events)
	picks := make([]int, events)
	for i := range sizes {
		sizes[i] = randomSize(rng)
		if sizes[i] > 2*sMiB {
			sizes[i] = 1 + sizes[i]%(2*sMiB)
		}
		picks[i] = rng.Int()
	}
	cpu0 := processCPU()
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		p, err := policies.New(name, newDev(), s)
		if err != nil {
			b.Fatal(err)
		}
		live := make([]uint64, 0, 2048)
		b.StartTimer()
		for i := range events {
			// Grow the live set to about a thousand blocks, then keep it
			// there: malloc when below, free a random one when above.
			if len(live) < 1000 || (len(live) < 1100 && picks[i]%2 == 0) {
				blk, err := p.Malloc(sizes[i], 0)
				if err != nil {
					b.Fatal(err)
				}
				if blk.Addr != 0 {
					live = append(live, blk.Addr)
				}
				continue
			}
			j := picks[i] % len(live)
			if err := p.Free(live[j], 0); err != nil {
				b.Fatal(err)
			}
			live[j] = live[len(live)-1]
			live = live[:len(live)-1]
		}
	}
	b.ReportMetric(float64(events)*float64(b.N)/b.Elapsed().Seconds(), "events/s")
	// On a shared machine wall time counts other processes' turns; the
	// process's own CPU time (setup included, so a lower bound) does not.
	b.ReportMetric(float64(events)*float64(b.N)/(processCPU()-cpu0).Seconds(), "events/cpu-s")
}

// processCPU returns the CPU time the process has used, user and system.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkSimplePolicies measures each policy on the simulated device
// (sim) and on nullDevice, which costs next to nothing, so that the second
// figure is the policy's own cost.
func BenchmarkSimplePolicies(b *testing.B) {
	devs := []struct {
		name string
		new  func() policies.Device
	}{
		{"sim", func() policies.Device { return sim.NewDevice(0) }},
		{"null", func() policies.Device { return &nullDevice{next: devBase} }},
	}
	for _, name := range []string{"cuda", "first-fit", "best-fit", "buddy", "slab"} {
		for _, d := range devs {
			b.Run(name+"/"+d.name, func(b *testing.B) { benchSimple(b, name, nil, d.new) })
		}
	}
}

// nullDevice hands out ascending 2 MiB-aligned addresses and keeps no
// record: a device that costs next to nothing, for benchmarks.
type nullDevice struct{ next uint64 }

func (d *nullDevice) Alloc(size uint64) (uint64, error) {
	a := d.next
	d.next += (size + 2*sMiB - 1) / (2 * sMiB) * (2 * sMiB)
	return a, nil
}

func (d *nullDevice) Free(addr uint64) error { return nil }

// fmtSettings formats s for a subtest name.
func fmtSettings(s policies.Settings) string {
	if len(s) == 0 {
		return "defaults"
	}
	keys := make([]string, 0, len(s))
	for k := range s {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for i, k := range keys {
		keys[i] = k + "=" + s[k]
	}
	return strings.Join(keys, ",")
}

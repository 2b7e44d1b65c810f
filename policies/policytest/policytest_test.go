package policytest_test

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/policies/policytest"
)

// bump is the smallest correct policy: one segment per malloc, freed with
// its block.
type bump struct {
	name string
	dev  policies.Device
	// overlap makes it hand out its first block's address again: the
	// defect the kit must catch.
	overlap bool
	first   uint64
	held    map[uint64]bool
}

func (b *bump) Name() string { return b.name }

func (b *bump) Malloc(size, stream uint64) (policies.Block, error) {
	if size == 0 {
		size = 1
	}
	if b.overlap && b.first != 0 {
		return policies.Block{Addr: b.first, Size: size}, nil
	}
	addr, err := b.dev.Alloc(size)
	if err != nil {
		return policies.Block{}, err
	}
	if b.first == 0 {
		b.first = addr
	}
	b.held[addr] = true
	return policies.Block{Addr: addr, Size: size}, nil
}

func (b *bump) Free(addr, stream uint64) error {
	if !b.held[addr] {
		if b.overlap {
			return nil
		}
		return fmt.Errorf("bump: no block at %#x", addr)
	}
	delete(b.held, addr)
	return b.dev.Free(addr)
}

func register(name string, overlap bool) {
	policies.Register(policies.Info{Name: name, Design: "one segment per malloc (policytest's own test)"},
		func(dev policies.Device, s policies.Settings) (policies.Policy, error) {
			if err := s.Check(name); err != nil {
				return nil, err
			}
			return &bump{name: name, dev: dev, overlap: overlap, held: map[uint64]bool{}}, nil
		})
}

func init() {
	register("policytest-bump", false)
	register("policytest-overlap", true)
}

func TestBumpConforms(t *testing.T) {
	policytest.Run(t, "policytest-bump", &policytest.Options{Rounds: 1})
}

// TestKitCatchesOverlap runs the kit on a policy that hands one address
// out twice, in a child test process: the kit must fail it, naming the
// overlap and printing the trace.
func TestKitCatchesOverlap(t *testing.T) {
	if os.Getenv("POLICYTEST_CHILD") == "1" {
		policytest.Run(t, "policytest-overlap", &policytest.Options{Rounds: 1})
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestKitCatchesOverlap$", "-test.count=1")
	cmd.Env = append(os.Environ(), "POLICYTEST_CHILD=1")
	cmd.Dir = t.TempDir() // where rapid writes its fail file
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("the kit passed a policy that hands one block out twice:\n%s", out)
	}
	for _, want := range []string{"--- FAIL: TestKitCatchesOverlap/property", "trace:", "malloc"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the kit's failure lacks %q:\n%.3000s", want, out)
		}
	}
	if !strings.Contains(string(out), "overlap") && !strings.Contains(string(out), "twice") && !strings.Contains(string(out), "handed out") {
		t.Errorf("the failure does not say what is wrong:\n%.3000s", out)
	}
}

func TestUnregistered(t *testing.T) {
	if os.Getenv("POLICYTEST_CHILD") == "2" {
		policytest.Run(t, "no-such-policy", nil)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestUnregistered$", "-test.count=1")
	cmd.Env = append(os.Environ(), "POLICYTEST_CHILD=2")
	cmd.Dir = t.TempDir()
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), `policy "no-such-policy" is not registered`) {
		t.Fatalf("%v\n%s", err, out)
	}
}

// Package planpolicy is the plan: scheme of policies: --policy plan:COMMAND
// replays a trace against the placement that an outside planner makes of
// it (MiniMalloc, idealloc, STAlloc's planner, a script), by file. The
// policy is a clairvoyant one (a policies.Planner): its Plan writes the
// trace's device mallocs as a MiniMalloc problem (id,lower,upper,size),
// runs COMMAND on it, reads the planner's offsets back (MiniMalloc's
// solution, id,lower,upper,size,offset), checks them, and the replay then
// serves each malloc at its planned offset in one region of the plan's
// peak. docs/plan-policy.md says what is written, run, read and checked.
//
// Importing the package registers the scheme (cmd/replay does).
package planpolicy

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/trace"
)

// SchemeName is the part of the policy's name before the ':'.
const SchemeName = "plan"

// TimeoutEnv names the environment variable that sets the planner's time
// limit when the timeout setting is not given (the command line's --set
// cannot name a policy whose name holds a '.', as COMMAND usually does).
const TimeoutEnv = "ALLOCSIM_PLAN_TIMEOUT"

// DefaultTimeout is the planner's time limit when neither the timeout
// setting nor TimeoutEnv gives one.
const DefaultTimeout = 10 * time.Minute

func init() {
	policies.RegisterScheme(policies.Scheme{
		Name: SchemeName,
		Doc:  "plan:COMMAND: a clairvoyant placement by an outside planner: /bin/sh runs COMMAND IN OUT, IN a MiniMalloc problem (id,lower,upper,size) of the trace's device mallocs, OUT its solution with an offset column (docs/plan-policy.md)",
		Info: info,
		New: func(arg string, dev policies.Device, s policies.Settings) (policies.Policy, error) {
			return New(arg, dev, s)
		},
	})
}

// timeoutSetting is the policy's one setting.
var timeoutSetting = policies.Setting{
	Key:     "timeout",
	Default: DefaultTimeout.String(),
	Doc:     "the planner's time limit (a Go duration, 90s, 10m), after which it is killed; " + TimeoutEnv + " sets it where the setting cannot be given",
}

// info returns the Info of the policy plan:arg.
func info(arg string) (policies.Info, error) {
	if strings.TrimSpace(arg) == "" {
		return policies.Info{}, fmt.Errorf("plan: needs a command (plan:COMMAND, run as COMMAND INPUT OUTPUT)")
	}
	return policies.Info{
		Name:      SchemeName + ":" + arg,
		Design:    "clairvoyant placement by an outside planner (" + arg + "): a MiniMalloc problem out, its offsets in, checked, one region of the plan's peak",
		Settings:  []policies.Setting{timeoutSetting},
		Abilities: policies.AbilitiesOf(&Policy{}),
	}, nil
}

// Policy replays the placement an outside planner made of the trace. Plan
// writes the trace's buffers, runs the planner and checks its answer;
// Malloc then serves each malloc of the trace, in order, at its planned
// offset inside one region of the plan's peak bytes, allocated from the
// device at the first malloc of a non-zero size and never freed. A
// malloc that does not follow the plan (another size, or one more than it
// has) is an error, not an OOM. When the device refuses the region (a
// capacity below the peak), that malloc and every one after it is an OOM:
// the plan is not cut down to fit. Streams play no part; Free only takes
// the block out of the live ones.
type Policy struct {
	name    string
	command string
	dev     policies.Device
	timeout time.Duration

	planned bool
	calls   []call   // by malloc call, in order
	offsets []uint64 // by buffer: the planner's offsets
	stats   Stats
	next    int // the next malloc call

	region    uint64 // the region's address, valid when hasRegion
	hasRegion bool
	refused   error               // the device's refusal of the region, once refused
	live      map[uint64]struct{} // offsets of live blocks
}

// call is one malloc call of the plan: its requested bytes and its buffer
// (an index into the buffers, -1 for a malloc that has none: 0 bytes, or
// over trace.MaxSize).
type call struct {
	size uint64
	buf  int
}

// Stats describes a plan.
type Stats struct {
	// Buffers is the number of buffers written to the planner: device
	// mallocs of 1 to trace.MaxSize bytes, failed ones included.
	Buffers int
	// Peak is the plan's height in bytes, the largest offset+size: the
	// region's size.
	Peak uint64
	// NeverFreed is the number of buffers live to the end of the trace
	// (their upper bound is the number of events); Failed the number
	// of mallocs that failed in the source, planned for one event.
	NeverFreed, Failed int
	// Elapsed is how long the planner ran.
	Elapsed time.Duration
}

var (
	_ policies.Policy  = (*Policy)(nil)
	_ policies.Planner = (*Policy)(nil)
)

// New returns the policy plan:command on dev. Its one setting is timeout
// (a Go duration, default TimeoutEnv's value, else DefaultTimeout). It
// returns an error for an empty command, an unknown setting or a bad
// duration.
func New(command string, dev policies.Device, s policies.Settings) (*Policy, error) {
	in, err := info(command)
	if err != nil {
		return nil, err
	}
	if err := s.Check(in.Name, timeoutSetting.Key); err != nil {
		return nil, err
	}
	timeout := DefaultTimeout
	v, set := s[timeoutSetting.Key]
	src := "setting " + timeoutSetting.Key
	if !set {
		v, set = os.LookupEnv(TimeoutEnv)
		src = TimeoutEnv
	}
	if set {
		if timeout, err = time.ParseDuration(strings.TrimSpace(v)); err != nil || timeout <= 0 {
			return nil, fmt.Errorf("policy %s: %s=%q: not a positive duration (90s, 10m)", in.Name, src, v)
		}
	}
	return &Policy{name: in.Name, command: command, dev: dev, timeout: timeout}, nil
}

// Name returns the policy's name, plan:COMMAND.
func (p *Policy) Name() string { return p.name }

// Stats returns the statistics of the plan made by Plan.
func (p *Policy) Stats() Stats { return p.stats }

// Plan writes the buffers of evs to a MiniMalloc problem in a temporary
// directory, runs the planner on it, reads and checks its offsets (see
// Buffers, WriteProblem, ReadSolution and Check). It returns an error,
// in one line, when the planner fails, exceeds its time limit (its
// standard error's last lines quoted), or answers with a solution that is
// not one of the problem.
func (p *Policy) Plan(evs []trace.Event) error {
	p.planned = false
	bufs, calls, st := buffers(evs)
	dir, err := os.MkdirTemp("", "allocsim-plan-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	in, out := dir+"/problem.csv", dir+"/solution.csv"
	if err := writeFile(in, bufs); err != nil {
		return err
	}
	start := time.Now()
	if err := runPlanner(p.command, in, out, p.timeout); err != nil {
		return err
	}
	st.Elapsed = time.Since(start)
	f, err := os.Open(out)
	if err != nil {
		return fmt.Errorf("planner %q exited 0 but wrote no solution: %v", p.command, err)
	}
	defer f.Close()
	offs, err := ReadSolution(f, "solution of "+p.command, bufs)
	if err != nil {
		return err
	}
	peak, err := Check(bufs, offs)
	if err != nil {
		return fmt.Errorf("planner %q: %w", p.command, err)
	}
	st.Peak = peak
	p.calls, p.offsets, p.stats = calls, offs, st
	p.planned, p.next = true, 0
	p.hasRegion, p.refused, p.live = false, nil, map[uint64]struct{}{}
	return nil
}

// writeFile writes the problem of bufs to path.
func writeFile(path string, bufs []Buffer) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := WriteProblem(f, bufs); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Malloc places the next malloc of the plan, which must be of size bytes,
// at its planned offset in the region, allocating the region first if
// need be. Stream is ignored. It returns an error wrapping
// policies.ErrOutOfMemory when the device refuses the region (now or at an
// earlier malloc) and for a request over trace.MaxSize bytes, and another
// error when there is no plan or the malloc is not the plan's next.
func (p *Policy) Malloc(size, stream uint64) (policies.Block, error) {
	if !p.planned {
		return policies.Block{}, fmt.Errorf("policy %s: malloc of %d bytes: no plan: the policy must see the whole trace first (Plan)", p.name, size)
	}
	k := p.next
	if k >= len(p.calls) || p.calls[k].size != size {
		want := "none: the plan has no more mallocs"
		if k < len(p.calls) {
			want = fmt.Sprintf("%d bytes", p.calls[k].size)
		}
		return policies.Block{}, fmt.Errorf("policy %s: malloc #%d of %d bytes on stream %#x does not follow the plan (expected %s): replay the trace given to Plan", p.name, k, size, stream, want)
	}
	p.next++
	c := p.calls[k]
	switch {
	case size == 0:
		return policies.Block{}, nil
	case c.buf < 0:
		return policies.Block{}, fmt.Errorf("policy %s: malloc of %d bytes: larger than any device (not planned): %w", p.name, size, policies.ErrOutOfMemory)
	}
	if p.refused != nil {
		return policies.Block{}, fmt.Errorf("policy %s: malloc of %d bytes: the plan's region was refused: %w", p.name, size, p.refused)
	}
	if !p.hasRegion {
		addr, err := p.dev.Alloc(p.stats.Peak)
		if err != nil {
			p.refused = fmt.Errorf("region of %d bytes: %w", p.stats.Peak, err)
			return policies.Block{}, fmt.Errorf("policy %s: malloc of %d bytes: %w", p.name, size, p.refused)
		}
		p.region, p.hasRegion = addr, true
	}
	off := p.offsets[c.buf]
	p.live[off] = struct{}{}
	return policies.Block{Addr: p.region + off, Size: size}, nil
}

// Free takes back the block at addr; the region stays. Stream is ignored.
// It returns an error if addr is not a live block.
func (p *Policy) Free(addr, stream uint64) error {
	if addr == 0 {
		return nil
	}
	if !p.hasRegion || addr < p.region {
		return fmt.Errorf("policy %s: free of %#x: not a live block", p.name, addr)
	}
	off := addr - p.region
	if _, ok := p.live[off]; !ok {
		return fmt.Errorf("policy %s: free of %#x: not a live block", p.name, addr)
	}
	delete(p.live, off)
	return nil
}

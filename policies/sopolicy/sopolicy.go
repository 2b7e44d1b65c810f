// Package sopolicy adds the policies so:LIB.so: a CUDAPluggableAllocator
// library (the .so that torch.cuda.memory.CUDAPluggableAllocator loads),
// loaded unmodified and replayed through its alloc and free entry points,
// so that a custom PyTorch allocator is replayed beside the built-in
// policies. The library's own calls to the CUDA runtime (cudaMalloc,
// cudaFree, their Async forms, cuMemAlloc and cuMemFree, cudaMemGetInfo,
// and harmless stubs for cudaGetDevice, cudaSetDevice, the synchronizations
// and the error calls) are served by the Device of the replay, so that its
// device calls, reserved bytes, capacity OOMs and their cost are counted as
// for any other policy (docs/so-policy.md).
//
// The library's calls reach the Device through a shim: a small shared
// library (shim/cudashim.c) built at run time with the C compiler ($CC, cc
// or gcc) with the SONAME of each CUDA runtime or driver library the
// library needs (libcudart.so.13, libcudart.so.12, libcuda.so.1, ...), and
// loaded RTLD_GLOBAL before it, so that its DT_NEEDED entries are
// satisfied by the shim and its calls bind to it. The shim calls back into
// Go, to the policy whose library call is under way: one library call at a
// time in the process, under a lock, so that several so: policies may be
// replayed at once, each library loaded from a copy of its own.
//
// Importing the package registers the scheme (policies.RegisterScheme).
package sopolicy

import (
	"cmp"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/gpualloc/allocsim/policies"
)

// Scheme is the name of the scheme: --policy so:LIB.so[:ALLOC:FREE].
const Scheme = "so"

// DefaultAlloc and DefaultFree are the names of the entry points of a
// library named without them: those of PyTorch's example of a pluggable
// allocator ("Using custom memory allocators for CUDA").
const (
	DefaultAlloc = "my_malloc"
	DefaultFree  = "my_free"
)

func init() {
	policies.RegisterScheme(policies.Scheme{
		Name: Scheme,
		Doc:  "so:LIB.so[:ALLOC:FREE] loads a torch.cuda.memory.CUDAPluggableAllocator library and replays through its entry points ALLOC and FREE (default " + DefaultAlloc + " and " + DefaultFree + "), its cudaMalloc and cudaFree served by the simulated device (docs/so-policy.md)",
		Info: Info,
		New: func(arg string, dev policies.Device, s policies.Settings) (policies.Policy, error) {
			if len(s) > 0 {
				return nil, fmt.Errorf("policy %s:%s takes no settings (got %s)", Scheme, arg, s.Join(", "))
			}
			return New(arg, dev)
		},
	})
}

// The kinds of failure an *Error wraps: match them with errors.Is.
var (
	// ErrLoad: the library is missing, is no shared library, does not
	// load, lacks an entry point, or needs a CUDA runtime that the shim
	// cannot stand in for (a real one is loaded in the process already).
	ErrLoad = errors.New("cannot load the library")
	// ErrLibrary: the library misbehaved: it returned NULL for a malloc
	// that the device did not refuse, a pointer outside the memory it
	// got from the device or one already live, or freed memory it does
	// not hold.
	ErrLibrary = errors.New("the library misbehaved")
	// ErrDevice: the device failed a call of the library other than by
	// refusing it for memory (which the library gets as
	// cudaErrorMemoryAllocation).
	ErrDevice = errors.New("device failure")
)

// Error is the failure of an so: policy: its library and what was wrong.
type Error struct {
	// Library is the library's path as given.
	Library string
	// Msg says what was wrong.
	Msg string
	// Err is the kind of failure: ErrLoad, ErrLibrary or ErrDevice.
	Err error
}

func (e *Error) Error() string { return fmt.Sprintf("so policy %s: %s", e.Library, e.Msg) }

// Unwrap returns the kind of failure.
func (e *Error) Unwrap() error { return e.Err }

// Spec is what so:ARG names: the library and its entry points, as
// torch.cuda.memory.CUDAPluggableAllocator(path_to_so_file, alloc_fn_name,
// free_fn_name) takes them.
type Spec struct {
	// Path is the library's file.
	Path string
	// Alloc is the name of its function void* ALLOC(ssize_t size, int
	// device, cudaStream_t stream).
	Alloc string
	// Free is the name of its function void FREE(void* ptr, size_t size,
	// int device, cudaStream_t stream).
	Free string
}

// ParseArg parses the ARG of so:ARG: PATH, or PATH:ALLOC:FREE when the last
// two ':'-separated fields are C identifiers (a path may hold ':'). It
// returns an error for an empty path.
func ParseArg(arg string) (Spec, error) {
	sp := Spec{Path: arg, Alloc: DefaultAlloc, Free: DefaultFree}
	if f := strings.Split(arg, ":"); len(f) >= 3 && isIdent(f[len(f)-2]) && isIdent(f[len(f)-1]) {
		sp = Spec{Path: strings.Join(f[:len(f)-2], ":"), Alloc: f[len(f)-2], Free: f[len(f)-1]}
	}
	if sp.Path == "" {
		return Spec{}, fmt.Errorf("want so:LIB.so or so:LIB.so:ALLOC:FREE, got so:%s", arg)
	}
	return sp, nil
}

func isIdent(s string) bool {
	for i, c := range s {
		if !(c == '_' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || i > 0 && '0' <= c && c <= '9') {
			return false
		}
	}
	return s != ""
}

// Info returns the Info of the policy so:arg without loading the library;
// its abilities are those of the type Policy (none beyond Malloc and
// Free). It returns an error for an arg that ParseArg refuses or a file
// that is no ELF shared library.
func Info(arg string) (policies.Info, error) {
	sp, err := ParseArg(arg)
	if err != nil {
		return policies.Info{}, err
	}
	if _, err := needed(sp.Path); err != nil {
		return policies.Info{}, &Error{Library: sp.Path, Msg: err.Error(), Err: ErrLoad}
	}
	return policies.Info{
		Name:      Scheme + ":" + arg,
		Design:    fmt.Sprintf("a CUDAPluggableAllocator library: %s (%s, %s)", sp.Path, sp.Alloc, sp.Free),
		Abilities: policies.AbilitiesOf((*Policy)(nil)),
	}, nil
}

// needed returns the DT_NEEDED entries of the shared library at path.
func needed(path string) ([]string, error) {
	libs, _, err := dynamic(path)
	return libs, err
}

// dynamic returns the DT_NEEDED entries of the shared library at path, and
// whether its RPATH or RUNPATH names $ORIGIN.
func dynamic(path string) (libs []string, origin bool, err error) {
	r, err := os.Open(path)
	if err != nil {
		return nil, false, err
	}
	defer r.Close()
	f, err := elf.NewFile(r)
	if err != nil {
		return nil, false, fmt.Errorf("not an ELF shared library (%v)", err)
	}
	defer f.Close()
	if f.Type != elf.ET_DYN {
		return nil, false, fmt.Errorf("not a shared library (ELF type %s)", f.Type)
	}
	if libs, err = f.ImportedLibraries(); err != nil {
		return nil, false, fmt.Errorf("reading its dynamic section: %v", err)
	}
	for _, tag := range []elf.DynTag{elf.DT_RPATH, elf.DT_RUNPATH} {
		paths, _ := f.DynString(tag)
		for _, p := range paths {
			origin = origin || strings.Contains(p, "$ORIGIN") || strings.Contains(p, "${ORIGIN}")
		}
	}
	return libs, origin, nil
}

// cudaLibrary reports whether a DT_NEEDED name is one of the CUDA runtime
// or driver libraries the shim stands in for.
func cudaLibrary(name string) bool {
	return strings.HasPrefix(name, "libcudart.so") || name == "libcuda.so" || strings.HasPrefix(name, "libcuda.so.")
}

// segment is device memory the library holds: from its cudaMalloc.
type segment struct{ addr, size uint64 }

// Policy is a CUDAPluggableAllocator library loaded for a replay (see the
// package doc). Close unloads it; a Policy dropped without Close is
// unloaded when it is garbage collected.
type Policy struct {
	name string // "so:" + arg
	spec Spec
	dev  policies.Device
	lib  *library

	err   error             // the first failure: every later call returns it
	live  map[uint64]uint64 // live blocks: address -> requested bytes
	segs  []segment         // held segments, by address
	calls callState         // of the library call under way
}

// callState is what the shim's calls during one library call left.
type callState struct {
	refused error // the device's refusal of a cudaMalloc, wrapping ErrOutOfMemory
	failed  error // a failure to end the policy with
}

var _ policies.Policy = (*Policy)(nil)

// New loads the library of so:arg for a replay on dev: it builds the shim
// for the CUDA libraries the library needs (once per process), loads it,
// and loads a copy of the library, checking its entry points. It returns
// an *Error of kind ErrLoad when any of that fails.
func New(arg string, dev policies.Device) (*Policy, error) {
	sp, err := ParseArg(arg)
	if err != nil {
		return nil, err
	}
	p := &Policy{name: Scheme + ":" + arg, spec: sp, dev: dev, live: map[uint64]uint64{}}
	lib, err := load(sp)
	if err != nil {
		return nil, &Error{Library: sp.Path, Msg: err.Error(), Err: ErrLoad}
	}
	p.lib = lib
	lib.cleanup(p)
	return p, nil
}

// Name returns "so:" and the argument.
func (p *Policy) Name() string { return p.name }

// fail records the policy's failure, which every later call returns.
func (p *Policy) fail(kind error, format string, a ...any) error {
	if p.err == nil {
		p.err = &Error{Library: p.spec.Path, Msg: fmt.Sprintf(format, a...), Err: kind}
	}
	return p.err
}

// Malloc calls the library's ALLOC(size, 0, stream). A NULL answer is an
// OOM when the device refused one of the library's cudaMalloc calls during
// it, else an error of kind ErrLibrary. The block's size is the requested
// size: the library's rounding is not known.
func (p *Policy) Malloc(size, stream uint64) (policies.Block, error) {
	if p.err != nil {
		return policies.Block{}, p.err
	}
	if p.lib == nil {
		return policies.Block{}, p.fail(ErrLoad, "used after Close")
	}
	if size > 1<<62 {
		return policies.Block{}, p.fail(ErrLibrary, "malloc of %d bytes: more than a ssize_t holds", size)
	}
	addr, err := p.lib.alloc(p, size, stream)
	if err != nil {
		return policies.Block{}, err
	}
	if addr == 0 {
		if p.calls.refused != nil {
			return policies.Block{}, fmt.Errorf("%s: malloc of %d bytes: %s returned NULL after %w", p.name, size, p.spec.Alloc, p.calls.refused)
		}
		return policies.Block{}, p.fail(ErrLibrary, "%s returned NULL for a malloc of %d bytes on stream %d, and the device refused none of its cudaMalloc calls", p.spec.Alloc, size, stream)
	}
	if _, dup := p.live[addr]; dup {
		return policies.Block{}, p.fail(ErrLibrary, "%s returned %#x for a malloc of %d bytes, a block that is live already", p.spec.Alloc, addr, size)
	}
	if s, ok := p.segmentAt(addr); !ok || addr+size > s.addr+s.size {
		return policies.Block{}, p.fail(ErrLibrary, "%s returned %#x for a malloc of %d bytes, not inside a segment it got from cudaMalloc", p.spec.Alloc, addr, size)
	}
	p.live[addr] = size
	return policies.Block{Addr: addr, Size: size}, nil
}

// Free calls the library's FREE(addr, size, 0, stream), size the block's
// requested size, as PyTorch does.
func (p *Policy) Free(addr, stream uint64) error {
	if p.err != nil {
		return p.err
	}
	if p.lib == nil {
		return p.fail(ErrLoad, "used after Close")
	}
	size, ok := p.live[addr]
	if !ok {
		return fmt.Errorf("%s: free of %#x: no live block there", p.name, addr)
	}
	delete(p.live, addr)
	return p.lib.free(p, addr, size, stream)
}

// Close unloads the library; the device memory it holds stays allocated.
// Every later call fails.
func (p *Policy) Close() error {
	if p.lib != nil {
		p.lib.close()
		p.lib = nil
	}
	return nil
}

// segmentAt returns the held segment holding addr.
func (p *Policy) segmentAt(addr uint64) (segment, bool) {
	i, found := slices.BinarySearchFunc(p.segs, addr, func(s segment, a uint64) int {
		switch {
		case s.addr > a:
			return 1
		case s.addr+s.size <= a:
			return -1
		}
		return 0
	})
	if !found {
		return segment{}, false
	}
	return p.segs[i], true
}

// deviceMalloc serves the library's cudaMalloc of size bytes (call names
// the entry point).
func (p *Policy) deviceMalloc(size uint64, call string) (uint64, int) {
	if size == 0 {
		return 0, codeSuccess // as cudaMalloc: a NULL pointer
	}
	addr, err := p.dev.Alloc(size)
	if err != nil {
		if errors.Is(err, policies.ErrOutOfMemory) {
			p.calls.refused = fmt.Errorf("the device refused its %s of %d bytes: %w", call, size, err)
			return 0, codeMemoryAllocation
		}
		p.calls.failed = p.fail(ErrDevice, "%s of %d bytes: %v", call, size, err)
		return 0, codeUnknown
	}
	i, _ := slices.BinarySearchFunc(p.segs, addr, func(s segment, a uint64) int {
		return cmp.Compare(s.addr, a)
	})
	p.segs = slices.Insert(p.segs, i, segment{addr, size})
	return addr, codeSuccess
}

// deviceFree serves the library's cudaFree of addr.
func (p *Policy) deviceFree(addr uint64, call string) int {
	i, found := slices.BinarySearchFunc(p.segs, addr, func(s segment, a uint64) int {
		return cmp.Compare(s.addr, a)
	})
	if !found {
		p.calls.failed = p.fail(ErrLibrary, "%s(%#x): not a segment it got from cudaMalloc", call, addr)
		return codeInvalidValue
	}
	for a, n := range p.live {
		if a >= addr && a < addr+p.segs[i].size {
			p.calls.failed = p.fail(ErrLibrary, "%s(%#x): the segment holds the live block at %#x (%d bytes)", call, addr, a, n)
			return codeInvalidValue
		}
	}
	if err := p.dev.Free(addr); err != nil {
		p.calls.failed = p.fail(ErrDevice, "%s(%#x): %v", call, addr, err)
		return codeUnknown
	}
	p.segs = slices.Delete(p.segs, i, i+1)
	return codeSuccess
}

// memInfo serves cudaMemGetInfo: the device's capacity less its reserved
// bytes, when it has a capacity, else 1 PiB free of 1 PiB.
func (p *Policy) memInfo() (free, total uint64) {
	const unlimited = 1 << 50
	if c, ok := p.dev.(policies.Capacitor); ok && c.Capacity() > 0 {
		total = c.Capacity()
		if r := c.Reserved(); r < total {
			free = total - r
		}
		return free, total
	}
	return unlimited, unlimited
}

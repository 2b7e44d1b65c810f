// Package policies holds the allocator policies a trace is replayed
// against, each behind the Policy interface and each getting its memory
// from a Device, so that the same policy code runs on the simulated device
// of package sim and on the real GPU of package gpu.
package policies

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	"github.com/gpualloc/allocsim/trace"
)

// ErrOutOfMemory is returned by a Device that refuses an allocation and by a
// Policy that cannot satisfy a malloc (an OOM). Match it with errors.Is.
var ErrOutOfMemory = errors.New("out of memory")

// ErrOverflow is wrapped, with ErrOutOfMemory, by the error of an
// allocation refused because its bytes would take a count or an address
// past 2^64 (the device's address space, a plan's arena): an OOM that
// checked arithmetic finds instead of a wrapped sum. Match it with
// errors.Is.
var ErrOverflow = errors.New("a sum of bytes past 64 bits")

// Device is a source of device memory segments: cudaMalloc and cudaFree, or
// their simulation.
type Device interface {
	// Alloc allocates a segment of size bytes and returns its address. It
	// returns an error wrapping ErrOutOfMemory when the device refuses.
	Alloc(size uint64) (addr uint64, err error)
	// Free releases the segment at addr, returned earlier by Alloc.
	Free(addr uint64) error
}

// CardMemorier is implemented by a Device that stands for a card whose
// total memory is known (the driver's cudaMemGetInfo total, as a trace
// records its card), for the policies that size themselves by it as their
// framework does (XLA's memory fraction).
type CardMemorier interface {
	// CardMemory returns the card's total memory in bytes, 0 if unknown.
	CardMemory() uint64
}

// Capacitor is implemented by a Device with a fixed capacity.
type Capacitor interface {
	// Capacity returns the device's capacity in bytes, 0 if unlimited.
	Capacity() uint64
	// Reserved returns the bytes currently allocated from the device.
	Reserved() uint64
}

// Mapper is implemented by a Device that can reserve address ranges and
// back pages of them with memory on demand (cuMemAddressReserve, then
// cuMemCreate and cuMemMap), as expandable segments need.
type Mapper interface {
	// Reserve reserves size bytes of address space, backed by nothing, and
	// returns its start.
	Reserve(size uint64) (addr uint64, err error)
	// Map backs [addr, addr+size), inside a reserved range and not mapped,
	// with memory: one device allocation, counted as one however many
	// pages it spans. It returns an error wrapping ErrOutOfMemory when the
	// device refuses.
	Map(addr, size uint64) error
	// Unmap gives back the memory of [addr, addr+size), which is mapped:
	// one device free.
	Unmap(addr, size uint64) error
	// Release gives back the reserved range at addr, which has nothing
	// mapped.
	Release(addr uint64) error
}

// Block is a placed allocation: its address and the bytes the policy set
// aside for it (the requested size after the policy's rounding).
type Block struct {
	Addr uint64
	Size uint64
}

// Policy is an allocator: it places mallocs inside device segments and takes
// frees back.
type Policy interface {
	// Name returns the policy's registry name.
	Name() string
	// Malloc places a request of size bytes on stream. It returns an error
	// wrapping ErrOutOfMemory when it cannot.
	Malloc(size, stream uint64) (Block, error)
	// Free takes back the block at addr, returned by an earlier Malloc; the
	// free is issued on stream.
	Free(addr, stream uint64) error
}

// Handler is implemented by a policy that gives each block it places a
// handle, a number by which it finds the block again at its free without
// looking its address up. The replay engine keeps the handle with its own
// record of the trace's live allocation, found by the trace's address,
// so that a free costs one lookup, not two. A block placed by MallocHandle
// is freed by FreeHandle only, never by Free or FreeLate (Follower); the
// blocks of Malloc, of a Pooler's calls and of a malloc that failed in the
// source go through Free as before.
type Handler interface {
	// MallocHandle is Malloc that also returns the block's handle.
	MallocHandle(size, stream uint64) (Block, uint64, error)
	// FreeHandle is Free, issued on stream, of the block that MallocHandle
	// returned with handle h; with late, it is a Follower's FreeLate of
	// it instead. It returns an error if h is no allocated block's.
	FreeHandle(h, stream uint64, late bool) error
}

// Syncer is implemented by policies that act on synchronization (for
// example a stream-ordered pool that releases memory at a synchronize).
type Syncer interface {
	// StreamSync is a cudaStreamSynchronize of stream.
	StreamSync(stream uint64)
	// DeviceSync is a cudaDeviceSynchronize.
	DeviceSync()
	// EventRecord records CUDA event ev on stream.
	EventRecord(ev, stream uint64)
	// StreamWaitEvent makes stream wait for event ev.
	StreamWaitEvent(stream, ev uint64)
	// EventSync is a cudaEventSynchronize of event ev.
	EventSync(ev uint64)
}

// Releaser is implemented by caching policies that can give cached memory
// back to the device on request (torch.cuda.empty_cache()).
type Releaser interface {
	// EmptyCache returns every unused cached segment to the device.
	EmptyCache() error
}

// Aliaser is implemented by a policy that may hand out a block sharing
// memory with a live block that it extends in place (vattention: a
// growing tensor's range extended by pages, the old tensor's free
// expected next). Aliases, asked right after a malloc returned b, reports
// the live block b extends, which lies inside b; ok is false for none. The
// invariant checker then lets the two overlap, and counts the old block's
// bytes once, until its free.
type Aliaser interface {
	Aliases(b Block) (old Block, ok bool)
}

// Pipeliner is implemented by a policy that can be told the engine's next
// Malloc and Free calls before they are made, so that it can work ahead
// of them: an exec policy sends them to its child at once, which answers
// them while the engine works, instead of a round trip between two
// processes per malloc.
//
// After Ahead(calls), the engine's next calls of the policy are exactly
// these, in order, and no other call of the policy comes between them,
// except that the Free of a block whose malloc (calls[Of]) failed is not
// made. The engine calls Ahead again only after the last of them. A
// policy that finds a call differ from the one it was told returns an
// error from that call.
type Pipeliner interface {
	Ahead(calls []Call) error
}

// Call is a Malloc or a Free that the engine tells a Pipeliner ahead.
type Call struct {
	Free   bool   // a Free; else a Malloc
	Size   uint64 // a Malloc's size in bytes
	Stream uint64
	// A Free's block: calls[Of] is its malloc, among the same calls; Of is
	// -1 when the malloc returned before Ahead, and Addr is the block's
	// address.
	Of   int
	Addr uint64
}

// FreeSpacer is implemented by policies that can report their free space,
// for the external fragmentation metric.
type FreeSpacer interface {
	// FreeSpace returns the free bytes inside reserved segments and the
	// size in bytes of the largest free block.
	FreeSpace() (total, largest uint64)
}

// Counter is implemented by policies that count retries: device
// allocations that failed and were tried again after releasing cache.
type Counter interface {
	// Retries returns the number of allocation retries so far.
	Retries() int64
}

// Pooler is implemented by policies that keep private pools apart from
// their default ones, as PyTorch's caching allocator does for CUDA graph
// captures and MemPools (trace.Event.Pool). A replay gives a policy that
// is none the mallocs of private pools as plain mallocs, and says so.
type Pooler interface {
	// MallocPool is Malloc of size bytes on stream into private pool
	// pool (never 0, the default pools): a malloc made while a CUDA
	// graph was captured into the pool, or inside its MemPool's
	// use_mem_pool context. The pool is created by its first malloc.
	MallocPool(size, stream uint64, pool uint32) (Block, error)
	// ReleasePool says that no graph uses pool any more, or that its
	// MemPool was deleted: from here the policy may give its cached
	// segments back once its blocks are free. Releasing a pool that had
	// no malloc does nothing.
	ReleasePool(pool uint32) error
	// RestoreBlock is a malloc that sets a block of size bytes of private
	// pool pool back in place, in a restore of the pool's checkpointed
	// state (PyTorch's setCheckpointPoolState): the block right after the
	// one restored before it, when that one did not end its segment, else
	// the first block of one of the pool's segments whose memory is all
	// free. The policy may serve it as MallocPool when it keeps no such
	// state; it returns the errors MallocPool does.
	RestoreBlock(size, stream uint64, pool uint32) (Block, error)
	// EmptyPool gives back the unused cached memory of private pool pool
	// only, as torch.cuda.empty_cache does for the default pools (the
	// emptyCache of a MemPool that its deletion makes).
	EmptyPool(pool uint32) error
}

// Planner is implemented by clairvoyant policies, which place mallocs
// knowing the whole trace (offline): the replay calls Plan with every event
// of the trace before the first Malloc, and then replays the same events.
// A replay that streams must read the trace into memory for them.
type Planner interface {
	// Plan is given the events of the trace, in order; the slice is the
	// caller's and must not be modified. It returns an error for a trace
	// the policy cannot plan.
	Plan(evs []trace.Event) error
}

// Settings are a policy's settings by key (the part after "NAME." in
// --set NAME.key=value), as strings.
type Settings map[string]string

// Factory builds a policy on dev with the given settings. It returns an
// error naming the key for an unknown or malformed setting.
type Factory func(dev Device, s Settings) (Policy, error)

// entry is a registered policy: what it is and how to build it.
type entry struct {
	info    Info
	factory Factory
}

// registry maps policy names to their entries, in no particular order;
// Names sorts them.
var registry = map[string]entry{}

// Register adds the policy info.Name, built by f, to the policies that
// --policy names and that every command, table, chart and report knows:
// the built-in policies register from their files' init functions, a
// policy of another module from its own (see docs/write-a-policy.md). The
// policy's Abilities are derived from its type (AbilitiesOf a policy that
// f builds with no settings on a probe device), whatever info says, but
// for MapperSetting. It panics, as database/sql.Register does, when the
// name is taken, empty, "all" or holds a ':' or ',' (the names of schemes
// and lists), or when f cannot build the policy with no settings: a
// program's mistake, found at its start.
func Register(info Info, f Factory) {
	switch {
	case info.Name == "" || info.Name == "all" || strings.ContainsAny(info.Name, ":, ="):
		panic(fmt.Sprintf("policies: Register of a policy named %q", info.Name))
	case f == nil:
		panic("policies: Register of " + info.Name + " with no factory")
	}
	if _, dup := registry[info.Name]; dup {
		panic("policies: duplicate policy " + info.Name)
	}
	p, err := f(&probeDevice{}, nil)
	if err != nil {
		panic(fmt.Sprintf("policies: Register of %s: it does not build with no settings: %v", info.Name, err))
	}
	ab := AbilitiesOf(p)
	ab.MapperSetting = info.Abilities.MapperSetting
	info.Abilities = ab
	registry[info.Name] = entry{info: info, factory: f}
}

// register is Register, for the built-in policies' files.
func register(info Info, f Factory) { Register(info, f) }

// AbilitiesOf returns the optional interfaces p implements (MapperSetting,
// a property of a setting, is left empty).
func AbilitiesOf(p Policy) Abilities {
	_, planner := p.(Planner)
	_, hinter := p.(Hinter)
	_, marker := p.(Marker)
	_, syncer := p.(Syncer)
	_, releaser := p.(Releaser)
	_, follower := p.(Follower)
	_, ties := p.(TieFollower)
	_, spacer := p.(FreeSpacer)
	_, counter := p.(Counter)
	_, pooler := p.(Pooler)
	return Abilities{Planner: planner, Hinter: hinter, Marker: marker, Syncer: syncer, Releaser: releaser,
		Follower: follower, TieFollower: ties, FreeSpacer: spacer, Counter: counter, Pooler: pooler}
}

// probeDevice is the device Register builds a policy on to learn its
// abilities: it hands out addresses and never refuses.
type probeDevice struct{ next uint64 }

func (d *probeDevice) Alloc(size uint64) (uint64, error) {
	addr := d.next + 1<<40
	d.next += (size + 1<<21 - 1) &^ (1<<21 - 1)
	return addr, nil
}

func (d *probeDevice) Free(addr uint64) error { return nil }

func (d *probeDevice) Reserve(size uint64) (uint64, error) { return d.Alloc(size) }
func (d *probeDevice) Map(addr, size uint64) error         { return nil }
func (d *probeDevice) Unmap(addr, size uint64) error       { return nil }
func (d *probeDevice) Release(addr uint64) error           { return nil }

// Scheme is a family of policies that are not built in but named by
// --policy SCHEME:ARG, ARG saying where the policy is: exec:COMMAND (a
// child process speaking a line protocol), plan:COMMAND (an offline
// planner's offsets by file). Lookup and New take such names like any
// other; Names does not list them.
type Scheme struct {
	// Name is the part before the ':'.
	Name string
	// Doc says in one line what ARG is and what the policy does.
	Doc string
	// Info returns the Info of the policy SCHEME:ARG (its Name the whole
	// name), or an error saying what is wrong with ARG.
	Info func(arg string) (Info, error)
	// New builds the policy SCHEME:ARG on dev with settings s.
	New func(arg string, dev Device, s Settings) (Policy, error)
}

// schemes maps scheme names to schemes.
var schemes = map[string]Scheme{}

// RegisterScheme adds scheme s; it panics when its name is taken or is a
// policy's, as Register does.
func RegisterScheme(s Scheme) {
	if s.Name == "" || strings.ContainsAny(s.Name, ":, =") || s.Info == nil || s.New == nil {
		panic(fmt.Sprintf("policies: RegisterScheme of %q: a name without ':', ',' or '=', an Info and a New needed", s.Name))
	}
	if _, dup := schemes[s.Name]; dup {
		panic("policies: duplicate scheme " + s.Name)
	}
	schemes[s.Name] = s
}

// Schemes returns the registered schemes, sorted by name.
func Schemes() []Scheme {
	out := make([]Scheme, 0, len(schemes))
	for _, n := range slices.Sorted(maps.Keys(schemes)) {
		out = append(out, schemes[n])
	}
	return out
}

// schemeOf returns the scheme of a name SCHEME:ARG and its ARG.
func schemeOf(name string) (Scheme, string, bool) {
	sn, arg, ok := strings.Cut(name, ":")
	if !ok {
		return Scheme{}, "", false
	}
	s, ok := schemes[sn]
	return s, arg, ok
}

// Known reports whether name is a registered policy or a name of a
// registered scheme whose ARG it takes; the error says why not.
func Known(name string) error {
	if _, ok := registry[name]; ok {
		return nil
	}
	if s, arg, ok := schemeOf(name); ok {
		if _, err := s.Info(arg); err != nil {
			return fmt.Errorf("policy %q: %w", name, err)
		}
		return nil
	}
	return fmt.Errorf("unknown policy %q (%sknown: %s%s)", name, didYouMean(name, Names()), strings.Join(Names(), ", "), schemeList())
}

// schemeList lists the schemes as ", or SCHEME:ARG ..." for an error.
func schemeList() string {
	if len(schemes) == 0 {
		return ""
	}
	var parts []string
	for _, s := range Schemes() {
		parts = append(parts, s.Name+":...")
	}
	return "; or " + strings.Join(parts, ", ")
}

// Names returns the names of every registered policy, sorted.
func Names() []string {
	names := make([]string, 0, len(registry))
	for n := range registry {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// New builds the policy called name on dev: a registered one, or one of a
// registered scheme (SCHEME:ARG). It returns an error for an unknown name
// or a bad setting.
func New(name string, dev Device, s Settings) (Policy, error) {
	if e, ok := registry[name]; ok {
		return e.factory(dev, s)
	}
	if sc, arg, ok := schemeOf(name); ok {
		return sc.New(arg, dev, s)
	}
	return nil, Known(name)
}

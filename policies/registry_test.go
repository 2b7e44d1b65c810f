package policies_test

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/trace"
)

// registryTrace touches every ability a policy may have: mallocs of the
// small and large sizes on two streams, a late free, synchronizations,
// markers and an empty_cache.
const registryTrace = `
marker label="iteration 0"
malloc id=1 size=1000
malloc id=2 size=3MiB stream=1
malloc id=3 size=25MiB
event_record event=7 stream=1
free id=2 stream=1
stream_wait_event event=7 stream=0
malloc id=4 size=2MiB
free_requested id=1
stream_sync stream=1
free id=1
marker label="iteration 1"
malloc id=5 size=700KiB stream=1
free id=3
device_sync
malloc id=6 size=40MiB
free id=4
event_sync event=7
empty_cache
free id=5 stream=1
malloc id=7 size=5000
free id=6
free id=7
`

// TestRegistryMatchesFactories holds each policy's Info to its factory:
// the documented keys are exactly those the factory knows, each is
// accepted at its documented default, and a replay with every default set
// explicitly gives what a replay with no settings gives.
func TestRegistryMatchesFactories(t *testing.T) {
	_, evs, err := trace.ParseText("registry.txt", strings.NewReader(registryTrace))
	if err != nil {
		t.Fatal(err)
	}
	infos := policies.Infos()
	if got, want := len(infos), len(policies.Names()); got != want {
		t.Fatalf("%d infos for %d policies", got, want)
	}
	for k, in := range infos {
		t.Run(in.Name, func(t *testing.T) {
			if k > 0 && infos[k-1].Name >= in.Name {
				t.Errorf("Infos not sorted: %q before %q", infos[k-1].Name, in.Name)
			}
			if got, ok := policies.Lookup(in.Name); !ok || !reflect.DeepEqual(got, in) {
				t.Errorf("Lookup = %+v, %v; want the Infos entry", got, ok)
			}
			if in.Design == "" {
				t.Error("no design")
			}
			for _, s := range in.Settings {
				if s.Doc == "" {
					t.Errorf("setting %s has no doc", s.Key)
				}
			}

			// The factory's own list of keys, from the error for an
			// undocumented one.
			_, err := policies.New(in.Name, sim.NewDevice(0), policies.Settings{"no_such_key": "1"})
			if err == nil {
				t.Fatal("an undocumented key is accepted")
			}
			var known []string
			msg := err.Error()
			if _, list, ok := strings.Cut(msg, "(known: "); ok {
				known = strings.Split(strings.TrimSuffix(list, ")"), ", ")
			} else if !strings.Contains(msg, "(it has no settings)") {
				t.Fatalf("undocumented key: %v", err)
			}
			if got := in.Keys(); !sameKeys(got, known) {
				t.Errorf("documented keys %v, the factory's %v", got, known)
			}

			for _, s := range in.Settings {
				if s.Derived {
					continue
				}
				if _, err := policies.New(in.Name, sim.NewDevice(0), policies.Settings{s.Key: s.Default}); err != nil {
					t.Errorf("%s=%q, the documented default: %v", s.Key, s.Default, err)
				}
			}

			// Unlimited, roomy, and tight enough for retries and OOMs.
			for _, capacity := range []uint64{0, 1 << 30, 44 << 20} {
				none, err := sim.Run(trace.NewSliceSource(trace.Header{}, evs), sim.Config{Policy: in.Name, Capacity: capacity})
				if err != nil {
					t.Fatal(err)
				}
				defaults := in.Defaults()
				all, err := sim.Run(trace.NewSliceSource(trace.Header{}, evs), sim.Config{Policy: in.Name, Capacity: capacity, Settings: defaults})
				if err != nil {
					t.Fatalf("capacity %d, with the defaults %v: %v", capacity, defaults, err)
				}
				r0, r1 := *none[0], *all[0]
				r0.Settings, r1.Settings = nil, nil
				if !reflect.DeepEqual(r0, r1) {
					t.Errorf("capacity %d: with the defaults %v, reserved %d allocs %d frees %d retries %d OOMs %d; without settings %d %d %d %d %d",
						capacity, defaults, r1.PeakReserved, r1.DeviceAllocs, r1.DeviceFrees, r1.AllocRetries, r1.OOMs,
						r0.PeakReserved, r0.DeviceAllocs, r0.DeviceFrees, r0.AllocRetries, r0.OOMs)
				}
				if r0.Mallocs == 0 {
					t.Error("nothing replayed")
				}
			}
		})
	}
}

func sameKeys(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// TestRegistryAbilities checks each ability flag against the type
// assertions on a policy built by its factory, and that a policy whose
// MapperSetting is on refuses a device that is no Mapper.
func TestRegistryAbilities(t *testing.T) {
	for _, in := range policies.Infos() {
		t.Run(in.Name, func(t *testing.T) {
			p, err := policies.New(in.Name, sim.NewDevice(0), nil)
			if err != nil {
				t.Fatal(err)
			}
			if p.Name() != in.Name {
				t.Errorf("Name() = %q", p.Name())
			}
			_, planner := p.(policies.Planner)
			_, hinter := p.(policies.Hinter)
			_, marker := p.(policies.Marker)
			_, syncer := p.(policies.Syncer)
			_, releaser := p.(policies.Releaser)
			_, follower := p.(policies.Follower)
			_, ties := p.(policies.TieFollower)
			_, spacer := p.(policies.FreeSpacer)
			_, counter := p.(policies.Counter)
			_, pooler := p.(policies.Pooler)
			want := policies.Abilities{
				Planner: planner, Hinter: hinter, Marker: marker, Syncer: syncer,
				Releaser: releaser, Follower: follower, TieFollower: ties, FreeSpacer: spacer, Counter: counter, Pooler: pooler,
				MapperSetting: in.Abilities.MapperSetting,
			}
			if in.Abilities != want {
				t.Errorf("abilities %+v, the policy's %+v", in.Abilities, want)
			}
			if key := in.Abilities.MapperSetting; key != "" {
				if !slices.Contains(in.Keys(), key) {
					t.Errorf("MapperSetting %q is not a setting", key)
				}
				on := policies.Settings{key: "True"}
				if _, err := policies.New(in.Name, noMapper{sim.NewDevice(0)}, on); err == nil {
					t.Errorf("%s on a device that is no Mapper: no error", key)
				}
				if _, err := policies.New(in.Name, sim.NewDevice(0), on); err != nil {
					t.Errorf("%s on a Mapper: %v", key, err)
				}
			}
		})
	}
}

// noMapper hides the Mapper methods of a device.
type noMapper struct{ d *sim.Device }

func (n noMapper) Alloc(size uint64) (uint64, error) { return n.d.Alloc(size) }
func (n noMapper) Free(addr uint64) error            { return n.d.Free(addr) }

// TestLookupUnknown: an unregistered name has no Info.
func TestLookupUnknown(t *testing.T) {
	if in, ok := policies.Lookup("nope"); ok {
		t.Errorf("Lookup(nope) = %+v, true", in)
	}
}

// TestWriteTable checks the text table's shape on one policy.
func TestWriteTable(t *testing.T) {
	in, _ := policies.Lookup("cuda")
	var b strings.Builder
	if err := policies.WriteTable(&b, []policies.Info{in}); err != nil {
		t.Fatal(err)
	}
	want := "cuda: no caching: every malloc is a cudaMalloc, every free a cudaFree\n" +
		"  abilities: free space\n" +
		"  granularity=512  requests are rounded up to a multiple of it, in bytes, from 1 B to 2 MiB\n"
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
}

package policies

import (
	"errors"
	"fmt"
	"github.com/gpualloc/allocsim/internal/spell"
	"github.com/gpualloc/allocsim/sim/results"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// Join returns the settings as key=value pairs sorted by key, joined by
// sep ("" for none).
func (s Settings) Join(sep string) string { return results.JoinSettings(s, sep) }

// Check returns an error naming the first key of s (in sorted order) that is
// not among known.
func (s Settings) Check(policy string, known ...string) error {
	keys := make([]string, 0, len(s))
	for k := range s {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		found := false
		for _, kn := range known {
			if k == kn {
				found = true
				break
			}
		}
		if !found {
			if len(known) == 0 {
				return fmt.Errorf("policy %s: unknown setting %q (it has no settings)", policy, k)
			}
			return fmt.Errorf("policy %s: unknown setting %q (%sknown: %s)", policy, k, didYouMean(k, known), strings.Join(known, ", "))
		}
	}
	return nil
}

// Uint returns the setting key as an unsigned integer, or def when unset.
func (s Settings) Uint(policy, key string, def uint64) (uint64, error) {
	v, ok := s[key]
	if !ok {
		return def, nil
	}
	n, err := strconv.ParseUint(strings.TrimSpace(v), 0, 64)
	if err != nil {
		return 0, fmt.Errorf("policy %s: setting %s=%q: not an unsigned integer", policy, key, v)
	}
	return n, nil
}

// Bytes returns the setting key as a size in bytes, or def when unset. It
// accepts plain bytes and the suffixes of ParseSize (KiB, MiB, GiB, ...).
func (s Settings) Bytes(policy, key string, def uint64) (uint64, error) {
	v, ok := s[key]
	if !ok {
		return def, nil
	}
	n, err := ParseSize(v)
	if err != nil {
		return 0, fmt.Errorf("policy %s: setting %s=%q: %v", policy, key, v, err)
	}
	return n, nil
}

// Bool returns the setting key as a boolean, or def when unset.
func (s Settings) Bool(policy, key string, def bool) (bool, error) {
	v, ok := s[key]
	if !ok {
		return def, nil
	}
	b, err := strconv.ParseBool(strings.TrimSpace(v))
	if err != nil {
		return false, fmt.Errorf("policy %s: setting %s=%q: not a boolean", policy, key, v)
	}
	return b, nil
}

var sizeSuffixes = []struct {
	suffix string
	mult   uint64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
	{"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"T", 1 << 40},
	{"B", 1},
}

// ParseSize parses a size in bytes: plain digits ("4194304000"), or a
// number with a binary (KiB, MiB, GiB, TiB; K, M, G, T) or decimal (KB, MB,
// GB, TB) suffix ("4000MiB", "24GiB", "1.5GiB"). It returns an error for
// anything else, including sizes that overflow 64 bits.
func ParseSize(s string) (uint64, error) {
	t := strings.TrimSpace(s)
	mult := uint64(1)
	for _, sf := range sizeSuffixes {
		if strings.HasSuffix(t, sf.suffix) {
			t = strings.TrimSpace(strings.TrimSuffix(t, sf.suffix))
			mult = sf.mult
			break
		}
	}
	if t == "" {
		return 0, fmt.Errorf("bad size %q", s)
	}
	if n, err := strconv.ParseUint(t, 10, 64); err == nil {
		if mult > 1 && n > ^uint64(0)/mult {
			return 0, fmt.Errorf("size %q overflows 64 bits", s)
		}
		return n * mult, nil
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || f < 0 || f != f {
		return 0, fmt.Errorf("bad size %q (want bytes or a number with KiB, MiB, GiB)", s)
	}
	v := f * float64(mult)
	if v >= 1<<64 {
		return 0, fmt.Errorf("size %q overflows 64 bits", s)
	}
	return uint64(v), nil
}

// ParseCapacity parses a device capacity in bytes as ParseSize does, but
// refuses a plain number other than 0 under 1 MiB without a unit ("24": most
// likely 24 GiB meant, and a replay under 24 bytes runs out of memory at
// every malloc); such a capacity is written with its unit ("24B", "24GiB").
// 0 (no capacity) is taken as it is.
func ParseCapacity(s string) (uint64, error) {
	b, err := ParseSize(s)
	if err != nil {
		return 0, err
	}
	t := strings.TrimSpace(s)
	if bare, zero := strings.TrimLeft(t, "0123456789.") == "", strings.Trim(t, "0.") == ""; bare && !zero && b < 1<<20 {
		return 0, fmt.Errorf("%q is less than 1 MiB in bytes: give a unit (%sGiB, %sMiB), or %sB for bytes", s, t, t, t)
	}
	return b, nil
}

// SplitList splits a comma-separated list of values, keeping commas inside
// brackets ("[64:8,256:4]", as in roundup_power2_divisions) and dropping
// empty items; each item is trimmed of spaces.
func SplitList(s string) []string {
	var out []string
	depth, start := 0, 0
	for i, r := range s {
		switch r {
		case '[', '(', '{':
			depth++
		case ']', ')', '}':
			depth--
		case ',':
			if depth == 0 {
				if v := strings.TrimSpace(s[start:i]); v != "" {
					out = append(out, v)
				}
				start = i + 1
			}
		}
	}
	if v := strings.TrimSpace(s[start:]); v != "" {
		out = append(out, v)
	}
	return out
}

// ParseList expands a comma-separated list of names (a --policy value),
// where "all" stands for every name of known but the registered policies
// marked Explicit (optimal: "all,optimal" adds it), into the names in the
// order given without duplicates. It returns an error for a name not in known and for a list
// that names none.
func ParseList(list string, known []string) ([]string, error) {
	var names []string
	seen := map[string]bool{}
	for _, n := range strings.Split(list, ",") {
		n = strings.TrimSpace(n)
		if n == "all" {
			for _, k := range known {
				if in, ok := Lookup(k); (!ok || !in.Explicit) && !seen[k] {
					seen[k] = true
					names = append(names, k)
				}
			}
			continue
		}
		if n == "" || seen[n] {
			continue
		}
		if !slices.Contains(known, n) {
			if _, _, scheme := schemeOf(n); scheme {
				if err := Known(n); err != nil {
					return nil, err
				}
			} else {
				return nil, fmt.Errorf("unknown policy %q (%sknown: %s)", n, didYouMean(n, known), strings.Join(known, ", "))
			}
		}
		seen[n] = true
		names = append(names, n)
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("no policy named")
	}
	return names, nil
}

// ParseSets turns settings given as NAME.key=value (--set, repeatable)
// into the settings of each policy by name; a later value of a key
// replaces an earlier one. It returns an error quoting the setting for one
// not of that form, of a name not in known, or of a policy not among names
// (the policies replayed).
func ParseSets(sets []string, known, names []string) (map[string]Settings, error) {
	out := map[string]Settings{}
	for _, s := range sets {
		lhs, val, ok := strings.Cut(s, "=")
		name, key, ok2 := strings.Cut(lhs, ".")
		switch {
		case !ok || !ok2 || name == "" || key == "":
			return nil, fmt.Errorf("%q: want NAME.key=value", s)
		case !slices.Contains(known, name):
			return nil, fmt.Errorf("%q: unknown policy %q (%sknown: %s)", s, name, didYouMean(name, known), strings.Join(known, ", "))
		case !slices.Contains(names, name):
			return nil, fmt.Errorf("%q: policy %s is not among those replayed (--policy)", s, name)
		}
		if out[name] == nil {
			out[name] = Settings{}
		}
		out[name][key] = val
	}
	for name, set := range out {
		if err := CheckSettings(name, set); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
	}
	return out, nil
}

// CheckSettings builds the registered policy name with settings s on a
// scratch device, so that a setting it does not know or a value it
// refuses is found before any replay: it returns the error New would (a
// policy not in the registry, a GPU target, is not checked). An OOM of a
// policy that takes memory up front is no error of its settings.
func CheckSettings(name string, s Settings) error {
	if _, ok := Lookup(name); !ok {
		return nil
	}
	_, err := New(name, &scratchDevice{next: 1 << 40}, s)
	if err != nil && !errors.Is(err, ErrOutOfMemory) {
		return err
	}
	return nil
}

// scratchDevice is a device (and Mapper) of unlimited memory that hands
// out addresses and forgets them, for CheckSettings.
type scratchDevice struct{ next uint64 }

func (d *scratchDevice) Alloc(size uint64) (uint64, error) {
	addr := d.next
	d.next += (size + 1<<21 - 1) &^ (1<<21 - 1)
	return addr, nil
}

func (d *scratchDevice) Free(uint64) error                   { return nil }
func (d *scratchDevice) Reserve(size uint64) (uint64, error) { return d.Alloc(size) }
func (d *scratchDevice) Map(addr, size uint64) error         { return nil }
func (d *scratchDevice) Unmap(addr, size uint64) error       { return nil }
func (d *scratchDevice) Release(addr uint64) error           { return nil }

// CardMemory makes it a card (CardMemorier) for the policies that size
// themselves by one: the real replay's card or capacity says how large.
func (d *scratchDevice) CardMemory() uint64 { return 1 << 40 }

// didYouMean returns "did you mean "NAME"? " for the name of known nearest
// to name in spelling (spell.Suggest), "" if none is near.
func didYouMean(name string, known []string) string {
	if s := spell.Suggest(name, known); s != "" {
		return fmt.Sprintf("did you mean %q? ", s)
	}
	return ""
}

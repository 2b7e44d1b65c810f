package policies

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
)

// This file holds what the registry knows of each policy without building
// it: the design it follows, its settings with their defaults, and its
// optional abilities, so that a caller asks a question of the registry
// rather than of a policy built on a throwaway device.

// Info describes a registered policy as plain data.
type Info struct {
	// Name is the registry name (--policy NAME).
	Name string `json:"name"`
	// Design is the allocator the policy follows, in one line: the real
	// allocator and the source file it copies, where it copies one.
	Design string `json:"design"`
	// Settings are the keys the policy's factory accepts (--set
	// NAME.key=value), in the order the policy documents them.
	Settings []Setting `json:"settings"`
	// Abilities are the optional interfaces the policy implements.
	Abilities Abilities `json:"abilities"`
	// Explicit leaves the policy out of --policy all: it runs when named
	// (all,NAME). Set for a search that may run for its time limit on
	// each trace (optimal), which would make every default replay wait.
	Explicit bool `json:"explicit,omitempty"`
}

// Setting describes one key of a policy's settings.
type Setting struct {
	// Key is the part after "NAME." in --set NAME.key=value.
	Key string `json:"key"`
	// Default is the value the policy takes when the key is unset, as
	// --set writes it ("512", "32MiB", "true"), unless Derived.
	Default string `json:"default"`
	// Derived is set when no value of the key gives the default: it is
	// worked out from the device (its capacity) or is a state that only
	// leaving the key unset gives (no limit, off). Default then describes
	// it in words.
	Derived bool `json:"derived,omitempty"`
	// Doc is what the setting does, in one line, with its units.
	Doc string `json:"doc"`
}

// Abilities are the optional interfaces of a policy, which a replay engine
// finds by type assertion on the policy it built.
type Abilities struct {
	// Planner: the policy is clairvoyant and plans from the whole trace
	// before the first malloc (Planner).
	Planner bool `json:"planner"`
	// Hinter: the policy sizes itself from the trace's peak of live
	// requested bytes given before the first event (Hinter).
	Hinter bool `json:"hinter"`
	// Marker: the policy acts on the trace's markers (Marker).
	Marker bool `json:"marker"`
	// Syncer: the policy acts on stream, event and device
	// synchronizations (Syncer).
	Syncer bool `json:"syncer"`
	// Releaser: the policy gives cached memory back on request,
	// torch.cuda.empty_cache() (Releaser).
	Releaser bool `json:"releaser"`
	// Follower: the policy follows recordings of its own allocator, to
	// replay them as recorded (Follower).
	Follower bool `json:"follower"`
	// TieFollower: replaying a recording as recorded, the policy takes
	// the block the recording names among equally good ones (TieFollower).
	TieFollower bool `json:"tie_follower,omitempty"`
	// FreeSpacer: the policy reports its free space, for the external
	// fragmentation metric (FreeSpacer).
	FreeSpacer bool `json:"free_spacer"`
	// Counter: the policy counts its allocation retries (Counter).
	Counter bool `json:"counter"`
	// Pooler: the policy keeps private pools apart (Pooler).
	Pooler bool `json:"pooler"`
	// MapperSetting is the setting that, when on, needs a Device that is a
	// Mapper (pytorch's expandable_segments); empty when none does.
	MapperSetting string `json:"mapper_setting,omitempty"`
}

// List returns the names of the abilities that are set, in the order of
// the fields of Abilities; a MapperSetting reads "needs a Mapper for KEY".
func (a Abilities) List() []string {
	var out []string
	for _, f := range []struct {
		on   bool
		name string
	}{
		{a.Planner, "planner (clairvoyant)"},
		{a.Hinter, "hinter"},
		{a.Marker, "marker"},
		{a.Syncer, "syncer"},
		{a.Releaser, "releaser (empty_cache)"},
		{a.Follower, "follows recordings"},
		{a.TieFollower, "follows recorded ties"},
		{a.FreeSpacer, "free space"},
		{a.Counter, "retries"},
		{a.Pooler, "private pools"},
	} {
		if f.on {
			out = append(out, f.name)
		}
	}
	if a.MapperSetting != "" {
		out = append(out, "needs a Mapper for "+a.MapperSetting)
	}
	return out
}

// Lookup returns the Info of the policy called name, and false for a name
// that is not registered.
func Lookup(name string) (Info, bool) {
	e, ok := registry[name]
	if !ok {
		if sc, arg, ok := schemeOf(name); ok {
			if in, err := sc.Info(arg); err == nil {
				in.Name = name
				return in.clone(), true
			}
		}
		return Info{}, false
	}
	return e.info.clone(), true
}

// Infos returns the Info of every registered policy, sorted by name.
func Infos() []Info {
	out := make([]Info, 0, len(registry))
	for _, n := range Names() {
		out = append(out, registry[n].info.clone())
	}
	return out
}

// clone returns a copy of i that shares no slice with the registry.
func (i Info) clone() Info {
	i.Settings = slices.Clone(i.Settings)
	return i
}

// Keys returns the setting keys of i, in its order.
func (i Info) Keys() []string {
	keys := make([]string, len(i.Settings))
	for k, s := range i.Settings {
		keys[k] = s.Key
	}
	return keys
}

// Defaults returns the settings that set every key of i whose default is
// not Derived to that default: for a policy, the same as no settings.
func (i Info) Defaults() Settings {
	s := Settings{}
	for _, st := range i.Settings {
		if !st.Derived {
			s[st.Key] = st.Default
		}
	}
	return s
}

// WriteTable writes infos to w as text: for each policy a line with its
// name and design, a line of its abilities, and a table of its settings, a
// line each with key=default (a Derived default in parentheses) and the
// doc. It returns w's error.
func WriteTable(w io.Writer, infos []Info) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for k, in := range infos {
		if k > 0 {
			fmt.Fprintln(tw)
		}
		fmt.Fprintf(tw, "%s: %s\n", in.Name, in.Design)
		if ab := in.Abilities.List(); len(ab) > 0 {
			fmt.Fprintf(tw, "  abilities: %s\n", strings.Join(ab, ", "))
		}
		if in.Explicit {
			fmt.Fprintf(tw, "  not in --policy all: name it (all,%s)\n", in.Name)
		}
		if len(in.Settings) == 0 {
			fmt.Fprintf(tw, "  no settings\n")
		}
		for _, s := range in.Settings {
			def := s.Default
			switch {
			case s.Derived:
				def = "(" + def + ")"
			case def == "":
				def = `""`
			}
			fmt.Fprintf(tw, "  %s=%s\t%s\n", s.Key, def, s.Doc)
		}
	}
	return tw.Flush()
}

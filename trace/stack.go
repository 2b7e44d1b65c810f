package trace

import (
	"encoding/binary"
	"strconv"
	"strings"
)

// Frame is one frame of a call stack: the function Name running at Line of
// File (a PyTorch snapshot's frame: name, filename, line).
type Frame struct {
	Name string
	File string
	Line int64
}

// String returns the frame as PyTorch's memory viewer prints it:
// FILE:LINE:NAME.
func (f Frame) String() string {
	return f.File + ":" + strconv.FormatInt(f.Line, 10) + ":" + f.Name
}

// ParseFrame parses a frame written as FILE:LINE:NAME (Frame.String): the
// file ends at the first colon followed by a decimal line and a colon, and
// the name is the rest.
func ParseFrame(s string) (Frame, bool) {
	for i := 0; i < len(s); i++ {
		if s[i] != ':' {
			continue
		}
		j := i + 1
		for j < len(s) && s[j] >= '0' && s[j] <= '9' {
			j++
		}
		if j == i+1 || j >= len(s) || s[j] != ':' {
			continue
		}
		line, err := strconv.ParseInt(s[i+1:j], 10, 64)
		if err != nil {
			return Frame{}, false
		}
		return Frame{File: s[:i], Line: line, Name: s[j+1:]}, true
	}
	return Frame{}, false
}

// Stacks is a table of the call stacks of a trace's mallocs
// (Event.Stack), each kept once: a stack is a list of frames, innermost
// first (the frame that called the allocator first), and each distinct
// frame is kept once too. Stack 0 is "no stack recorded"; the others are
// numbered from 1 in the order they were added, and frames from 0. A
// table only grows: an id, once given, names the same stack for good.
//
// Sources that carry stacks return their table through StackSource; it
// fills as their events are read, and holds every stack an event already
// returned names. A Stacks is not safe for concurrent use.
type Stacks struct {
	frames  []Frame
	frameID map[Frame]uint32
	// Stack k (from 1) is ids[ends[k-2]:ends[k-1]] (ends[-1] being 0).
	ends  []uint32
	ids   []uint32
	byKey map[string]uint32
	key   []byte
}

// NewStacks returns an empty table.
func NewStacks() *Stacks {
	return &Stacks{frameID: map[Frame]uint32{}, byKey: map[string]uint32{}}
}

// Len returns the number of stacks, the largest stack id.
func (s *Stacks) Len() int {
	if s == nil {
		return 0
	}
	return len(s.ends)
}

// NumFrames returns the number of distinct frames, one more than the
// largest frame id.
func (s *Stacks) NumFrames() int {
	if s == nil {
		return 0
	}
	return len(s.frames)
}

// AddFrame returns the id of frame f, adding it if it is new.
func (s *Stacks) AddFrame(f Frame) uint32 {
	if id, ok := s.frameID[f]; ok {
		return id
	}
	id := uint32(len(s.frames))
	s.frames = append(s.frames, f)
	s.frameID[f] = id
	return id
}

// Frame returns the frame of id fid, which must be below NumFrames.
func (s *Stacks) Frame(fid uint32) Frame { return s.frames[fid] }

// Add returns the id of the stack of frames fids (frame ids, innermost
// first), adding it if it is new; an empty list is stack 0. The ids must be
// below NumFrames. fids is not kept.
func (s *Stacks) Add(fids []uint32) uint32 {
	if len(fids) == 0 {
		return 0
	}
	s.key = s.key[:0]
	for _, f := range fids {
		s.key = binary.AppendUvarint(s.key, uint64(f))
	}
	if id, ok := s.byKey[string(s.key)]; ok {
		return id
	}
	s.ids = append(s.ids, fids...)
	s.ends = append(s.ends, uint32(len(s.ids)))
	id := uint32(len(s.ends))
	s.byKey[string(s.key)] = id
	return id
}

// AddFrames returns the id of the stack of frames fs, innermost first,
// adding the frames and the stack where they are new.
func (s *Stacks) AddFrames(fs []Frame) uint32 {
	fids := make([]uint32, len(fs))
	for k, f := range fs {
		fids[k] = s.AddFrame(f)
	}
	return s.Add(fids)
}

// FrameIDs returns the frame ids of stack id, innermost first: nil for 0
// or an id above Len. The slice is the table's own, not to be changed.
func (s *Stacks) FrameIDs(id uint32) []uint32 {
	if s == nil || id == 0 || int(id) > len(s.ends) {
		return nil
	}
	start := uint32(0)
	if id > 1 {
		start = s.ends[id-2]
	}
	return s.ids[start:s.ends[id-1]:s.ends[id-1]]
}

// Frames returns the frames of stack id, innermost first, in a new slice:
// nil for 0 or an id above Len.
func (s *Stacks) Frames(id uint32) []Frame {
	fids := s.FrameIDs(id)
	if fids == nil {
		return nil
	}
	out := make([]Frame, len(fids))
	for k, f := range fids {
		out[k] = s.frames[f]
	}
	return out
}

// StackSource is a Source whose events name call stacks (Event.Stack):
// Stacks returns its table, which holds every stack named by an event
// already returned by Next (nil when the source has none).
type StackSource interface {
	Source
	Stacks() *Stacks
}

// StacksOf returns the stack table of src, nil when it has none.
func StacksOf(src Source) *Stacks {
	if ss, ok := src.(StackSource); ok {
		return ss.Stacks()
	}
	return nil
}

// formatStack returns the text form's line for stack id of s: "stack
// id=N frame=FILE:LINE:NAME ...", the frames innermost first.
func formatStack(s *Stacks, id uint32) string {
	var b strings.Builder
	b.WriteString("stack id=")
	b.WriteString(strconv.FormatUint(uint64(id), 10))
	for _, f := range s.FrameIDs(id) {
		b.WriteString(" frame=")
		b.WriteString(quoteIfNeeded(s.frames[f].String()))
	}
	return b.String()
}

package interpose

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/gpualloc/allocsim/trace"
)

// image is one raw file: a process image (a process until it execs, or a
// forked child).
type image struct {
	path string
	hdr  header
	maps []mapping // nil when the image left no memory map
}

// Process is the recording of one process: its images in order (more than
// one when it called exec).
type Process struct {
	Pid, Ppid int
	images    []*image
}

// Command returns the command line of the process's last image.
func (p *Process) Command() string {
	last := p.images[len(p.images)-1].hdr
	return commandLine(last.Exe, last.Args)
}

func commandLine(exe string, args []string) string {
	if len(args) == 0 {
		return exe
	}
	q := make([]string, len(args))
	for i, a := range args {
		if a == "" || strings.ContainsAny(a, " \t\n\"'\\$") {
			a = strconv.Quote(a)
		}
		q[i] = a
	}
	return strings.Join(q, " ")
}

// Rank returns the process's RANK as its launcher set it (torchrun and its
// kind: the last image's environment), -1 when unset.
func (p *Process) Rank() int { return p.images[len(p.images)-1].hdr.Rank }

// start returns the CLOCK_MONOTONIC time the process's first image started.
func (p *Process) start() int64 { return p.images[0].hdr.StartMono }

// Scan reads the raw files in dir and groups them by process, in the order
// the processes started.
func Scan(dir string) ([]*Process, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.raw"))
	if err != nil {
		return nil, err
	}
	byPid := map[uint32]*Process{}
	for _, path := range paths {
		h, err := readHeader(path)
		if err != nil {
			return nil, err
		}
		im := &image{path: path, hdr: h}
		if m, err := readMaps(path + ".maps"); err == nil {
			im.maps = m
		}
		p := byPid[h.Pid]
		if p == nil {
			p = &Process{Pid: int(h.Pid), Ppid: int(h.Ppid)}
			byPid[h.Pid] = p
		}
		p.images = append(p.images, im)
	}
	var out []*Process
	for _, p := range byPid {
		sort.Slice(p.images, func(i, j int) bool { return p.images[i].hdr.StartMono < p.images[j].hdr.StartMono })
		// A pid's first image names its parent.
		p.Ppid = int(p.images[0].hdr.Ppid)
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].start() < out[j].start() })
	return out, nil
}

// mapping is one line of /proc/PID/maps with a file behind it.
type mapping struct {
	start, end, offset uint64
	path               string
}

func readMaps(path string) ([]mapping, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []mapping
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// start-end perms offset dev inode path
		fs := strings.Fields(sc.Text())
		if len(fs) < 6 || !strings.HasPrefix(fs[5], "/") {
			continue
		}
		lo, hi, ok := strings.Cut(fs[0], "-")
		if !ok {
			continue
		}
		s, err1 := strconv.ParseUint(lo, 16, 64)
		e, err2 := strconv.ParseUint(hi, 16, 64)
		off, err3 := strconv.ParseUint(fs[2], 16, 64)
		if err1 != nil || err2 != nil || err3 != nil {
			continue
		}
		out = append(out, mapping{s, e, off, strings.Join(fs[5:], " ")})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].start < out[j].start })
	return out, sc.Err()
}

// site names a code address as module+0xoffset (the offset in the file,
// which addr2line takes for position-independent code), or 0xADDR when the
// map does not cover it.
func site(maps []mapping, addr uint64) string {
	i := sort.Search(len(maps), func(i int) bool { return maps[i].end > addr })
	if i < len(maps) && maps[i].start <= addr {
		m := maps[i]
		return fmt.Sprintf("%s+%#x", filepath.Base(m.path), addr-m.start+m.offset)
	}
	return fmt.Sprintf("%#x", addr)
}

// counts are the calls of a process by api, found by a first pass.
type counts struct {
	calls, failed map[string]uint64
	dropped       uint64
	unwrapped     uint64
}

func (p *Process) count() (counts, error) {
	c := counts{calls: map[string]uint64{}, failed: map[string]uint64{}}
	for _, im := range p.images {
		c.dropped += im.hdr.Dropped
		c.unwrapped += im.hdr.Unwrapped
		rr, err := openRecords(im.path)
		if err != nil {
			return c, err
		}
		for {
			r, err := rr.next()
			if err == io.EOF {
				break
			}
			if err != nil {
				rr.close()
				return c, err
			}
			a, ok := apis[r.API]
			if !ok {
				rr.close()
				return c, fmt.Errorf("%s: unknown api %d in a record", im.path, r.API)
			}
			c.calls[a.name]++
			if r.RC != 0 {
				c.failed[a.name]++
			}
		}
		rr.close()
	}
	return c, nil
}

// Source returns the process's events as a trace source. Times are
// nanoseconds since t0 (a CLOCK_MONOTONIC time, the same for all processes
// of a recording, so that their traces line up), made non-decreasing.
// meta is added to the header's metadata, card names the GPU in it.
//
// Each call becomes one event: a successful allocation a malloc (of the
// memory kind of the function; its label is the function and the call
// site, "cudaMalloc@prog+0x11a9"), a failed one a malloc_failed, a free a
// free, the synchronizations and event calls their ops. A failed free or
// synchronization did nothing and becomes a marker naming the call and its
// error. A malloc of 0 bytes (no memory, a NULL pointer) and a free of
// NULL are no-ops and left out. Stream 0x1 (the legacy default stream) is
// written as 0; stream 0 of a per-thread-stream call as 0x2
// (cudaStreamPerThread). When the process called exec, each later image
// starts with a marker "exec COMMAND".
//
// The virtual memory API: a cuMemMap is a device malloc of the bytes it
// maps at the address it maps them (PyTorch's expandable segments map one
// page per call, XLA one buffer), a cuMemUnmap the free of each mapping
// inside the range it unmaps (a marker where it takes part of one); a
// cuMemCreate refused for lack of memory (CUDA_ERROR_OUT_OF_MEMORY) is the
// malloc that failed, one failed otherwise a marker (PyTorch tries a
// handle type that the driver may not support, then another); the other
// calls (cuMemAddressReserve and Free, cuMemCreate, cuMemRelease,
// cuMemSetAccess: one per map of PyTorch's expandable segments, over its
// pages) are counted in the header's metadata only. A pool trimmed
// (cudaMemPoolTrimTo, cuMemPoolTrimTo) is a marker.
func (p *Process) Source(t0 int64, meta map[string]string, card Card) (trace.Source, error) {
	c, err := p.count()
	if err != nil {
		return nil, err
	}
	first := p.images[0].hdr
	h := trace.Header{Source: "record", Device: card.Name, DeviceMemory: card.Memory, Metadata: map[string]string{
		"pid":     strconv.Itoa(p.Pid),
		"ppid":    strconv.Itoa(p.Ppid),
		"command": p.Command(),
		"start":   time.Unix(0, first.StartReal).UTC().Format(time.RFC3339Nano),
	}}
	for k, v := range c.calls {
		h.Metadata["calls."+k] = strconv.FormatUint(v, 10)
	}
	for k, v := range c.failed {
		h.Metadata["failed."+k] = strconv.FormatUint(v, 10)
	}
	if c.dropped > 0 {
		h.Metadata["dropped"] = strconv.FormatUint(c.dropped, 10)
	}
	if c.unwrapped > 0 {
		h.Metadata["unwrapped"] = strconv.FormatUint(c.unwrapped, 10)
	}
	last := p.images[len(p.images)-1].hdr
	for k, v := range map[string]int{"rank": last.Rank, "local_rank": last.LocalRank, "world_size": last.WorldSize} {
		if v >= 0 {
			h.Metadata[k] = strconv.Itoa(v)
		}
	}
	if last.VisibleDevices != "" {
		h.Metadata["cuda_visible_devices"] = last.VisibleDevices
	}
	for k, v := range meta {
		h.Metadata[k] = v
	}
	return &source{p: p, h: h, t0: t0, last: -1 << 63}, nil
}

// source streams a process's records as events.
type source struct {
	p    *Process
	h    trace.Header
	t0   int64
	img  int // index of the next image to open
	rr   *recordReader
	maps []mapping
	last int64
	// mapped holds the live cuMemMap mappings by address (their sizes);
	// queue the events of an unmap that took several away.
	mapped map[uint64]uint64
	queue  []trace.Event
	// Graph captures: the capture under way on each stream and the one of
	// each graph made, by their numbers (from 1), which are the private
	// pools of their stream-ordered mallocs.
	captures map[uint64]uint32
	graphs   map[uint64]uint32
	nCapture uint32
}

func (s *source) Header() trace.Header { return s.h }

func (s *source) Next() (trace.Event, error) {
	for {
		if len(s.queue) > 0 {
			ev := s.queue[0]
			s.queue = s.queue[1:]
			return ev, nil
		}
		if s.rr == nil {
			if s.img >= len(s.p.images) {
				return trace.Event{}, io.EOF
			}
			im := s.p.images[s.img]
			s.img++
			rr, err := openRecords(im.path)
			if err != nil {
				return trace.Event{}, err
			}
			s.rr, s.maps = rr, im.maps
			if s.img > 1 {
				return trace.Event{Op: trace.OpMarker, Time: s.clamp(im.hdr.StartMono),
					Label: "exec " + commandLine(im.hdr.Exe, im.hdr.Args)}, nil
			}
		}
		r, err := s.rr.next()
		if err == io.EOF {
			s.rr.close()
			s.rr = nil
			continue
		}
		if err != nil {
			return trace.Event{}, err
		}
		if ev, ok := s.event(r); ok {
			return ev, nil
		}
	}
}

func (s *source) clamp(t int64) int64 {
	t -= s.t0
	if t < s.last {
		t = s.last
	}
	s.last = t
	return t
}

// cudaErrorOutOfMemory is CUDA_ERROR_OUT_OF_MEMORY (and the runtime's
// cudaErrorMemoryAllocation).
const cudaErrorOutOfMemory = 2

// event converts one record; false for a no-op.
func (s *source) event(r record) (trace.Event, bool) {
	a := apis[r.API]
	stream := r.Stream
	switch {
	case stream == streamLegacy:
		stream = 0
	case stream == 0 && r.Flags&flagPTSZ != 0:
		stream = streamPerThread
	}
	ev := trace.Event{Time: s.clamp(r.Time), Thread: uint64(r.Tid), Stream: stream}
	if r.RC != 0 && a.class != classMalloc && (a.class != classCreate || r.RC != cudaErrorOutOfMemory) {
		ev.Op, ev.Addr, ev.Stream = trace.OpMarker, r.Addr, 0
		ev.Label = fmt.Sprintf("%s failed: error %d", a.name, r.RC)
		return ev, true
	}
	switch a.class {
	case classMalloc:
		if r.RC == 0 && r.Addr == 0 {
			return ev, false
		}
		ev.Op, ev.Kind, ev.Size, ev.Addr = trace.OpMalloc, a.kind, r.Size, r.Addr
		if r.RC != 0 {
			ev.Op, ev.Addr = trace.OpMallocFailed, 0
		}
		if r.Caller != 0 {
			ev.Label = a.name + "@" + site(s.maps, r.Caller)
		}
		if a.kind != trace.KindAsync {
			ev.Stream = 0
		} else if ev.Op == trace.OpMalloc {
			// Captured, it is graph memory: the capture's pool.
			ev.Pool = s.captures[stream]
		}
	case classFree:
		if r.Addr == 0 {
			return ev, false
		}
		ev.Op, ev.Addr = trace.OpFree, r.Addr
		if a.kind != trace.KindAsync {
			ev.Stream = 0
		}
	case classStreamSync:
		ev.Op = trace.OpStreamSync
	case classDeviceSync:
		ev.Op, ev.Stream = trace.OpDeviceSync, 0
	case classEventRecord:
		ev.Op, ev.Addr = trace.OpEventRecord, r.Addr
	case classStreamWaitEvent:
		ev.Op, ev.Addr = trace.OpStreamWaitEvent, r.Addr
	case classEventSync:
		ev.Op, ev.Addr, ev.Stream = trace.OpEventSync, r.Addr, 0
	case classMap:
		ev.Stream = 0
		ev.Op, ev.Kind, ev.Size, ev.Addr = trace.OpMalloc, a.kind, r.Size, r.Addr
		if s.mapped == nil {
			s.mapped = map[uint64]uint64{}
		}
		s.mapped[r.Addr] = r.Size
		if r.Caller != 0 {
			ev.Label = a.name + "@" + site(s.maps, r.Caller)
		}
	case classUnmap:
		return s.unmap(ev, r.Addr, r.Size)
	case classVMM:
		return ev, false
	case classCreate:
		if r.RC == 0 {
			return ev, false
		}
		ev.Op, ev.Kind, ev.Size, ev.Stream = trace.OpMallocFailed, a.kind, r.Size, 0
		if r.Caller != 0 {
			ev.Label = a.name + "@" + site(s.maps, r.Caller)
		}
	case classTrim:
		ev.Op, ev.Stream = trace.OpMarker, 0
		ev.Label = fmt.Sprintf("%s of pool %#x to %d bytes", a.name, r.Addr, r.Size)
	case classCaptureBegin:
		if s.captures == nil {
			s.captures, s.graphs = map[uint64]uint32{}, map[uint64]uint32{}
		}
		s.nCapture++
		s.captures[stream] = s.nCapture
		ev.Op = trace.OpMarker
		ev.Label = fmt.Sprintf("%s: capture %d of stream %#x (mode %d)", a.name, s.nCapture, stream, r.Aux)
	case classCaptureEnd:
		n := s.captures[stream]
		delete(s.captures, stream)
		if n != 0 && r.Addr != 0 {
			s.graphs[r.Addr] = n
		}
		ev.Op, ev.Addr = trace.OpMarker, r.Addr
		ev.Label = fmt.Sprintf("%s: capture %d of stream %#x ends: graph %#x", a.name, n, stream, r.Addr)
	case classGraphDestroy:
		ev.Stream = 0
		if n := s.graphs[r.Addr]; n != 0 {
			// Its graph memory is no private pool's any more.
			delete(s.graphs, r.Addr)
			ev.Op, ev.Pool = trace.OpPoolRelease, n
			return ev, true
		}
		ev.Op, ev.Addr = trace.OpMarker, r.Addr
		ev.Label = fmt.Sprintf("%s of graph %#x", a.name, r.Addr)
	}
	return ev, true
}

// unmap converts a cuMemUnmap of [addr, addr+size): a free of each mapping
// inside it, in address order (the first returned, the others queued); a
// marker where it takes part of a mapping or nothing mapped.
func (s *source) unmap(ev trace.Event, addr, size uint64) (trace.Event, bool) {
	ev.Stream = 0
	var in []uint64
	partial := false
	for a, n := range s.mapped {
		switch {
		case a >= addr && a+n <= addr+size:
			in = append(in, a)
		case a < addr+size && addr < a+n:
			partial = true
		}
	}
	if partial || len(in) == 0 {
		ev.Op, ev.Addr = trace.OpMarker, addr
		ev.Label = fmt.Sprintf("cuMemUnmap of %d bytes: no whole mapping", size)
		if partial {
			ev.Label = fmt.Sprintf("cuMemUnmap of %d bytes: part of a mapping", size)
		}
		return ev, true
	}
	sort.Slice(in, func(i, j int) bool { return in[i] < in[j] })
	for _, a := range in {
		delete(s.mapped, a)
		f := ev
		f.Op, f.Addr = trace.OpFree, a
		s.queue = append(s.queue, f)
	}
	first := s.queue[0]
	s.queue = s.queue[1:]
	return first, true
}

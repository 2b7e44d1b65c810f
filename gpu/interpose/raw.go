// Package interpose records the CUDA allocation calls of any program: Run
// starts the program with the LD_PRELOAD library built from
// preload/interpose.c, which writes one raw file per process image, and
// converts those files to native traces, one per process.
//
// The library sees a program whatever its runtime linkage: a dynamically
// linked CUDA runtime (PyTorch) through the runtime's symbols, a statically
// linked one (nvcc's default) through the driver entry points that
// cuGetProcAddress hands out. See preload/interpose.c for the mechanism.
//
// CUDA graph capture is recorded too: a capture's begin and end are markers
// that number the capture, a stream-ordered malloc on a stream while it is
// captured is graph memory, in the capture's private pool (trace.Event.Pool,
// the capture's number), and the destruction of the capture's graph is
// that pool's release (trace.OpPoolRelease).
package interpose

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/gpualloc/allocsim/trace"
)

// The raw file written by the preload library (see preload/interpose.c):
// a 4096-byte header page, then 64-byte records.
const (
	rawMagic   = "ALLOCREC"
	rawVersion = 1
	rawHeader  = 4096
	recordSize = 64
)

// ErrNotRaw is returned for a file that is not a raw recording.
var ErrNotRaw = errors.New("not a raw recording of the interposer")

// class is what a recorded call does to the trace.
type class uint8

const (
	classMalloc class = iota + 1
	classFree
	classStreamSync
	classDeviceSync
	classEventRecord
	classStreamWaitEvent
	classEventSync
	// classMap is a cuMemMap: device memory mapped into a reserved range,
	// a malloc of the trace; classUnmap a cuMemUnmap, the frees of the
	// mappings it takes away.
	classMap
	classUnmap
	// classVMM is a call of the virtual memory API that neither maps nor
	// unmaps (a range reserved or freed, physical memory created or
	// released): counted, no event.
	classVMM
	// classTrim is a memory pool trimmed: a marker.
	classTrim
	// classCreate is a cuMemCreate: physical memory for a mapping, no
	// event; when the driver refuses the memory
	// (CUDA_ERROR_OUT_OF_MEMORY), the malloc that failed.
	classCreate
	// classCaptureBegin and classCaptureEnd are a CUDA graph capture of a
	// stream begun and ended (the graph made), classGraphDestroy a graph
	// destroyed: markers, and the private pool of the capture's
	// stream-ordered mallocs (graph memory) and its release.
	classCaptureBegin
	classCaptureEnd
	classGraphDestroy
)

// api describes one intercepted function.
type api struct {
	name  string
	class class
	kind  trace.Kind
}

// apis are the intercepted functions by the numbers the preload library
// writes (its A_* enum).
var apis = map[uint32]api{
	1:  {"cudaMalloc", classMalloc, trace.KindDevice},
	2:  {"cudaFree", classFree, trace.KindDevice},
	3:  {"cudaMallocAsync", classMalloc, trace.KindAsync},
	4:  {"cudaMallocFromPoolAsync", classMalloc, trace.KindAsync},
	5:  {"cudaFreeAsync", classFree, trace.KindAsync},
	6:  {"cudaMallocHost", classMalloc, trace.KindPinned},
	7:  {"cudaHostAlloc", classMalloc, trace.KindPinned},
	8:  {"cudaFreeHost", classFree, trace.KindPinned},
	9:  {"cudaMallocManaged", classMalloc, trace.KindManaged},
	10: {"cudaStreamSynchronize", classStreamSync, 0},
	11: {"cudaDeviceSynchronize", classDeviceSync, 0},
	12: {"cudaEventRecord", classEventRecord, 0},
	13: {"cudaStreamWaitEvent", classStreamWaitEvent, 0},
	14: {"cudaEventSynchronize", classEventSync, 0},
	15: {"cudaEventRecordWithFlags", classEventRecord, 0},
	16: {"cudaMemPoolTrimTo", classTrim, 0},
	17: {"cudaStreamBeginCapture", classCaptureBegin, 0},
	18: {"cudaStreamEndCapture", classCaptureEnd, 0},
	19: {"cudaGraphDestroy", classGraphDestroy, 0},
	21: {"cuMemAlloc", classMalloc, trace.KindDevice},
	22: {"cuMemFree", classFree, trace.KindDevice},
	23: {"cuMemAllocAsync", classMalloc, trace.KindAsync},
	24: {"cuMemAllocFromPoolAsync", classMalloc, trace.KindAsync},
	25: {"cuMemFreeAsync", classFree, trace.KindAsync},
	26: {"cuMemAllocHost", classMalloc, trace.KindPinned},
	27: {"cuMemHostAlloc", classMalloc, trace.KindPinned},
	28: {"cuMemFreeHost", classFree, trace.KindPinned},
	29: {"cuMemAllocManaged", classMalloc, trace.KindManaged},
	30: {"cuStreamSynchronize", classStreamSync, 0},
	31: {"cuCtxSynchronize", classDeviceSync, 0},
	32: {"cuEventRecord", classEventRecord, 0},
	33: {"cuStreamWaitEvent", classStreamWaitEvent, 0},
	34: {"cuEventSynchronize", classEventSync, 0},
	35: {"cuEventRecordWithFlags", classEventRecord, 0},
	36: {"cuMemAddressReserve", classVMM, 0},
	37: {"cuMemAddressFree", classVMM, 0},
	38: {"cuMemCreate", classCreate, trace.KindDevice},
	39: {"cuMemRelease", classVMM, 0},
	42: {"cuMemMap", classMap, trace.KindDevice},
	43: {"cuMemUnmap", classUnmap, trace.KindDevice},
	44: {"cuMemPoolTrimTo", classTrim, 0},
	45: {"cuMemSetAccess", classVMM, 0},
	46: {"cuStreamBeginCapture", classCaptureBegin, 0},
	47: {"cuStreamEndCapture", classCaptureEnd, 0},
	48: {"cuGraphDestroy", classGraphDestroy, 0},
}

// flagPTSZ marks a call through a per-thread default stream entry point.
const flagPTSZ = 1

// Stream handles with a fixed meaning in CUDA.
const (
	streamLegacy    = 0x1 // cudaStreamLegacy: the legacy default stream, as 0
	streamPerThread = 0x2 // cudaStreamPerThread
)

// header is the header page of a raw file.
type header struct {
	Pid, Ppid  uint32
	StartMono  int64 // CLOCK_MONOTONIC ns at the image's start (or fork)
	StartReal  int64 // CLOCK_REALTIME ns at the same instant
	Dropped    uint64
	Unwrapped  uint64
	ChunkBytes uint32
	Exe        string
	Args       []string
	// Rank, LocalRank and WorldSize are the process's RANK, LOCAL_RANK and
	// WORLD_SIZE (as a launcher such as torchrun sets them), -1 when
	// unset; VisibleDevices its CUDA_VISIBLE_DEVICES.
	Rank, LocalRank, WorldSize int
	VisibleDevices             string
}

// record is one recorded call.
type record struct {
	API    uint32
	RC     int32
	Tid    uint32
	Flags  uint32
	Time   int64
	Addr   uint64
	Size   uint64
	Stream uint64
	Aux    uint64
	Caller uint64
}

func parseHeader(b []byte) (header, error) {
	if len(b) < rawHeader || string(b[:8]) != rawMagic {
		return header{}, ErrNotRaw
	}
	le := binary.LittleEndian
	if v := le.Uint32(b[8:]); v != rawVersion {
		return header{}, fmt.Errorf("raw recording version %d, want %d", v, rawVersion)
	}
	if n := le.Uint32(b[12:]); n != recordSize {
		return header{}, fmt.Errorf("raw record size %d, want %d", n, recordSize)
	}
	h := header{
		Pid:        le.Uint32(b[16:]),
		Ppid:       le.Uint32(b[20:]),
		StartMono:  int64(le.Uint64(b[24:])),
		StartReal:  int64(le.Uint64(b[32:])),
		Dropped:    le.Uint64(b[40:]),
		Unwrapped:  le.Uint64(b[48:]),
		ChunkBytes: le.Uint32(b[56:]),
	}
	h.Rank, h.LocalRank, h.WorldSize = int(le.Uint32(b[64:]))-1, int(le.Uint32(b[68:]))-1, int(le.Uint32(b[72:]))-1
	vis := b[76 : 76+128]
	if i := bytes.IndexByte(vis, 0); i >= 0 {
		vis = vis[:i]
	}
	h.VisibleDevices = string(vis)
	exe := b[512:1024]
	if i := bytes.IndexByte(exe, 0); i >= 0 {
		exe = exe[:i]
	}
	h.Exe = string(exe)
	n := int(le.Uint32(b[60:]))
	cmd := b[1024:]
	if n < len(cmd) {
		cmd = cmd[:n]
	}
	for _, a := range strings.Split(strings.TrimSuffix(string(cmd), "\x00"), "\x00") {
		if a != "" || len(h.Args) > 0 {
			h.Args = append(h.Args, a)
		}
	}
	return h, nil
}

func readHeader(path string) (header, error) {
	f, err := os.Open(path)
	if err != nil {
		return header{}, err
	}
	defer f.Close()
	b := make([]byte, rawHeader)
	if _, err := io.ReadFull(f, b); err != nil {
		return header{}, fmt.Errorf("%s: %w", path, ErrNotRaw)
	}
	h, err := parseHeader(b)
	if err != nil {
		return header{}, fmt.Errorf("%s: %w", path, err)
	}
	return h, nil
}

// recordReader reads the completed records of a raw file in order.
type recordReader struct {
	f   *os.File
	r   *bufio.Reader
	buf [recordSize]byte
}

func openRecords(path string) (*recordReader, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	if _, err := f.Seek(rawHeader, io.SeekStart); err != nil {
		f.Close()
		return nil, err
	}
	return &recordReader{f: f, r: bufio.NewReaderSize(f, 256<<10)}, nil
}

// next returns the next completed record, or io.EOF. Slots never completed
// (a thread that died inside a call, the preallocated tail) are skipped.
func (rr *recordReader) next() (record, error) {
	le := binary.LittleEndian
	for {
		if _, err := io.ReadFull(rr.r, rr.buf[:]); err != nil {
			if err == io.ErrUnexpectedEOF {
				err = io.EOF
			}
			return record{}, err
		}
		b := rr.buf[:]
		a := le.Uint32(b)
		if a == 0 {
			continue
		}
		return record{
			API:    a,
			RC:     int32(le.Uint32(b[4:])),
			Tid:    le.Uint32(b[8:]),
			Flags:  le.Uint32(b[12:]),
			Time:   int64(le.Uint64(b[16:])),
			Addr:   le.Uint64(b[24:]),
			Size:   le.Uint64(b[32:]),
			Stream: le.Uint64(b[40:]),
			Aux:    le.Uint64(b[48:]),
			Caller: le.Uint64(b[56:]),
		}, nil
	}
}

func (rr *recordReader) close() error { return rr.f.Close() }

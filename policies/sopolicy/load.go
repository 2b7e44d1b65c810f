package sopolicy

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "so.h"
*/
import "C"

import (
	_ "embed"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"
)

// The CUDA error codes the shim returns to the library.
const (
	codeSuccess             = 0
	codeInvalidValue        = 1   // cudaErrorInvalidValue
	codeMemoryAllocation    = 2   // cudaErrorMemoryAllocation (CUDA_ERROR_OUT_OF_MEMORY)
	codeInitializationError = 3   // cudaErrorInitializationError
	codeUnknown             = 999 // cudaErrorUnknown
)

// DefaultRuntime is the SONAME of the shim loaded for a library that needs
// no CUDA library by name (its cudaMalloc left to the global scope).
const DefaultRuntime = "libcudart.so.13"

//go:embed shim/cudashim.c
var shimSource []byte

var (
	// callMu is held during every call into a library: one at a time in
	// the process, so that the shim's calls go to active's device.
	callMu sync.Mutex
	active atomic.Pointer[Policy]
	// stray counts the shim's calls made outside any library call (from
	// a thread of the library's own, or its constructor): they fail with
	// cudaErrorInitializationError.
	stray atomic.Int64

	// shims are the loaded shims by SONAME: the paths they were loaded
	// from, removed since.
	loadMu sync.Mutex
	shims  = map[string]string{}
)

// kindNames name the shim's kinds of device calls (cudashim.c's K_).
var kindNames = [...]string{"cudaMalloc", "cudaMallocAsync", "cuMemAlloc", "cuMemAllocAsync"}

func kindName(k C.int) string {
	if k >= 0 && int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "cudaMalloc"
}

func freeName(k C.int) string {
	return strings.Replace(kindName(k), "Alloc", "Free", 1)
}

//export allocsimSoMalloc
func allocsimSoMalloc(ptr *C.uintptr_t, size C.size_t, kind C.int) C.int {
	p := active.Load()
	if p == nil {
		stray.Add(1)
		return codeInitializationError
	}
	addr, rc := p.deviceMalloc(uint64(size), kindName(kind))
	*ptr = C.uintptr_t(addr)
	return C.int(rc)
}

//export allocsimSoFree
func allocsimSoFree(ptr C.uintptr_t, kind C.int) C.int {
	p := active.Load()
	if p == nil {
		stray.Add(1)
		return codeInitializationError
	}
	return C.int(p.deviceFree(uint64(ptr), freeName(kind)))
}

//export allocsimSoMemInfo
func allocsimSoMemInfo(free, total *C.size_t) C.int {
	p := active.Load()
	if p == nil {
		stray.Add(1)
		return codeInitializationError
	}
	f, t := p.memInfo()
	*free, *total = C.size_t(f), C.size_t(t)
	return codeSuccess
}

// StrayCalls returns the number of the shim's calls made outside any call
// into a library (from a thread of the library's own, or from its
// constructor), which failed with cudaErrorInitializationError.
func StrayCalls() int64 { return stray.Load() }

// library is a loaded copy of a CUDAPluggableAllocator library.
type library struct {
	handle          unsafe.Pointer
	allocFn, freeFn unsafe.Pointer
	closed          bool // under callMu
}

// load builds and loads the shims sp's library needs, then loads a copy of
// the library and finds its entry points.
func load(sp Spec) (*library, error) {
	libs, origin, err := dynamic(sp.Path)
	if err != nil {
		return nil, err
	}
	var sonames []string
	for _, l := range libs {
		if cudaLibrary(l) {
			sonames = append(sonames, l)
		}
	}
	if len(sonames) == 0 {
		sonames = []string{DefaultRuntime}
	}
	loadMu.Lock()
	defer loadMu.Unlock()
	if err := realRuntime(); err != nil {
		return nil, err
	}
	// The shims and the copy are built in tmp, removed once loaded.
	tmp, err := os.MkdirTemp("", "allocsim-so-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	for _, name := range sonames {
		if err := loadShim(name, tmp); err != nil {
			return nil, err
		}
	}
	// A copy of its own, so that two policies of one library keep two
	// states, even one after the other (a library may not unload);
	// removed once loaded.
	copyPath, err := copyLibrary(sp.Path, origin, tmp)
	if err != nil {
		return nil, err
	}
	cpath := C.CString(copyPath)
	defer C.free(unsafe.Pointer(cpath))
	var buf [1024]C.char
	h := C.so_open(cpath, 0, &buf[0], C.size_t(len(buf)))
	if h == nil {
		return nil, fmt.Errorf("dlopen: %s", strings.ReplaceAll(C.GoString(&buf[0]), copyPath, filepath.Base(sp.Path)))
	}
	lib := &library{handle: h}
	if err := realRuntime(); err != nil {
		C.so_close(h)
		return nil, fmt.Errorf("loading it loaded %w", err)
	}
	for _, e := range []struct {
		name string
		fn   *unsafe.Pointer
	}{{sp.Alloc, &lib.allocFn}, {sp.Free, &lib.freeFn}} {
		cname := C.CString(e.name)
		var file *C.char
		*e.fn = C.so_sym(h, cname, &file)
		C.free(unsafe.Pointer(cname))
		if *e.fn == nil || C.GoString(file) != copyPath {
			C.so_close(h)
			return nil, fmt.Errorf("no function %s in it (want void* ALLOC(ssize_t, int, cudaStream_t) and void FREE(void*, size_t, int, cudaStream_t); name them with so:LIB.so:ALLOC:FREE)", e.name)
		}
	}
	return lib, nil
}

// loadShim builds the shim with SONAME name in a directory of its own
// under tmp, when not loaded yet, and loads it RTLD_GLOBAL with the
// engine's table. loadMu is held.
func loadShim(name, tmp string) error {
	if _, ok := shims[name]; ok {
		return nil
	}
	dir, err := os.MkdirTemp(tmp, "shim-")
	if err != nil {
		return err
	}
	src := filepath.Join(dir, "cudashim.c")
	script := filepath.Join(dir, "shim.map")
	out := filepath.Join(dir, name)
	if err := os.WriteFile(src, shimSource, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(script, []byte(name+" { global: *; };\n"), 0o644); err != nil {
		return err
	}
	cc, err := compiler()
	if err != nil {
		return fmt.Errorf("building the shim that stands in for %s: %w", name, err)
	}
	args := append(cc[1:], "-shared", "-fPIC", "-O2", "-Wl,-soname,"+name, "-Wl,--version-script="+script, "-o", out, src)
	if msg, err := exec.Command(cc[0], args...).CombinedOutput(); err != nil {
		return fmt.Errorf("building the shim that stands in for %s: %s %s: %v: %s", name, cc[0], strings.Join(args, " "), err, strings.TrimSpace(string(msg)))
	}
	cpath := C.CString(out)
	defer C.free(unsafe.Pointer(cpath))
	var buf [1024]C.char
	h := C.so_open(cpath, 1, &buf[0], C.size_t(len(buf)))
	if h == nil {
		return fmt.Errorf("loading the shim that stands in for %s: %s", name, C.GoString(&buf[0]))
	}
	if C.so_set_table(h) != 0 {
		return fmt.Errorf("the shim %s has no allocsim_shim_set", out)
	}
	shims[name] = out
	return nil
}

// compiler returns the C compiler's command: $CC (split at spaces), cc or
// gcc.
func compiler() ([]string, error) {
	if cc := strings.Fields(os.Getenv("CC")); len(cc) > 0 {
		return cc, nil
	}
	for _, c := range []string{"cc", "gcc"} {
		if p, err := exec.LookPath(c); err == nil {
			return []string{p}, nil
		}
	}
	return nil, fmt.Errorf("no C compiler ($CC, cc or gcc) found")
}

// realRuntime returns an error naming a CUDA runtime or driver library
// loaded in the process that is none of the shims. loadMu is held.
func realRuntime() error {
	ours := map[string]bool{}
	for _, p := range shims {
		ours[p] = true
	}
	for _, p := range loaded() {
		if cudaLibrary(filepath.Base(p)) && !ours[p] {
			return fmt.Errorf("a real CUDA library, %s, is loaded in this process: the so: policies' stand-in runtime cannot be loaded beside it (replay so: policies in a process that does not use the GPU)", p)
		}
	}
	return nil
}

// loaded returns the paths of the objects loaded in the process.
func loaded() []string {
	buf := make([]byte, 1<<16)
	n := C.so_loaded((*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)))
	return strings.Split(strings.TrimSuffix(string(buf[:n]), "\n"), "\n")
}

// copyLibrary copies the library at src into a directory of its own under
// tmp and returns the copy's path. When its RPATH or RUNPATH names
// $ORIGIN (origin), the directory also holds a symbolic link to every
// other entry of src's directory, so that the libraries found there are
// found beside the copy. loadMu is held.
func copyLibrary(src string, origin bool, tmp string) (path string, err error) {
	in, err := os.Open(src)
	if err != nil {
		return "", err
	}
	defer in.Close()
	dir, err := os.MkdirTemp(tmp, "lib-")
	if err != nil {
		return "", err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
		}
	}()
	if origin {
		abs, err := filepath.Abs(src)
		if err != nil {
			return "", err
		}
		ents, err := os.ReadDir(filepath.Dir(abs))
		if err != nil {
			return "", fmt.Errorf("its RUNPATH names $ORIGIN: %v", err)
		}
		for _, e := range ents {
			if e.Name() != filepath.Base(abs) {
				os.Symlink(filepath.Join(filepath.Dir(abs), e.Name()), filepath.Join(dir, e.Name()))
			}
		}
	}
	out, err := os.Create(filepath.Join(dir, filepath.Base(src)))
	if err != nil {
		return "", err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		os.Remove(out.Name())
		return "", err
	}
	if err := out.Close(); err != nil {
		os.Remove(out.Name())
		return "", err
	}
	return out.Name(), nil
}

// alloc calls the library's ALLOC for p and returns its pointer, or the
// failure that the shim's calls met.
func (l *library) alloc(p *Policy, size, stream uint64) (uint64, error) {
	callMu.Lock()
	defer callMu.Unlock()
	p.calls = callState{}
	active.Store(p)
	r := C.so_call_alloc(l.allocFn, C.ssize_t(size), 0, C.uintptr_t(stream))
	active.Store(nil)
	if p.calls.failed != nil {
		return 0, p.calls.failed
	}
	return uint64(uintptr(r)), nil
}

// free calls the library's FREE for p.
func (l *library) free(p *Policy, addr, size, stream uint64) error {
	callMu.Lock()
	defer callMu.Unlock()
	p.calls = callState{}
	active.Store(p)
	C.so_call_free(l.freeFn, C.uintptr_t(addr), C.size_t(size), 0, C.uintptr_t(stream))
	active.Store(nil)
	return p.calls.failed
}

// cleanup unloads l when p is garbage collected.
func (l *library) cleanup(p *Policy) {
	runtime.AddCleanup(p, func(l *library) { l.close() }, l)
}

// close unloads the library, once.
func (l *library) close() {
	callMu.Lock()
	defer callMu.Unlock()
	if !l.closed {
		l.closed = true
		C.so_close(l.handle)
	}
}

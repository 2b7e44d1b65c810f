package interpose

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/trace"
	"github.com/gpualloc/allocsim/trace/tracefile"
)

// The recordings in testdata/h200 were made with `record run` on an H200
// (PyTorch 2.11, JAX 0.11.2, CUDA 13.0; 2026-12-01) of the programs in
// testdata/gpu, beside the figures the frameworks report for the same job
// (NAME.json):
//   - torch_expandable: torch_prog.py with expandable_segments:True, and
//     its memory_stats;
//   - jax_platform: jax_prog.py with XLA_PYTHON_CLIENT_ALLOCATOR=platform
//     (one mapping per buffer), and jax_default.json, the same job with
//     XLA's BFC allocator and its memory_stats;
//   - torch_graph_async: torch_graph.py (a torch.cuda.graph capture) under
//     PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync.
//
// readH200 reads the recording testdata/h200/NAME whole.
func readH200(t *testing.T, name string) (trace.Header, []trace.Event) {
	t.Helper()
	h, evs, err := tracefile.ReadAll(filepath.Join("testdata", "h200", name), tracefile.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return h, evs
}

// TestH200Recordings checks that every device allocation was recorded.
func TestH200Recordings(t *testing.T) {
	read := func(name string) (trace.Header, map[trace.Op]int, map[trace.Kind]int) {
		t.Helper()
		h, evs := readH200(t, name)
		ops, kinds := map[trace.Op]int{}, map[trace.Kind]int{}
		for _, ev := range evs {
			ops[ev.Op]++
			if ev.Op == trace.OpMalloc {
				kinds[ev.Kind]++
			}
		}
		return h, ops, kinds
	}
	stats := func(name string, v any) {
		t.Helper()
		raw, err := os.ReadFile(filepath.Join("testdata", "h200", name))
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(raw, v); err != nil {
			t.Fatal(err)
		}
	}
	calls := func(h trace.Header, name string) int {
		n, _ := strconv.Atoi(h.Metadata["calls."+name])
		return n
	}

	t.Run("torch_expandable", func(t *testing.T) {
		h, ops, kinds := read("torch_expandable.trace")
		var st struct {
			DeviceAllocs int `json:"num_device_alloc"`
		}
		stats("torch_expandable.json", &st)
		// PyTorch counts a device alloc per map of a range of pages, which
		// makes the range accessible once (cuMemSetAccess) after a
		// cuMemCreate and a cuMemMap per page.
		if n := calls(h, "cuMemSetAccess"); n != st.DeviceAllocs || n == 0 {
			t.Errorf("%d cuMemSetAccess, memory_stats num_device_alloc %d", n, st.DeviceAllocs)
		}
		if maps, allocs := calls(h, "cuMemMap"), calls(h, "cuMemAlloc"); kinds[trace.KindDevice] != maps+allocs {
			t.Errorf("%d device mallocs, %d cuMemMap + %d cuMemAlloc", kinds[trace.KindDevice], maps, allocs)
		}
		// The handle type PyTorch tries first and the driver refuses is no
		// OOM.
		if ops[trace.OpMallocFailed] != 0 || h.Metadata["failed.cuMemCreate"] != "1" {
			t.Errorf("%d failed mallocs, %q failed cuMemCreate", ops[trace.OpMallocFailed], h.Metadata["failed.cuMemCreate"])
		}
		if h.Device != "NVIDIA H200" || h.DeviceMemory != 150109880320 {
			t.Errorf("card %q of %d bytes", h.Device, h.DeviceMemory)
		}
	})
	t.Run("jax_platform", func(t *testing.T) {
		h, _, kinds := read("jax_platform.trace")
		var st struct {
			Stats struct {
				Allocs int `json:"num_allocs"`
			} `json:"stats"`
		}
		stats("jax_default.json", &st)
		// XLA's platform allocator maps one range per buffer: as many as
		// its BFC allocator makes allocations in the same job. The
		// cuMemAlloc calls are cuBLAS's and cuDNN's workspaces, which no
		// XLA allocator counts.
		if n := calls(h, "cuMemMap"); n != st.Stats.Allocs || n == 0 {
			t.Errorf("%d cuMemMap, BFC num_allocs %d", n, st.Stats.Allocs)
		}
		if maps, allocs := calls(h, "cuMemMap"), calls(h, "cuMemAlloc"); kinds[trace.KindDevice] != maps+allocs {
			t.Errorf("%d device mallocs, %d cuMemMap + %d cuMemAlloc", kinds[trace.KindDevice], maps, allocs)
		}
	})
}

// TestH200GraphCapture: the capture PyTorch makes on the H200, seen by the
// interposer: its begin and end on the capture stream, the three
// stream-ordered mallocs made during it (graph memory) in its pool, on that
// stream, and the pool's release when the graph is destroyed.
func TestH200GraphCapture(t *testing.T) {
	h, evs := readH200(t, "torch_graph_async.trace")
	if md := h.Metadata; md["calls.cudaStreamBeginCapture"] != "1" || md["calls.cudaStreamEndCapture"] != "1" || md["calls.cudaGraphDestroy"] != "1" {
		t.Errorf("metadata %v", md)
	}
	var stream uint64
	var seen []string
	for _, ev := range evs {
		switch {
		case ev.Op == trace.OpMarker && strings.HasPrefix(ev.Label, "cudaStreamBeginCapture: capture 1 of stream "):
			stream = ev.Stream
			seen = append(seen, "begin")
		case ev.Op == trace.OpMarker && strings.HasPrefix(ev.Label, "cudaStreamEndCapture: capture 1 "):
			seen = append(seen, "end")
		case ev.Op == trace.OpMalloc && ev.Pool != 0:
			if ev.Pool != 1 || ev.Stream != stream || ev.Kind != trace.KindAsync {
				t.Errorf("graph memory %+v", ev)
			}
			seen = append(seen, "malloc")
		case ev.Op == trace.OpPoolRelease:
			seen = append(seen, "release "+strconv.Itoa(int(ev.Pool)))
		}
	}
	if got := strings.Join(seen, ","); got != "begin,malloc,malloc,malloc,end,release 1" {
		t.Errorf("capture events %s", got)
	}
}

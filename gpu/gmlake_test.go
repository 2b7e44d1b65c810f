package gpu

import (
	"context"
	"fmt"
	"testing"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
)

// TestReplayGMLakeStitchesOnVMM replays train_gpt with the gmlake policy
// stitching (fragLimit=0: every large request that no free block fits) on
// the fake device, through the driver's virtual memory calls, and with
// replay sim's engine: the stitched ranges' pages are unmapped and mapped
// as simulated, the same peak reserved bytes, device calls and OOMs, the
// device sees one cuMemMap per simulated map and one cuMemUnmap per unmap,
// and nothing is left at the end.
func TestReplayGMLakeStitchesOnVMM(t *testing.T) {
	const path = "../testdata/pytorch/train_gpt.pickle.gz"
	s := policies.Settings{"fragLimit": "0"}
	rt := fakeRuntime(t, "", fmt.Sprintf("FAKECUDA_TOTAL=%d", uint64(64<<30)))
	got, err := Replay(context.Background(), rt, openTrace(t, path), Config{Trace: path, Policy: "gmlake", Settings: s})
	if err != nil {
		t.Fatal(err)
	}
	want, err := sim.Run(openTrace(t, path), sim.Config{Trace: path, Policy: "gmlake", Settings: s, Capacity: got.MaxBytes})
	if err != nil {
		t.Fatal(err)
	}
	w := want[0]
	counts := map[string]int64{}
	for _, row := range got.Latency {
		counts[row.Call] += row.Count
	}
	if w.DeviceFrees == 0 || counts["cuMemMap"] != w.DeviceAllocs-counts["cudaMalloc"] || counts["cuMemUnmap"] != w.DeviceFrees-counts["cudaFree"] {
		t.Errorf("calls %v; simulated %d allocations, %d frees (none: nothing stitched)", counts, w.DeviceAllocs, w.DeviceFrees)
	}
	if got.PeakReserved != w.PeakReserved || got.PeakAllocated != w.PeakAllocated || got.DeviceAllocs != w.DeviceAllocs ||
		got.DeviceFrees != w.DeviceFrees || got.OOMs != w.OOMs {
		t.Errorf("on the device: reserved %d allocated %d, %d/%d device calls, %d OOMs\nsimulated:    reserved %d allocated %d, %d/%d, %d",
			got.PeakReserved, got.PeakAllocated, got.DeviceAllocs, got.DeviceFrees, got.OOMs,
			w.PeakReserved, w.PeakAllocated, w.DeviceAllocs, w.DeviceFrees, w.OOMs)
	}
	t.Logf("calls %v; simulated %d/%d, peak %d", counts, w.DeviceAllocs, w.DeviceFrees, w.PeakReserved)
	if n := live(t, rt); n != 0 {
		t.Errorf("%d objects live at the end", n)
	}
}

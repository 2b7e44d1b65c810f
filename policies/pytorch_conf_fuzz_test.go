package policies_test

import (
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
)

// FuzzPytorchConf: any PYTORCH_CUDA_ALLOC_CONF string builds the pytorch
// policy or gives one error, one line, naming the setting; never a panic.
func FuzzPytorchConf(f *testing.F) {
	for _, s := range []string{
		"expandable_segments:True",
		"max_split_size_mb:64,roundup_power2_divisions:[256:1,512:2,>:8],garbage_collection_threshold:0.6",
		"backend:native,pinned_use_cuda_host_register:True,release_lock_on_cudamalloc:True",
		"roundup_power2_divisions:4",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, conf string) {
		_, err := policies.New("pytorch", sim.NewDevice(0), policies.Settings{"conf": conf})
		if err != nil {
			if msg := err.Error(); strings.Contains(msg, "\n") || !strings.Contains(msg, "conf") {
				t.Fatalf("error %q: not one line naming the setting", msg)
			}
		}
	})
}

package sim_test

import (
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/trace"
	"github.com/gpualloc/allocsim/trace/pytorch"
)

// The acceptance test of the project: replaying a real PyTorch snapshot
// against the "pytorch" policy as recorded (the settings the snapshot
// records, under the memory cap it was recorded with: nothing else given)
// gives the figures the real caching allocator measured (NAME.stats.json
// beside each snapshot), exactly.
//
// The small snapshots are in the repository (testdata/pytorch); the large
// ones are looked for in $ALLOCSIM_TRACES (the shared trace collection, with
// its pytorch/ and pytorch_cases/ folders), else ../../shared/traces, and
// skipped if absent.

// ptAcceptance lists the traces and, for those that cannot match yet, why.
// The churn* and mlp* snapshots are allocsim's own (testdata/pytorch,
// recorded by testdata/pytorch/record.py under the settings and caps their
// stats.json give).
var ptAcceptance = []struct {
	name    string // path under the collection, without .pickle.gz
	pending string // why it does not match yet; "" if it must match
	// pendingFigures are the figures that do not match yet (the others
	// must).
	pendingFigures []string
}{
	{name: "pytorch/train_gpt"},
	{name: "pytorch/infer_dynbatch"},
	{name: "pytorch/infer_dynbatch_expandable"},
	{name: "pytorch/kv_decode"},
	{name: "pytorch/hf_generate"},
	{name: "pytorch/multistream"},
	{name: "pytorch/hf_llama_train"},
	{name: "pytorch_cases/conv_forward"},
	{name: "pytorch_cases/growing_batch"},
	{name: "pytorch_cases/split_frag_oom"},
	{name: "pytorch_cases/token_lengths"},
	// The README's recipe exactly as a user runs it: PyTorch's defaults,
	// stacks on (frames shared through the pickle memo).
	{name: "pytorch_stacks/readme_job"},
	{name: "pytorch/churn"},
	{name: "pytorch/churn_maxsplit"},
	{name: "pytorch/churn_roundup"},
	{name: "pytorch/churn_mixed"},
	{name: "pytorch/churn_gc"},
	{name: "pytorch/churn_oom"},
	{name: "pytorch/churn_expandable"},
	{name: "pytorch/churn_expandable_capped"},
	{name: "pytorch/mlp"},
	{name: "pytorch/mlp_expandable"},
	{name: "pytorch/graph_step"},
	{name: "pytorch/graph_step_expandable"},
	{name: "pytorch/serve_graphs"},
	{name: "pytorch/compile_ro"},
	{name: "pytorch/mempool"},
	{name: "pytorch/pending_retry"},
	// Every kind again as users record (record.py --stacks: PyTorch's
	// defaults, context and stacks "all"), the README recipe's train job
	// first, and the two ranks of a DDP job on one GPU (record.py --ddp).
	{name: "pytorch/stacks/readme_train"},
	{name: "pytorch/stacks/churn"},
	{name: "pytorch/stacks/churn_oom"},
	{name: "pytorch/stacks/churn_mixed"},
	{name: "pytorch/stacks/churn_expandable"},
	{name: "pytorch/stacks/mlp"},
	{name: "pytorch/stacks/graph_step"},
	{name: "pytorch/stacks/serve_graphs"},
	{name: "pytorch/stacks/compile_ro"},
	{name: "pytorch/stacks/mempool"},
	{name: "pytorch/stacks/pending_retry"},
	// record.py --more-pools: several MemPools alive at once, deleted
	// interleaved (their segment frees' stacks name ~MemPool),
	// torch.compile(mode="reduce-overhead") training on several shapes
	// (the stacks name the checkpoint restores' mallocs), and decode
	// graphs in one shared pool between large eager prefills.
	{name: "pytorch/stacks/mempools_s7"},
	{name: "pytorch/stacks/mempools_s8"},
	{name: "pytorch/stacks/compile_train_s7"},
	{name: "pytorch/stacks/compile_train_s8"},
	{name: "pytorch/stacks/serve_prefill_s7"},
	{name: "pytorch/stacks/serve_prefill_s8"},
	{name: "pytorch/ddp/ddp_rank0"},
	{name: "pytorch/ddp/ddp_rank1"},
	// replay tune's recommendations run on the card (record.py --tuned),
	// and the snapshots taken beside the torch.profiler recordings.
	{name: "pytorch/tuned/tuned_mlp"},
	{name: "pytorch/tuned/tuned_churn"},
	{name: "pytorch/tuned/tuned_churn_maxsplit"},
	{name: "pytorch/tuned/tuned_churn_oom"},
	{name: "profiler/prof_mlp"},
	{name: "profiler/prof_mlp_expandable"},
	{name: "profiler/prof_churn"},
	{name: "profiler/prof_churn_oom"},
	// Llama-architecture training on the H200 (testdata/llama/record.py):
	// pre-training at three sequence lengths, LoRA and full fine-tuning on
	// batches of random lengths, each under the default allocator and
	// with expandable segments.
	{name: "llama/train_s1024"},
	{name: "llama/train_s1024_expandable"},
	{name: "llama/train_s2048"},
	{name: "llama/train_s2048_expandable"},
	{name: "llama/train_s4096"},
	{name: "llama/train_s4096_expandable"},
	{name: "llama/lora_var"},
	{name: "llama/lora_var_expandable"},
	{name: "llama/full_var"},
	{name: "llama/full_var_expandable"},
}

// ptTruth is what the real allocator reported.
type ptTruth struct {
	AllocConf   string `json:"alloc_conf"`
	Cap         uint64 `json:"mem_cap_bytes"`
	Reserved    uint64 `json:"max_memory_reserved"`
	Allocated   uint64 `json:"max_memory_allocated"`
	MemoryStats struct {
		DeviceAllocs int64 `json:"num_device_alloc"`
		DeviceFrees  int64 `json:"num_device_free"`
		Retries      int64 `json:"num_alloc_retries"`
		OOMs         int64 `json:"num_ooms"`
		// Requested is the peak of requested_bytes: PyTorch counts a
		// block's requested bytes until its free completes.
		Requested uint64 `json:"requested_bytes.all.peak"`
	} `json:"memory_stats"`
}

// ptFind returns the paths of the snapshot and its stats, or "" if absent.
func ptFind(name string) (snapshot, stats string) {
	var dirs []string
	if d := os.Getenv("ALLOCSIM_TRACES"); d != "" {
		dirs = append(dirs, filepath.Join(d, filepath.Dir(name)))
	}
	dirs = append(dirs, filepath.Join("..", "testdata", filepath.Dir(name)), filepath.Join("..", "testdata", "pytorch"), filepath.Join("..", "..", "shared", "traces", filepath.Dir(name)))
	for _, d := range dirs {
		p := filepath.Join(d, filepath.Base(name))
		if _, err := os.Stat(p + ".pickle.gz"); err == nil {
			return p + ".pickle.gz", p + ".stats.json"
		}
	}
	return "", ""
}

func TestPyTorchSnapshots(t *testing.T) {
	for _, tc := range ptAcceptance {
		t.Run(filepath.Base(tc.name), func(t *testing.T) {
			snap, stats := ptFind(tc.name)
			if snap == "" {
				t.Skipf("%s.pickle.gz not found (set ALLOCSIM_TRACES to the trace collection)", tc.name)
			}
			if fi, err := os.Stat(snap); err == nil && fi.Size() > 1<<20 && testing.Short() {
				t.Skip("a large snapshot (seconds to import) in -short mode")
			}
			raw, err := os.ReadFile(stats)
			if err != nil {
				t.Fatal(err)
			}
			var want ptTruth
			if err := json.Unmarshal(raw, &want); err != nil {
				t.Fatalf("%s: %v", stats, err)
			}
			f, err := os.Open(snap)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			src, err := pytorch.Import(f, snap, pytorch.Options{})
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			// As recorded: the snapshot's own settings, nothing else.
			rs, err := sim.Run(src, sim.Config{Trace: snap, Policy: "pytorch", Capacity: want.Cap, AsRecorded: true})
			elapsed := time.Since(start)
			if err != nil {
				t.Fatal(err)
			}
			got := rs[0]
			t.Logf("%d events replayed in %v; settings %v (recorded %q)", got.Events, elapsed, got.Settings, want.AllocConf)
			figures := []struct {
				name      string
				got, want any
			}{
				{"peak reserved", got.PeakReserved, want.Reserved},
				{"peak allocated", got.PeakAllocated, want.Allocated},
				{"peak requested", got.PeakRequested, want.MemoryStats.Requested},
				{"device allocs", got.DeviceAllocs, want.MemoryStats.DeviceAllocs},
				{"device frees", got.DeviceFrees, want.MemoryStats.DeviceFrees},
				{"retries", got.AllocRetries, want.MemoryStats.Retries},
				{"OOMs", got.OOMs, want.MemoryStats.OOMs},
				{"anomalies", got.Anomalies, int64(0)},
			}
			for _, fg := range figures {
				pending := false
				for _, p := range tc.pendingFigures {
					pending = pending || p == fg.name
				}
				switch {
				case fg.got == fg.want && pending:
					t.Logf("%s = %v matches now although listed as pending (%s)", fg.name, fg.got, tc.pending)
				case fg.got == fg.want:
				case pending:
					t.Logf("%s = %v, want %v: pending: %s", fg.name, fg.got, fg.want, tc.pending)
				default:
					t.Errorf("%s = %v, want %v", fg.name, fg.got, fg.want)
				}
			}
		})
	}
}

// BenchmarkPyTorchKVDecode replays kv_decode (723k events, the largest
// snapshot) against the pytorch policy, events already in memory.
func BenchmarkPyTorchKVDecode(b *testing.B) {
	snap, _ := ptFind("pytorch/kv_decode")
	if snap == "" {
		b.Skip("kv_decode.pickle.gz not found (set ALLOCSIM_TRACES to the trace collection)")
	}
	f, err := os.Open(snap)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	src, err := pytorch.Import(f, snap, pytorch.Options{})
	if err != nil {
		b.Fatal(err)
	}
	var evs []trace.Event
	for {
		ev, err := src.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			b.Fatal(err)
		}
		evs = append(evs, ev)
	}
	b.ResetTimer()
	for range b.N {
		if _, err := sim.Run(trace.NewSliceSource(src.Header(), evs), sim.Config{Policy: "pytorch"}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(evs)), "ns/event")
}

package plots_test

import (
	"flag"
	"fmt"
	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim/results"
	"log"
	"math"
	"os"
	"path/filepath"
	"testing"

	"gonum.org/v1/plot"

	"github.com/gpualloc/allocsim/plots"
)

var (
	update = flag.Bool("update", false, "write the example charts under testdata/ as PNG")
	edges  = flag.Bool("edges", false, "with -update, also write the edge case charts of TestEdgeCases into the temporary directory, to look at")
)

// outDir is where the examples write their pictures: testdata/ with
// -update, a temporary directory otherwise.
var outDir string

func TestMain(m *testing.M) {
	flag.Parse()
	// The charts leave planners out of the lowest peaks, as the replay
	// command tells them (plots.IsPlanner).
	plots.IsPlanner = func(name string) bool {
		info, ok := policies.Lookup(name)
		return ok && info.Abilities.Planner
	}
	dir, err := os.MkdirTemp("", "plots-example-")
	if err != nil {
		log.Fatal(err)
	}
	outDir = dir
	if *update {
		outDir = "testdata"
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// save renders p into outDir as name.png, and name.svg unless it writes
// into testdata/ (the committed pictures are PNG only, to keep them few).
func save(p *plot.Plot, name string) {
	formats := plots.Formats
	if *update {
		formats = []string{"png"}
	}
	for _, format := range formats {
		f, err := os.Create(filepath.Join(outDir, name+"."+format))
		if err != nil {
			log.Fatal(err)
		}
		if err := plots.Render(f, p, format); err != nil {
			log.Fatal(err)
		}
		if err := f.Close(); err != nil {
			log.Fatal(err)
		}
	}
}

const gib = 1 << 30

// trainingResults returns hand-built results of one training trace against
// three policies: 12 steps whose activations grow and are freed, over 2.2
// GiB of weights and optimizer state; the caching policy keeps what it
// reserved, best_fit releases some, expandable stays close to allocated.
func trainingResults() []results.Result {
	const (
		events = 26620
		points = 240
	)
	type policy struct {
		name          string
		slack         float64 // reserved over allocated at peak
		release       float64 // how much of the slack is given back between steps
		allocs, frees int64
	}
	pols := []policy{
		{"caching", 0.12, 0.0, 125, 0},
		{"best_fit", 0.07, 0.6, 410, 290},
		{"expandable", 0.015, 1.0, 3100, 2870},
	}
	var runs []results.Result
	for _, pol := range pols {
		r := results.Result{
			Trace:         "runs/train_gpt.pickle.gz",
			Policy:        pol.name,
			Events:        events,
			DeviceAllocs:  pol.allocs,
			DeviceFrees:   pol.frees,
			FirstOOMEvent: -1,
		}
		var held float64
		for i := range points {
			ev := int64(i) * (events - 1) / (points - 1)
			x := float64(ev) / events * 12 // 12 steps
			step := math.Floor(x)
			phase := x - step
			act := (0.9 + 0.5*math.Sin(step*1.7)*0.5 + 0.5) * math.Sin(math.Pi*phase) // activations rise and fall
			if phase > 0.5 {
				act *= 0.85
			}
			requested := 2.2*gib + math.Max(act, 0)*3.4*gib
			if ev < 600 {
				requested *= float64(ev) / 600 // loading the model
			}
			allocated := requested * 1.015
			want := allocated * (1 + pol.slack)
			if want > held {
				held = want
			} else {
				held -= (held - want) * pol.release
			}
			reserved := math.Max(held, allocated)
			r.Series = append(r.Series, results.Point{
				Event:         ev,
				Time:          ev * 1000,
				Requested:     uint64(requested),
				Allocated:     uint64(allocated),
				Reserved:      uint64(reserved),
				Fragmentation: fragmentation(allocated, reserved),
			})
			r.PeakRequested = max(r.PeakRequested, uint64(requested))
			r.PeakAllocated = max(r.PeakAllocated, uint64(allocated))
			r.PeakReserved = max(r.PeakReserved, uint64(reserved))
		}
		runs = append(runs, r)
	}
	// The lower bound is the trace's: the same for every policy.
	for i := range runs {
		runs[i].PeakRequested = runs[0].PeakRequested
	}
	return runs
}

// fragmentation returns 1 - allocated/reserved, 0 when nothing is reserved.
func fragmentation(allocated, reserved float64) float64 {
	if reserved <= 0 {
		return 0
	}
	return 1 - allocated/reserved
}

func ExampleMemory() {
	p, err := plots.Memory(trainingResults())
	if err != nil {
		log.Fatal(err)
	}
	save(p, "memory")
	fmt.Println(p.Title.Text)
	fmt.Println(p.X.Label.Text, "/", p.Y.Label.Text)
	// Output:
	// memory over the trace: train_gpt.pickle.gz
	// time (s) / memory (GiB)
}

func ExampleFragmentation() {
	p, err := plots.Fragmentation(trainingResults())
	if err != nil {
		log.Fatal(err)
	}
	save(p, "fragmentation")
	fmt.Println(p.Title.Text)
	fmt.Println(p.X.Label.Text, "/", p.Y.Label.Text)
	// Output:
	// fragmentation and idle memory: train_gpt.pickle.gz
	// time (s) / % of the reserved bytes
}

func ExamplePeaks() {
	p, err := plots.Peaks(trainingResults())
	if err != nil {
		log.Fatal(err)
	}
	save(p, "peaks")
	fmt.Println(p.Title.Text)
	fmt.Println(p.Y.Label.Text)
	// Output:
	// peak memory per policy: train_gpt.pickle.gz
	// peak memory (GiB)
}

func ExampleCalls() {
	p, err := plots.Calls(trainingResults())
	if err != nil {
		log.Fatal(err)
	}
	save(p, "calls")
	fmt.Println(p.Title.Text)
	fmt.Println(p.Y.Label.Text)
	// Output:
	// device calls per policy: train_gpt.pickle.gz
	// device calls (allocs + frees)
}

func ExampleWriteAll() {
	dir, err := os.MkdirTemp("", "plots-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	paths, err := plots.WriteAll(dir, trainingResults(), plots.Options{})
	if err != nil {
		log.Fatal(err)
	}
	for _, p := range paths {
		fmt.Println(filepath.Base(p))
	}
	// Output:
	// train_gpt-memory.png
	// train_gpt-memory.svg
	// train_gpt-memory-all.png
	// train_gpt-memory-all.svg
	// train_gpt-fragmentation.png
	// train_gpt-fragmentation.svg
	// train_gpt-peaks.png
	// train_gpt-peaks.svg
	// train_gpt-calls.png
	// train_gpt-calls.svg
}

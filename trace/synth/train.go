package synth

import (
	"fmt"
	"math/rand/v2"
)

var trainWorkload = Workload{
	Name: "train",
	Doc: "transformer training loop: weights kept; per layer, activations allocated in forward order and freed " +
		"in reverse during backward; gradients allocated in backward and freed at the next zero_grad; Adam state " +
		"allocated at the first optimizer step and kept; batch and sequence length drawn per iteration; the " +
		"input batch is copied on stream 1 and waited for on stream 0 through an event; one stream sync per iteration",
	Params: []Param{
		{"iterations", "50", "training iterations"},
		{"layers", "12", "transformer layers"},
		{"hidden", "1024", "hidden size (attention heads of 64)"},
		{"vocab", "32000", "vocabulary size"},
		{"batch-min", "4", "smallest batch"},
		{"batch-max", "16", "largest batch"},
		{"seq-min", "128", "shortest sequence"},
		{"seq-max", "512", "longest sequence"},
		{"dtype-bytes", "2", "bytes per element"},
	},
	build: newTrain,
}

type train struct {
	rng                  *rand.Rand
	iterations, layers   int
	bmin, bmax           int
	smin, smax           int
	h, vocab, dt, heads  uint64
	it                   int
	started              bool
	weights, wsize       []uint64 // embedding, per layer 6, final norm, lm head
	grads, adam          []uint64 // 0 when not allocated
	layerW               [][]int  // weight indexes per layer
	embedW, normW, headW int
}

func newTrain(p *params, rng *rand.Rand) (stepper, error) {
	t := &train{
		rng:        rng,
		iterations: p.int("iterations", 0),
		layers:     p.int("layers", 1),
		bmin:       p.int("batch-min", 1), bmax: p.int("batch-max", 1),
		smin: p.int("seq-min", 1), smax: p.int("seq-max", 1),
		h:     uint64(p.int("hidden", 64)),
		vocab: uint64(p.int("vocab", 1)),
		dt:    uint64(p.int("dtype-bytes", 1)),
	}
	p.span("batch-min", t.bmin, "batch-max", t.bmax)
	p.span("seq-min", t.smin, "seq-max", t.smax)
	t.heads = max(t.h/64, 1)
	return t, nil
}

func (t *train) addWeight(size uint64) int {
	t.wsize = append(t.wsize, size)
	t.weights = append(t.weights, 0)
	t.grads = append(t.grads, 0)
	t.adam = append(t.adam, 0, 0)
	return len(t.wsize) - 1
}

func (t *train) setup(e *emitter) {
	h, dt := t.h, t.dt
	e.marker("setup")
	t.embedW = t.addWeight(t.vocab * h * dt)
	for l := 0; l < t.layers; l++ {
		// norm 1, qkv, attention out, norm 2, mlp up, mlp down
		t.layerW = append(t.layerW, []int{
			t.addWeight(2 * h * dt), t.addWeight(3 * h * h * dt), t.addWeight(h * h * dt),
			t.addWeight(2 * h * dt), t.addWeight(4 * h * h * dt), t.addWeight(4 * h * h * dt),
		})
	}
	t.normW = t.addWeight(2 * h * dt)
	t.headW = t.addWeight(t.vocab * h * dt)
	for i, s := range t.wsize {
		t.weights[i] = e.malloc(s, 0)
	}
}

// grad allocates the gradient of weight w if zero_grad freed it.
func (t *train) grad(e *emitter, w int) {
	if t.grads[w] == 0 {
		t.grads[w] = e.malloc(t.wsize[w], 0)
	}
}

func (t *train) step(e *emitter) bool {
	if !t.started {
		t.started = true
		t.setup(e)
	}
	if t.it == t.iterations {
		e.marker("teardown")
		for i := range t.wsize {
			for _, a := range []uint64{t.grads[i], t.adam[2*i], t.adam[2*i+1], t.weights[i]} {
				if a != 0 {
					e.free(a, 0)
				}
			}
		}
		return false
	}
	t.it++
	h, dt := t.h, t.dt
	b, s := uint64(between(t.rng, t.bmin, t.bmax)), uint64(between(t.rng, t.smin, t.smax))
	tok := b * s
	e.marker(fmt.Sprintf("iteration %d batch=%d seq=%d", t.it, b, s))
	// zero_grad(set_to_none=True)
	for w, g := range t.grads {
		if g != 0 {
			e.free(g, 0)
			t.grads[w] = 0
		}
	}
	// The input batch, copied on stream 1.
	in := e.malloc(tok*8, 1)
	e.compute(tok * 8)
	e.wait(0, e.record(1))

	act := tok * h * dt
	scores := b * t.heads * s * s * dt
	x := e.malloc(act, 0) // embedding output
	e.compute(act)
	saved := make([][]uint64, t.layers)
	sizes := []uint64{act, 3 * act, scores, act, act, act, 4 * act, 4 * act, act}
	for l := 0; l < t.layers; l++ {
		// norm, qkv, attention probs (the scores are a temporary), attention
		// out, residual, norm 2, mlp up, activation, mlp out.
		var sv []uint64
		for k, size := range sizes {
			if k == 2 {
				tmp := e.malloc(scores, 0)
				e.compute(scores)
				sv = append(sv, e.malloc(size, 0))
				e.free(tmp, 0)
				continue
			}
			sv = append(sv, e.malloc(size, 0))
			e.compute(size)
		}
		saved[l] = sv
	}
	logits := e.malloc(tok*t.vocab*dt, 0)
	e.compute(tok * t.vocab * dt)
	loss := e.malloc(4, 0)

	// backward
	glogits := e.malloc(tok*t.vocab*dt, 0)
	e.free(logits, 0)
	e.free(loss, 0)
	t.grad(e, t.headW)
	t.grad(e, t.normW)
	g := e.malloc(act, 0)
	e.free(glogits, 0)
	for l := t.layers - 1; l >= 0; l-- {
		ws := t.layerW[l]
		for k := len(ws) - 1; k >= 0; k-- {
			t.grad(e, ws[k])
		}
		for k := len(saved[l]) - 1; k >= 0; k-- {
			ng := e.malloc(sizes[k], 0)
			e.compute(sizes[k])
			e.free(saved[l][k], 0)
			e.free(g, 0)
			g = ng
		}
	}
	t.grad(e, t.embedW)
	e.free(x, 0)
	e.free(g, 0)

	// Adam: state at the first step, a temporary per weight.
	for w, size := range t.wsize {
		if t.adam[2*w] == 0 {
			t.adam[2*w] = e.malloc(size, 0)
			t.adam[2*w+1] = e.malloc(size, 0)
		}
		tmp := e.malloc(size, 0)
		e.compute(3 * size)
		e.free(tmp, 0)
	}
	e.free(in, 1)
	e.streamSync(0) // loss.item()
	return true
}

package synth

import (
	"fmt"
	"math/rand/v2"
)

var inferenceWorkload = Workload{
	Name: "inference",
	Doc: "dynamic-batching inference server: weights kept; requests of random length are served in batches of " +
		"1..max-batch on worker streams taken in turn; each request has its own input and output buffers; a " +
		"batch's activations are padded to its longest request and freed layer by layer; a request's output is " +
		"held until `hold` later batches have run (the response being sent)",
	Params: []Param{
		{"requests", "2000", "requests served"},
		{"max-batch", "32", "largest batch"},
		{"layers", "24", "transformer layers"},
		{"hidden", "2048", "hidden size (attention heads of 64)"},
		{"vocab", "32000", "vocabulary size"},
		{"seq-min", "16", "shortest request in tokens"},
		{"seq-max", "512", "longest request in tokens"},
		{"streams", "2", "worker streams (1..N)"},
		{"hold", "4", "batches a request's output stays allocated after its batch"},
		{"dtype-bytes", "2", "bytes per element"},
	},
	build: newInference,
}

type inference struct {
	rng                        *rand.Rand
	requests, maxBatch, layers int
	smin, smax, streams, hold  int
	h, vocab, dt, heads        uint64
	served, batch              int
	weights                    []uint64
	pending                    [][2]uint64 // outputs waiting: address, stream
	pendingBatch               []int       // batch index of each pending output
	started                    bool
}

func newInference(p *params, rng *rand.Rand) (stepper, error) {
	in := &inference{
		rng:      rng,
		requests: p.int("requests", 0), maxBatch: p.int("max-batch", 1), layers: p.int("layers", 1),
		smin: p.int("seq-min", 1), smax: p.int("seq-max", 1), streams: p.int("streams", 1), hold: p.int("hold", 0),
		h: uint64(p.int("hidden", 64)), vocab: uint64(p.int("vocab", 1)), dt: uint64(p.int("dtype-bytes", 1)),
	}
	p.span("seq-min", in.smin, "seq-max", in.smax)
	in.heads = max(in.h/64, 1)
	return in, nil
}

func (in *inference) step(e *emitter) bool {
	h, dt := in.h, in.dt
	if !in.started {
		in.started = true
		e.marker("load weights")
		in.weights = append(in.weights, e.malloc(in.vocab*h*dt, 0))
		for l := 0; l < in.layers; l++ {
			for _, s := range []uint64{3 * h * h * dt, h * h * dt, 4 * h * h * dt, 4 * h * h * dt, 4 * h * dt} {
				in.weights = append(in.weights, e.malloc(s, 0))
			}
		}
		in.weights = append(in.weights, e.malloc(in.vocab*h*dt, 0))
	}
	if in.served == in.requests {
		in.retire(e, -1)
		e.marker("shutdown")
		for _, w := range in.weights {
			e.free(w, 0)
		}
		return false
	}
	in.batch++
	n := between(in.rng, 1, min(in.maxBatch, in.requests-in.served))
	in.served += n
	stream := uint64(1 + in.batch%in.streams)
	e.marker(fmt.Sprintf("batch %d: %d requests on stream %d", in.batch, n, stream))
	// Per request: the input tokens, then the batch padded to the longest.
	inputs := make([]uint64, n)
	L := 0
	for i := range inputs {
		l := between(in.rng, in.smin, in.smax)
		L = max(L, l)
		inputs[i] = e.malloc(uint64(l)*8, stream)
	}
	nl := uint64(n) * uint64(L)
	x := e.malloc(nl*h*dt, stream)
	for l := 0; l < in.layers; l++ {
		qkv := e.malloc(3*nl*h*dt, stream)
		e.compute(3 * nl * h * dt)
		scores := e.malloc(uint64(n)*in.heads*uint64(L)*uint64(L)*dt, stream)
		e.compute(uint64(n) * in.heads * uint64(L) * uint64(L) * dt)
		attn := e.malloc(nl*h*dt, stream)
		e.free(scores, stream)
		e.free(qkv, stream)
		up := e.malloc(4*nl*h*dt, stream)
		e.compute(4 * nl * h * dt)
		y := e.malloc(nl*h*dt, stream)
		e.free(up, stream)
		e.free(attn, stream)
		e.free(x, stream)
		x = y
	}
	logits := e.malloc(uint64(n)*in.vocab*dt, stream)
	e.free(x, stream)
	for _, a := range inputs {
		e.free(a, stream)
	}
	for i := 0; i < n; i++ {
		in.pending = append(in.pending, [2]uint64{e.malloc(in.vocab*4, stream), stream})
		in.pendingBatch = append(in.pendingBatch, in.batch)
	}
	e.free(logits, stream)
	e.record(stream)
	e.streamSync(stream)
	in.retire(e, in.batch-in.hold)
	return true
}

// retire frees the outputs of batches up to upTo (all when upTo < 0).
func (in *inference) retire(e *emitter, upTo int) {
	k := 0
	for k < len(in.pending) && (upTo < 0 || in.pendingBatch[k] <= upTo) {
		e.free(in.pending[k][0], in.pending[k][1])
		k++
	}
	in.pending = append(in.pending[:0], in.pending[k:]...)
	in.pendingBatch = append(in.pendingBatch[:0], in.pendingBatch[k:]...)
}

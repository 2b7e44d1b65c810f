package synth

import (
	"fmt"
	"math/rand/v2"
)

var kvcacheWorkload = Workload{
	Name: "kvcache",
	Doc: "KV-cache decoding with continuous batching: up to `concurrency` sequences decode together; a new " +
		"sequence's prefill allocates its keys and values per layer for the prompt; every generated token grows " +
		"each layer's keys and values, reallocating them (a new buffer, a copy, the old one freed) whenever the " +
		"length passes the capacity, which grows by `block` tokens (1: a reallocation per token, as torch.cat); a " +
		"finished sequence frees its cache; one stream sync per decoding step (sampling)",
	Params: []Param{
		{"sequences", "32", "sequences generated"},
		{"concurrency", "8", "sequences decoding at once"},
		{"layers", "8", "transformer layers"},
		{"hidden", "2048", "hidden size"},
		{"kv-hidden", "512", "key/value width per token and layer (grouped-query attention)"},
		{"vocab", "32000", "vocabulary size"},
		{"prompt-min", "32", "shortest prompt in tokens"},
		{"prompt-max", "512", "longest prompt in tokens"},
		{"gen-min", "16", "fewest tokens generated"},
		{"gen-max", "256", "most tokens generated"},
		{"block", "1", "tokens the cache grows by at a reallocation"},
		{"dtype-bytes", "2", "bytes per element"},
	},
	build: newKVCache,
}

type sequence struct {
	id       int
	len, cap uint64
	left     int
	k, v     []uint64
}

type kvcache struct {
	rng                      *rand.Rand
	sequences, concurrency   int
	layers, pmin, pmax       int
	gmin, gmax               int
	h, kvh, vocab, dt, block uint64
	started                  int
	active                   []*sequence
	weights                  []uint64
	loaded                   bool
	steps                    int
}

func newKVCache(p *params, rng *rand.Rand) (stepper, error) {
	k := &kvcache{
		rng: rng, sequences: p.int("sequences", 0), concurrency: p.int("concurrency", 1), layers: p.int("layers", 1),
		pmin: p.int("prompt-min", 1), pmax: p.int("prompt-max", 1), gmin: p.int("gen-min", 1), gmax: p.int("gen-max", 1),
		h: uint64(p.int("hidden", 1)), kvh: uint64(p.int("kv-hidden", 1)), vocab: uint64(p.int("vocab", 1)),
		block: uint64(p.int("block", 1)), dt: uint64(p.int("dtype-bytes", 1)),
	}
	p.span("prompt-min", k.pmin, "prompt-max", k.pmax)
	p.span("gen-min", k.gmin, "gen-max", k.gmax)
	return k, nil
}

func (k *kvcache) roundUp(n uint64) uint64 { return (n + k.block - 1) / k.block * k.block }

func (k *kvcache) step(e *emitter) bool {
	h, dt := k.h, k.dt
	if !k.loaded {
		k.loaded = true
		e.marker("load weights")
		k.weights = append(k.weights, e.malloc(k.vocab*h*dt, 0))
		for l := 0; l < k.layers; l++ {
			for _, s := range []uint64{h * (h + 2*k.kvh) * dt, h * h * dt, 3 * h * 4 * h * dt} {
				k.weights = append(k.weights, e.malloc(s, 0))
			}
		}
		k.weights = append(k.weights, e.malloc(k.vocab*h*dt, 0))
	}
	// Admit new sequences: prefill.
	for len(k.active) < k.concurrency && k.started < k.sequences {
		k.started++
		p := uint64(between(k.rng, k.pmin, k.pmax))
		s := &sequence{id: k.started, len: p, cap: k.roundUp(p), left: between(k.rng, k.gmin, k.gmax)}
		e.marker(fmt.Sprintf("prefill sequence %d: %d tokens", s.id, p))
		x := e.malloc(p*h*dt, 0)
		for l := 0; l < k.layers; l++ {
			s.k = append(s.k, e.malloc(s.cap*k.kvh*dt, 0))
			s.v = append(s.v, e.malloc(s.cap*k.kvh*dt, 0))
			tmp := e.malloc(4*p*h*dt, 0)
			e.compute(4 * p * h * dt)
			e.free(tmp, 0)
		}
		e.free(x, 0)
		k.active = append(k.active, s)
	}
	if len(k.active) == 0 {
		e.marker("shutdown")
		for _, w := range k.weights {
			e.free(w, 0)
		}
		return false
	}
	// One decoding step for every active sequence.
	k.steps++
	n := uint64(len(k.active))
	x := e.malloc(n*h*dt, 0)
	for l := 0; l < k.layers; l++ {
		for _, s := range k.active {
			if s.len+1 > s.cap {
				nc := s.cap + k.block
				nk := e.malloc(nc*k.kvh*dt, 0)
				e.compute(s.len * k.kvh * dt)
				e.free(s.k[l], 0)
				nv := e.malloc(nc*k.kvh*dt, 0)
				e.compute(s.len * k.kvh * dt)
				e.free(s.v[l], 0)
				s.k[l], s.v[l] = nk, nv
			}
		}
		tmp := e.malloc(4*n*h*dt, 0)
		e.compute(4 * n * h * dt)
		e.free(tmp, 0)
	}
	for _, s := range k.active {
		if s.len+1 > s.cap {
			s.cap += k.block
		}
		s.len++
		s.left--
	}
	logits := e.malloc(n*k.vocab*dt, 0)
	e.free(x, 0)
	e.streamSync(0)
	e.free(logits, 0)
	// Retire finished sequences.
	kept := k.active[:0]
	for _, s := range k.active {
		if s.left > 0 {
			kept = append(kept, s)
			continue
		}
		e.marker(fmt.Sprintf("sequence %d done: %d tokens", s.id, s.len))
		for l := range s.k {
			e.free(s.k[l], 0)
			e.free(s.v[l], 0)
		}
	}
	k.active = kept
	return true
}

package synth

import (
	"math/rand/v2"
)

var serviceWorkload = Workload{
	Name: "service",
	Doc: "a service that mallocs and frees per request, the pattern that fragments: up to `concurrency` requests " +
		"in flight on worker threads and streams; each allocates 1..`buffers` buffers of log-uniform sizes, one " +
		"at a time, interleaved with the other requests, and frees them when it completes, except a `keep` " +
		"fraction that outlives it by up to `keep-requests` completed requests (a cache)",
	Params: []Param{
		{"requests", "10000", "requests served"},
		{"concurrency", "32", "requests in flight"},
		{"buffers", "4", "most buffers per request"},
		{"min-size", "256", "smallest buffer"},
		{"max-size", "16MiB", "largest buffer"},
		{"keep", "0.05", "fraction of buffers that outlive their request"},
		{"keep-requests", "2000", "most requests a kept buffer outlives its own by"},
		{"threads", "8", "worker threads"},
		{"streams", "4", "worker streams"},
	},
	build: newService,
}

type request struct {
	id     int
	left   int // buffers still to allocate
	bufs   []uint64
	thread uint64
	stream uint64
}

type keptBuf struct {
	addr, stream uint64
	expires      int // completed-request count at which it is freed
}

type service struct {
	rng                            *rand.Rand
	requests, concurrency, buffers int
	threads, streams, keepRequests int
	minSize, maxSize               uint64
	keep                           float64
	started, completed             int
	inflight                       []*request
	kept                           []keptBuf
}

func newService(p *params, rng *rand.Rand) (stepper, error) {
	s := &service{
		rng: rng, requests: p.int("requests", 0), concurrency: p.int("concurrency", 1), buffers: p.int("buffers", 1),
		threads: p.int("threads", 1), streams: p.int("streams", 1), keepRequests: p.int("keep-requests", 1),
		minSize: p.size("min-size"), maxSize: p.size("max-size"), keep: p.prob("keep"),
	}
	if s.minSize > s.maxSize {
		p.fail("min-size", "is above --max-size")
	}
	return s, nil
}

// step advances the service by up to 256 actions.
func (s *service) step(e *emitter) bool {
	for range 256 {
		for len(s.inflight) < s.concurrency && s.started < s.requests {
			s.started++
			s.inflight = append(s.inflight, &request{
				id: s.started, left: between(s.rng, 1, s.buffers),
				thread: uint64(1 + s.started%s.threads), stream: uint64(1 + s.started%s.streams),
			})
		}
		if len(s.inflight) == 0 {
			e.thread = 1
			for _, k := range s.kept {
				e.free(k.addr, k.stream)
			}
			s.kept = nil
			return false
		}
		i := s.rng.IntN(len(s.inflight))
		r := s.inflight[i]
		e.thread = r.thread
		if r.left > 0 {
			r.left--
			r.bufs = append(r.bufs, e.malloc(logUniform(s.rng, s.minSize, s.maxSize), r.stream))
			e.compute(1 << 20)
			continue
		}
		// Complete the request.
		e.streamSync(r.stream)
		for _, b := range r.bufs {
			if s.rng.Float64() < s.keep {
				s.kept = append(s.kept, keptBuf{b, r.stream, s.completed + between(s.rng, 1, s.keepRequests)})
				continue
			}
			e.free(b, r.stream)
		}
		s.inflight[i] = s.inflight[len(s.inflight)-1]
		s.inflight = s.inflight[:len(s.inflight)-1]
		s.completed++
		live := s.kept[:0]
		for _, k := range s.kept {
			if k.expires <= s.completed {
				e.free(k.addr, k.stream)
				continue
			}
			live = append(live, k)
		}
		s.kept = live
	}
	return true
}

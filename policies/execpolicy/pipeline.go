package execpolicy

import (
	"fmt"
	"strconv"

	"github.com/gpualloc/allocsim/policies"
)

// toldCall is a call told ahead (Ahead) and sent to the child: for a
// malloc, its number among the malloc lines, and its answer once read.
type toldCall struct {
	policies.Call
	n      uint64 // a malloc's number, from 1
	addr   uint64 // a malloc's block, answered ok
	failed bool   // a malloc answered oom
}

// Ahead sends the child the calls the engine makes next (see
// policies.Pipeliner), when it asked for the hook pipeline: the mallocs
// without waiting for their answers, which Malloc reads when the engine
// makes each call, and a free of a block whose malloc is among them as
// "free_malloc N STREAM", N that malloc's number. For a child without the
// hook it does nothing, and each call is sent when it is made. Calls told
// before and not made are an error, but for the frees of blocks whose
// malloc failed, which are not made.
func (p *Policy) Ahead(calls []policies.Call) error {
	if err := p.ready(); err != nil || !p.hooks.Pipeline {
		return err
	}
	if err := p.untold("calls told ahead"); err != nil {
		return err
	}
	p.told, p.toldAt = p.told[:0], 0
	for k, c := range calls {
		t := toldCall{Call: c}
		switch {
		case !c.Free:
			p.mallocs++
			t.n = p.mallocs
			p.request2("malloc", c.Size, c.Stream)
		case c.Of >= 0:
			if c.Of >= k || calls[c.Of].Free {
				return p.fail(nil, ErrProtocol, fmt.Sprintf("call %d told ahead: a free of call %d, which is no malloc before it", k, c.Of))
			}
			p.request2("free_malloc", p.told[c.Of].n, c.Stream)
		default:
			p.request2("free", c.Addr, c.Stream)
		}
		p.told = append(p.told, t)
		p.in.Write(p.req)
		p.in.WriteByte('\n')
	}
	if err := p.in.Flush(); err != nil {
		return p.lost("cannot write to it")
	}
	return nil
}

// toldNext returns the next call told ahead, which must be c (a free's
// Addr the block's address), nil when none is left to make; it passes
// over the frees of blocks whose malloc failed.
func (p *Policy) toldNext(c policies.Call) (*toldCall, error) {
	p.skipFailed()
	if p.toldAt == len(p.told) {
		return nil, nil
	}
	t := &p.told[p.toldAt]
	addr := t.Addr
	if t.Free && t.Of >= 0 {
		addr = p.told[t.Of].addr
	}
	if t.Free != c.Free || t.Stream != c.Stream || (!c.Free && t.Size != c.Size) || (c.Free && addr != c.Addr) {
		return nil, p.fail(nil, ErrProtocol, fmt.Sprintf("the engine called %s where it told %s ahead", callText(c), callText(policies.Call{Free: t.Free, Size: t.Size, Stream: t.Stream, Addr: addr})))
	}
	p.toldAt++
	return t, nil
}

// skipFailed passes over the next calls told ahead that are frees of
// blocks whose malloc failed.
func (p *Policy) skipFailed() {
	for p.toldAt < len(p.told) {
		t := &p.told[p.toldAt]
		if !t.Free || t.Of < 0 || !p.told[t.Of].failed {
			return
		}
		p.toldAt++
	}
}

// untold returns an error if calls told ahead are left to make, where
// what (another call, or the end) comes.
func (p *Policy) untold(what string) error {
	p.skipFailed()
	if p.toldAt == len(p.told) {
		return nil
	}
	t := p.told[p.toldAt]
	return p.fail(nil, ErrProtocol, fmt.Sprintf("%s where %d calls told ahead are left to make, from %s", what, len(p.told)-p.toldAt, callText(t.Call)))
}

// callText says a call in words, for errors.
func callText(c policies.Call) string {
	if c.Free {
		return "free of " + strconv.FormatUint(c.Addr, 10) + " on stream " + strconv.FormatUint(c.Stream, 10)
	}
	return "malloc of " + strconv.FormatUint(c.Size, 10) + " bytes on stream " + strconv.FormatUint(c.Stream, 10)
}

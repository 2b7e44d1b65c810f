package sim

import "github.com/gpualloc/allocsim/policies"

// The invariant checker over a device that maps pages (expandable
// segments): each run of contiguous mapped pages counts as one live
// segment, which grows when pages next to it are mapped and is cut when
// pages of it are unmapped (no live block may lie in those).

// Map maps pages on the device and records them.
func (d *checkedDevice) Map(addr, size uint64) error {
	if err := d.Device.Map(addr, size); err != nil {
		return err
	}
	d.c.mapRange(addr, size)
	return nil
}

// Unmap unmaps pages on the device and records it.
func (d *checkedDevice) Unmap(addr, size uint64) error {
	if err := d.Device.Unmap(addr, size); err != nil {
		return err
	}
	d.c.unmapRange(addr, size)
	return nil
}

// mapRange records the mapping of [addr, addr+size), joined to mapped runs
// right before and after it.
func (c *Checker) mapRange(addr, size uint64) {
	if c.mapped == nil {
		c.mapped = map[uint64]bool{}
	}
	c.segmentAlloc(addr, size)
	if s, n, ok := c.segments.Floor(addr - 1); ok && addr > 0 && c.mapped[s] && s+n == addr {
		c.segments.Delete(addr)
		c.segments.Put(s, n+size)
		addr, size = s, n+size
	}
	if s, n, ok := c.segments.Ceil(addr + size); ok && s == addr+size && c.mapped[s] {
		delete(c.mapped, s)
		c.segments.Put(addr, size+n)
		c.segments.Delete(s)
	}
	c.mapped[addr] = true
}

// unmapRange records the unmapping of [addr, addr+size), inside a mapped
// run, which no live block may meet.
func (c *Checker) unmapRange(addr, size uint64) {
	r := policies.Block{Addr: addr, Size: size}
	s, n, ok := c.segments.Floor(addr)
	if !ok || !c.mapped[s] || s+n < addr+size {
		c.fail(r, policies.Block{}, "pages %s unmapped outside a mapped range", fmtBlock(r))
		return
	}
	if a, lb, ok := c.blocks.Floor(addr + size - 1); ok && a+lb.size > addr {
		o := policies.Block{Addr: a, Size: lb.size}
		c.fail(r, o, "pages %s unmapped while block %s in them is live (since event %d)", fmtBlock(r), fmtBlock(o), lb.event)
	}
	c.segments.Delete(s)
	delete(c.mapped, s)
	if s < addr {
		c.segments.Put(s, addr-s)
		c.mapped[s] = true
	}
	if end := addr + size; end < s+n {
		c.segments.Put(end, s+n-end)
		c.mapped[end] = true
	}
	c.reserved -= size
}

package policies

// FirstFit is a coalescing free-list allocator that places each malloc in
// the free block with the lowest address that is large enough
// (address-ordered first fit, the placement of RMM's arena and of classic
// malloc free lists; Knuth, TAOCP vol. 1, 2.5).
//
// Sizes are rounded up to the alignment. Memory comes from the device in
// segments of max(segment_size, rounded request) rounded up to 2 MiB. A
// free block is split when it is larger than the request (the front part is
// returned, the rest stays free); a freed block coalesces with free
// neighbours in its segment. When the device refuses a segment, every wholly
// free segment is returned to the device and, if any was, the device
// allocation is tried once more (a retry, see Retries); then the malloc is
// an OOM. Streams are ignored: a free block is reusable at once by any
// stream. A malloc of 0 bytes returns the block {0, 0}, whose free does
// nothing (as cudaMalloc and cudaFree do with size 0 and NULL).
//
// Settings (defaults in brackets):
//   - alignment [512]: sizes are rounded up to a multiple of it; a power of
//     two from 1 B to 2 MiB.
//   - segment_size [2MiB]: the smallest segment asked of the device.
//   - release [false]: return a segment to the device as soon as it is
//     wholly free, rather than keep it cached until EmptyCache or a retry.
type FirstFit struct{ coalescing }

// BestFit is a coalescing free-list allocator that places each malloc in
// the smallest free block that is large enough, the lowest address among
// equal sizes (the placement of PyTorch's caching allocator and of
// TensorFlow's BFC allocator, without their pools and bins). Everything
// else, settings included, is as for FirstFit.
type BestFit struct{ coalescing }

var (
	_ Policy     = (*FirstFit)(nil)
	_ Releaser   = (*FirstFit)(nil)
	_ FreeSpacer = (*FirstFit)(nil)
	_ Counter    = (*FirstFit)(nil)
	_ Policy     = (*BestFit)(nil)
	_ Releaser   = (*BestFit)(nil)
	_ FreeSpacer = (*BestFit)(nil)
	_ Counter    = (*BestFit)(nil)
)

// coalescingSettings are the settings of first-fit and best-fit.
var coalescingSettings = []Setting{
	{Key: "alignment", Default: "512", Doc: "sizes are rounded up to a multiple of it, in bytes: a power of two from 1 B to 2 MiB"},
	{Key: "segment_size", Default: "2MiB", Doc: "the smallest segment asked of the device, in bytes (rounded up to 2 MiB)"},
	{Key: "release", Default: "false", Doc: "return a segment to the device as soon as it is wholly free"},
}

func init() {
	register(Info{
		Name:     "first-fit",
		Design:   "coalescing free list over device segments, lowest address first (address-ordered first fit)",
		Settings: coalescingSettings,
	}, func(dev Device, s Settings) (Policy, error) { return NewFirstFit(dev, s) })
	register(Info{
		Name:     "best-fit",
		Design:   "coalescing free list over device segments, smallest fit, lowest address among equal sizes",
		Settings: coalescingSettings,
	}, func(dev Device, s Settings) (Policy, error) { return NewBestFit(dev, s) })
}

// NewFirstFit returns a first-fit policy on dev. It returns an error naming
// the key for an unknown or malformed setting.
func NewFirstFit(dev Device, s Settings) (*FirstFit, error) {
	p := &FirstFit{}
	if err := p.init("first-fit", false, dev, s); err != nil {
		return nil, err
	}
	return p, nil
}

// NewBestFit returns a best-fit policy on dev. It returns an error naming
// the key for an unknown or malformed setting.
func NewBestFit(dev Device, s Settings) (*BestFit, error) {
	p := &BestFit{}
	if err := p.init("best-fit", true, dev, s); err != nil {
		return nil, err
	}
	return p, nil
}

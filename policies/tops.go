package policies

// maxTops is an indexed max-heap of sizes in bytes by id (0, 1, ...): the
// largest free block of each of a policy's pools (a stream's, an arena's),
// updated as a pool's largest changes in O(log pools), so that FreeSpace
// answers the largest of all in O(1) instead of a pass over every pool at
// each event (which made N streams cost N^2). The zero value is empty.
type maxTops struct {
	heap []int32  // ids, the largest key first
	pos  []int32  // pos[id]: its place in heap plus one, 0 when absent
	key  []uint64 // key[id]: its size while in heap
}

// max returns the largest size set, 0 if none.
func (h *maxTops) max() uint64 {
	if len(h.heap) == 0 {
		return 0
	}
	return h.key[h.heap[0]]
}

// set sets the size of id to key; 0 takes id out.
func (h *maxTops) set(id int, key uint64) {
	for id >= len(h.pos) {
		h.pos = append(h.pos, 0)
		h.key = append(h.key, 0)
	}
	at := int(h.pos[id]) - 1
	switch {
	case at < 0 && key == 0:
	case at < 0:
		h.key[id] = key
		h.heap = append(h.heap, int32(id))
		h.pos[id] = int32(len(h.heap))
		h.up(len(h.heap) - 1)
	case key == 0:
		n := len(h.heap) - 1
		h.pos[id], h.key[id] = 0, 0
		if at != n {
			h.heap[at] = h.heap[n]
			h.pos[h.heap[at]] = int32(at + 1)
		}
		h.heap = h.heap[:n]
		if at != n {
			h.down(at)
			h.up(at)
		}
	default:
		old := h.key[id]
		h.key[id] = key
		if key > old {
			h.up(at)
		} else if key < old {
			h.down(at)
		}
	}
}

func (h *maxTops) swap(i, j int) {
	h.heap[i], h.heap[j] = h.heap[j], h.heap[i]
	h.pos[h.heap[i]], h.pos[h.heap[j]] = int32(i+1), int32(j+1)
}

func (h *maxTops) up(i int) {
	for i > 0 {
		parent := (i - 1) / 2
		if h.key[h.heap[parent]] >= h.key[h.heap[i]] {
			return
		}
		h.swap(i, parent)
		i = parent
	}
}

func (h *maxTops) down(i int) {
	for {
		c := 2*i + 1
		if c >= len(h.heap) {
			return
		}
		if r := c + 1; r < len(h.heap) && h.key[h.heap[r]] > h.key[h.heap[c]] {
			c = r
		}
		if h.key[h.heap[i]] >= h.key[h.heap[c]] {
			return
		}
		h.swap(i, c)
		i = c
	}
}

// sizeTree is a segment tree of sizes in bytes by index (0, 1, ...): the
// largest free block of each of a policy's streams in the order they were
// first seen, to find the first stream of that order whose largest free
// block holds a request in O(log streams) rather than by trying every
// stream. The zero value is empty, every size 0.
type sizeTree struct {
	n    int      // leaves, a power of two (or 0)
	node []uint64 // node[1] the root, node[n+i] leaf i; node[k] the max of its children
}

// max returns the largest size set, 0 if none.
func (t *sizeTree) max() uint64 {
	if t.n == 0 {
		return 0
	}
	return t.node[1]
}

// set sets the size at index i.
func (t *sizeTree) set(i int, v uint64) {
	if i >= t.n {
		if v == 0 {
			return
		}
		t.grow(i + 1)
	}
	k := t.n + i
	t.node[k] = v
	for k >>= 1; k > 0; k >>= 1 {
		m := max(t.node[2*k], t.node[2*k+1])
		if t.node[k] == m {
			return
		}
		t.node[k] = m
	}
}

// grow makes room for at least n leaves, keeping the sizes.
func (t *sizeTree) grow(n int) {
	size := max(t.n, 16)
	for size < n {
		size *= 2
	}
	node := make([]uint64, 2*size)
	if t.n > 0 {
		copy(node[size:], t.node[t.n:])
	}
	for k := size - 1; k > 0; k-- {
		node[k] = max(node[2*k], node[2*k+1])
	}
	t.n, t.node = size, node
}

// first returns the lowest index from from on whose size is at least v
// (v > 0), -1 if none.
func (t *sizeTree) first(from int, v uint64) int {
	if from >= t.n || t.node[1] < v {
		return -1
	}
	// Up from the leaf at from, to the first subtree right of the path
	// that holds such a size, then down to its leftmost such leaf.
	k := t.n + from
	if t.node[k] < v {
		for {
			for k&1 == 1 { // a right child: go up past its parent
				k >>= 1
				if k == 0 {
					return -1
				}
			}
			k++ // the right sibling
			if t.node[k] >= v {
				break
			}
		}
	}
	for k < t.n {
		if t.node[2*k] >= v {
			k = 2 * k
		} else {
			k = 2*k + 1
		}
	}
	return k - t.n
}

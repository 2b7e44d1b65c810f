package pytorch

import (
	"math"
	"math/big"
	"sort"
	"strconv"
	"strings"
)

// goTuple, goSet, goDict and goBytes hold decoded Python values as Go
// values, for formatting settings: a list is a []any, a tuple a goTuple, a
// dict a *goDict (its items in order), a set a goSet; scalars are nil,
// bool, int64, uint64, *big.Int, float64 and string. A container that
// contains itself (the pickle memo allows it) is a cyclic Go value.
type (
	goTuple []any
	goSet   []any
	goDict  struct{ items []goItem }
	goItem  struct{ key, val any }
	goBytes []byte
)

// goValues converts decoder values to Go values, each container once.
type goValues struct {
	d    *decoder
	seen map[int64]any // by container slot
}

func (g *goValues) of(v value) any { return g.at(v, 0) }

// at converts v, a value depth containers down: no deeper than the
// formatter looks, so that a deep nesting costs neither time nor stack.
func (g *goValues) at(v value, depth int) any {
	d := g.d
	switch v.k {
	case vBool:
		return v.n == 1
	case vInt:
		return v.n
	case vUint:
		return uint64(v.n)
	case vBig:
		return d.bigs[v.n]
	case vFloat:
		return math.Float64frombits(uint64(v.n))
	case vStr:
		return d.strs[v.n]
	case vBytes:
		return goBytes(d.strs[v.n])
	case vSkip:
		return skipped(v.n)
	case vCont:
		c := d.container(v)
		if c == nil {
			return skipped(pyDict)
		}
		if c.role != roleKeep || depth > maxDepth {
			return skipped(c.kind) // a part of the snapshot not kept whole, or too deep
		}
		if x, ok := g.seen[v.n]; ok {
			return x
		}
		switch c.kind {
		case pyDict:
			x := &goDict{items: make([]goItem, len(c.items)/2)}
			g.seen[v.n] = x
			for i := range x.items {
				x.items[i] = goItem{g.at(c.items[2*i], depth+1), g.at(c.items[2*i+1], depth+1)}
			}
			return x
		case pyList:
			x := make([]any, len(c.items))
			g.seen[v.n] = x
			for i, it := range c.items {
				x[i] = g.at(it, depth+1)
			}
			return x
		default:
			x := make([]any, len(c.items))
			var out any = goTuple(x)
			if c.kind != pyTuple {
				out = goSet(x)
			}
			g.seen[v.n] = out
			for i, it := range c.items {
				x[i] = g.at(it, depth+1)
			}
			return out
		}
	}
	return nil
}

// skipped stands for a container the decoder did not keep.
type skipped pyKind

// formatValue writes a decoded Python value as a setting string: str as
// is, bool "true"/"false", ints in decimal, floats in their shortest form,
// None as "", a dict as "k:v,k:v" sorted by key (numerically when every key
// is an integer), a list or tuple as "[a,b]". Containers nested deeper than
// maxDepth, and whatever comes after maxSettingLen bytes, are written as
// "..." (pickles can share values, and even make them contain themselves).
func formatValue(v any) string {
	f := formatter{left: maxSettingLen}
	return f.value(v, 0)
}

const (
	maxDepth      = 8
	maxSettingLen = 1 << 16
)

type formatter struct{ left int }

func (f *formatter) value(v any, depth int) string {
	if f.left <= 0 {
		return "..."
	}
	var s string
	switch x := v.(type) {
	case nil:
	case string:
		s = x
	case bool:
		s = strconv.FormatBool(x)
	case int:
		s = strconv.Itoa(x)
	case int64:
		s = strconv.FormatInt(x, 10)
	case uint64:
		s = strconv.FormatUint(x, 10)
	case *big.Int:
		s = x.String()
	case float64:
		s = strconv.FormatFloat(x, 'g', -1, 64)
	case *goDict, []any, goTuple, goSet:
		if depth >= maxDepth {
			return "..."
		}
		switch x := v.(type) {
		case *goDict:
			return f.dict(x.items, depth+1)
		case []any:
			return f.seq(x, depth+1)
		case goTuple:
			return f.seq(x, depth+1)
		case goSet:
			return f.seq(x, depth+1)
		}
	case goBytes:
		s = "bytes"
	case skipped:
		s = pyKindNames[x]
	default:
		s = "value"
	}
	f.left -= len(s) + 1
	return s
}

func (f *formatter) seq(vs []any, depth int) string {
	parts := make([]string, len(vs))
	for i, v := range vs {
		parts[i] = f.value(v, depth)
	}
	return "[" + strings.Join(parts, ",") + "]"
}

func (f *formatter) dict(d []goItem, depth int) string {
	type kv struct {
		key, val string
		num      *big.Int
	}
	items := make([]kv, 0, len(d))
	numeric := true
	for _, e := range d {
		it := kv{key: f.value(e.key, depth), val: f.value(e.val, depth)}
		if n, ok := new(big.Int).SetString(it.key, 10); ok {
			it.num = n
		} else {
			numeric = false
		}
		items = append(items, it)
	}
	sort.SliceStable(items, func(i, j int) bool {
		if numeric {
			return items[i].num.Cmp(items[j].num) < 0
		}
		return items[i].key < items[j].key
	})
	parts := make([]string, len(items))
	for i, it := range items {
		parts[i] = it.key + ":" + it.val
	}
	return strings.Join(parts, ",")
}

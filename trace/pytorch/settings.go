package pytorch

import (
	"math/big"
	"sort"
	"strconv"
	"strings"

	"github.com/nlpodyssey/gopickle/types"
)

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
	case *big.Int:
		s = x.String()
	case float64:
		s = strconv.FormatFloat(x, 'g', -1, 64)
	case *types.Dict, *types.List, *types.Tuple:
		if depth >= maxDepth {
			return "..."
		}
		switch x := v.(type) {
		case *types.Dict:
			return f.dict(*x, depth+1)
		case *types.List:
			return f.seq(*x, depth+1)
		case *types.Tuple:
			return f.seq(*x, depth+1)
		}
	default:
		s = pyType(v)
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

func (f *formatter) dict(d types.Dict, depth int) string {
	type kv struct {
		key, val string
		num      *big.Int
	}
	items := make([]kv, 0, len(d))
	numeric := true
	for _, e := range d {
		it := kv{key: f.value(e.Key, depth), val: f.value(e.Value, depth)}
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

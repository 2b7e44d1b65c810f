package policies

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"sort"
	"strconv"
	"strings"
)

// This file reads the pytorch policy's settings: the PYTORCH_CUDA_ALLOC_CONF
// string, parsed as PyTorch 2.11 parses it (c10/core/AllocatorConfig.cpp,
// AcceleratorAllocatorConfig::parseArgs and ConfigTokenizer, then
// c10/cuda/CUDAAllocatorConfig.cpp for the CUDA-only keys), and the
// settings a snapshot records (allocator_settings).

// Keys of the pytorch policy's settings (--set pytorch.KEY=VALUE). VALUE
// is written as in PYTORCH_CUDA_ALLOC_CONF; "conf" takes a whole
// PYTORCH_CUDA_ALLOC_CONF string, as if the program had run with it.
const (
	ptKeyConf               = "conf"
	ptKeyMaxSplit           = "max_split_size_mb"
	ptKeyMaxNonSplitRound   = "max_non_split_rounding_mb"
	ptKeyRoundup            = "roundup_power2_divisions"
	ptKeyGCThreshold        = "garbage_collection_threshold"
	ptKeyExpandableSegments = "expandable_segments"
)

// ptSettingKeys are the keys NewPyTorch takes, conf first.
var ptSettingKeys = []string{ptKeyConf, ptKeyMaxSplit, ptKeyMaxNonSplitRound, ptKeyRoundup, ptKeyGCThreshold, ptKeyExpandableSegments}

// ptConfKeys are the keys PyTorch 2.11 accepts in PYTORCH_CUDA_ALLOC_CONF:
// those of the device allocator shared by all accelerators, then the
// CUDA-only ones. Only the first five change placement; the others are
// checked and ignored.
var ptConfKeys = map[string]bool{
	ptKeyMaxSplit: true, ptKeyMaxNonSplitRound: true, ptKeyGCThreshold: true, ptKeyRoundup: true,
	ptKeyExpandableSegments: true, "pinned_use_background_threads": true,
	"backend": true, "release_lock_on_cudamalloc": true, "release_lock_on_hipmalloc": true,
	"pinned_use_cuda_host_register": true, "pinned_use_hip_host_register": true,
	"pinned_num_register_threads": true, "pinned_reserve_segment_size_mb": true,
	"graph_capture_record_stream_reuse": true,
}

// ptConfTokens is a settings string cut into tokens as PyTorch's
// ConfigTokenizer cuts it: each of , : [ ] is a token of its own, white
// space is dropped, and whatever lies between is a token.
type ptConfTokens []string

func lexPytorchConf(s string) ptConfTokens {
	var toks ptConfTokens
	var buf strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case ',', ':', '[', ']':
			if buf.Len() > 0 {
				toks = append(toks, buf.String())
				buf.Reset()
			}
			toks = append(toks, string(c))
		case ' ', '\t', '\n', '\v', '\f', '\r':
		default:
			buf.WriteByte(c)
		}
	}
	if buf.Len() > 0 {
		toks = append(toks, buf.String())
	}
	return toks
}

// at returns token i, or an error naming key when the string ends before.
func (t ptConfTokens) at(i int, key string) (string, error) {
	if i >= len(t) {
		return "", fmt.Errorf("%s: the settings end before its value", key)
	}
	return t[i], nil
}

// sizeT reads token i as std::stoull does: an optional sign, decimal
// digits, anything after them ignored ("128MB" is 128); a minus sign
// wraps around. No digits, or too many, is an error naming key.
func (t ptConfTokens) sizeT(i int, key string) (uint64, error) {
	s, err := t.at(i, key)
	if err != nil {
		return 0, err
	}
	j, neg := 0, false
	if j < len(s) && (s[j] == '+' || s[j] == '-') {
		neg = s[j] == '-'
		j++
	}
	k := j
	for k < len(s) && '0' <= s[k] && s[k] <= '9' {
		k++
	}
	if k == j {
		return 0, fmt.Errorf("%s: %q is not a number", key, s)
	}
	v, err := strconv.ParseUint(s[j:k], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %q is out of range", key, s)
	}
	if neg {
		v = -v
	}
	return v, nil
}

// double reads token i as std::stod does: the longest prefix that is a
// floating-point number (decimal, hexadecimal, inf or nan).
func (t ptConfTokens) double(i int, key string) (float64, error) {
	s, err := t.at(i, key)
	if err != nil {
		return 0, err
	}
	for n := len(s); n > 0; n-- {
		p := s[:n]
		if strings.ContainsRune(p, '_') {
			continue // Go's literal syntax, not strtod's
		}
		v, err := strconv.ParseFloat(p, 64)
		if err == nil {
			return v, nil
		}
		if errors.Is(err, strconv.ErrRange) {
			return 0, fmt.Errorf("%s: %q is out of range", key, s)
		}
	}
	return 0, fmt.Errorf("%s: %q is not a number", key, s)
}

// boolean reads token i, which must be True or False (PyTorch takes no
// other spelling).
func (t ptConfTokens) boolean(i int, key string) (bool, error) {
	s, err := t.at(i, key)
	if err != nil {
		return false, err
	}
	switch s {
	case "True":
		return true, nil
	case "False":
		return false, nil
	}
	return false, fmt.Errorf("%s: want True or False, got %q", key, s)
}

// skipKey steps over the key at i and its value, a single token or a
// bracketed list, and returns the index of the value's last token.
func (t ptConfTokens) skipKey(i int) (int, error) {
	key := t[i]
	i += 2 // the colon (not checked, as in PyTorch), then the value
	v, err := t.at(i, key)
	if err != nil || v != "[" {
		return i, err
	}
	for i++; i < len(t) && t[i] != "]"; i++ {
	}
	if i >= len(t) {
		return i, fmt.Errorf("%s: no closing ]", key)
	}
	return i, nil
}

// parsePytorchConf reads s, a PYTORCH_CUDA_ALLOC_CONF string, into cfg as
// PyTorch 2.11 does: keys and values separated by colons, pairs by commas
// (neither checked: PyTorch steps over whatever token stands there), white
// space ignored, True and False spelled so. The device-allocator keys are
// read first, then the CUDA-only ones (checked, and ignored here as they
// do not change placement). backend:cudaMallocAsync, which replaces the
// caching allocator, is an error, as are unknown keys and bad values; each
// error names its key.
func parsePytorchConf(s string, cfg *pytorchConfig) error {
	toks := lexPytorchConf(s)
	for pass := 0; pass < 2; pass++ {
		for i := 0; i < len(toks); i++ {
			key := toks[i]
			if !ptConfKeys[key] {
				return fmt.Errorf("unknown key %q", key)
			}
			var err error
			if pass == 0 {
				i, err = toks.parseAcceleratorKey(i, cfg)
			} else {
				i, err = toks.parseCUDAKey(i)
			}
			if err != nil {
				return err
			}
			i++ // the comma, not checked
		}
	}
	return nil
}

// parseAcceleratorKey reads the key at i if it is one of the device
// allocator's, else steps over it, and returns the index of its value's
// last token.
func (t ptConfTokens) parseAcceleratorKey(i int, cfg *pytorchConfig) (int, error) {
	key := t[i]
	switch key {
	case ptKeyMaxSplit, ptKeyMaxNonSplitRound:
		mb, err := t.sizeT(i+2, key)
		if err != nil {
			return i, err
		}
		const minMB = ptLargeBuffer / (1 << 20)
		if mb < minMB {
			return i, fmt.Errorf("%s: %d is too small, must be >= %d", key, mb, minMB)
		}
		b := min(mb, math.MaxUint64/(1<<20)) << 20
		if key == ptKeyMaxSplit {
			cfg.maxSplitSize = b
		} else {
			cfg.maxNonSplitRounding = b
		}
		return i + 2, nil
	case ptKeyGCThreshold:
		v, err := t.double(i+2, key)
		if err != nil {
			return i, err
		}
		if !(v > 0 && v < 1) {
			return i, fmt.Errorf("%s: %v is not in (0.0, 1.0)", key, v)
		}
		cfg.garbageCollectionThreshold = v
		return i + 2, nil
	case ptKeyRoundup:
		return t.parseRoundup(i, cfg)
	case ptKeyExpandableSegments:
		v, err := t.boolean(i+2, key)
		cfg.expandableSegments = v
		return i + 2, err
	case "pinned_use_background_threads":
		_, err := t.boolean(i+2, key)
		return i + 2, err
	}
	return t.skipKey(i)
}

// parseRoundup reads roundup_power2_divisions at i: one power of two for
// every interval, or a bracketed list of INTERVAL_MB:DIVISIONS where the
// first entry also sets the intervals below it, and ">" stands for every
// interval above the last one named.
func (t ptConfTokens) parseRoundup(i int, cfg *pytorchConfig) (int, error) {
	key := t[i]
	i += 2
	v, err := t.at(i, key)
	if err != nil {
		return i, err
	}
	if v != "[" {
		d, err := t.sizeT(i, key)
		if err != nil {
			return i, err
		}
		if !isPow2(d) {
			return i, fmt.Errorf("%s: %d divisions, must be a power of 2", key, d)
		}
		for k := range cfg.roundupDivisions {
			cfg.roundupDivisions[k] = d
		}
		return i, nil
	}
	first, last := true, 0
	for i++; i < len(t) && t[i] != "]"; i++ {
		at := i
		d, err := t.sizeT(i+2, key)
		if err != nil {
			return i, err
		}
		i += 2
		if d != 0 && !isPow2(d) {
			return i, fmt.Errorf("%s: %d divisions, must be a power of 2 or 0", key, d)
		}
		if t[at] == ">" {
			for k := last + 1; k < ptRoundupIntervals; k++ {
				cfg.roundupDivisions[k] = d
			}
		} else {
			mb, err := t.sizeT(at, key)
			if err != nil {
				return i, err
			}
			if !isPow2(mb) {
				return i, fmt.Errorf("%s: interval %d MiB, must be a power of 2", key, mb)
			}
			k := min(bits.Len64(mb)-1, ptRoundupIntervals-1)
			if first {
				for j := 0; j < k; j++ {
					cfg.roundupDivisions[j] = d
				}
				first = false
			}
			cfg.roundupDivisions[k] = d
			last = k
		}
		next, err := t.at(i+1, key)
		if err != nil {
			return i, fmt.Errorf("%s: no closing ]", key)
		}
		if next != "]" {
			i++ // the comma, not checked
		}
	}
	if i >= len(t) {
		return i, fmt.Errorf("%s: no closing ]", key)
	}
	return i, nil
}

// parseCUDAKey checks the key at i if it is one of the CUDA allocator's,
// else steps over it, and returns the index of its value's last token.
func (t ptConfTokens) parseCUDAKey(i int) (int, error) {
	key := t[i]
	switch key {
	case "backend":
		v, err := t.at(i+2, key)
		if err != nil {
			return i, err
		}
		switch v {
		case "native":
			return i + 2, nil
		case "cudaMallocAsync":
			return i, fmt.Errorf("backend: cudaMallocAsync replaces the caching allocator, which the pytorch policy simulates")
		}
		return i, fmt.Errorf("backend: unknown backend %q, want native or cudaMallocAsync", v)
	case "release_lock_on_cudamalloc", "release_lock_on_hipmalloc",
		"pinned_use_cuda_host_register", "pinned_use_hip_host_register", "graph_capture_record_stream_reuse":
		_, err := t.boolean(i+2, key)
		return i + 2, err
	case "pinned_num_register_threads":
		n, err := t.sizeT(i+2, key)
		if err != nil {
			return i, err
		}
		if !isPow2(n) || n > 128 {
			return i, fmt.Errorf("%s: %d, must be a power of 2 up to 128", key, n)
		}
		return i + 2, nil
	case "pinned_reserve_segment_size_mb":
		n, err := t.sizeT(i+2, key)
		if err == nil && n == 0 {
			err = fmt.Errorf("%s: must be greater than 0", key)
		}
		return i + 2, err
	}
	return t.skipKey(i)
}

func isPow2(v uint64) bool { return v != 0 && v&(v-1) == 0 }

// pytorchSettings reads the pytorch policy's settings into a config: conf
// first (from the defaults), then each single key over it. Errors name
// the key and give its value.
func pytorchSettings(s Settings) (pytorchConfig, error) {
	cfg := defaultPytorchConfig()
	if err := s.Check("pytorch", ptSettingKeys...); err != nil {
		return cfg, err
	}
	if conf, ok := s[ptKeyConf]; ok {
		if err := parsePytorchConf(conf, &cfg); err != nil {
			return cfg, fmt.Errorf("policy pytorch: setting conf=%q: %v", conf, err)
		}
	}
	for _, key := range ptSettingKeys[1:] {
		v, ok := s[key]
		if !ok {
			continue
		}
		toks := append(ptConfTokens{key, ":"}, lexPytorchConf(v)...)
		end, err := toks.parseAcceleratorKey(0, &cfg)
		if err == nil && end != len(toks)-1 {
			err = fmt.Errorf("%s: %q is more than one value", key, v)
		}
		if err != nil {
			return cfg, fmt.Errorf("policy pytorch: setting %s=%q: %v", key, v, err)
		}
	}
	return cfg, nil
}

// pytorchRecorded is the pytorch policy's RecordedFunc: the settings of a
// PyTorch snapshot's allocator_settings (trace/pytorch flattens them into
// the header), as explicit keys that differ from the defaults, with the
// user's over them; a user's conf replaces the recorded settings whole.
//
// max_split_size, roundup_power2_divisions, garbage_collection_threshold
// and expandable_segments are the allocator's own record of what it used;
// max_non_split_rounding_mb, which it does not record, comes from the
// PYTORCH_CUDA_ALLOC_CONF string. A snapshot with that string alone gives
// it as conf.
func pytorchRecorded(source string, rec map[string]string, user Settings) (Settings, bool, error) {
	if source != "pytorch" {
		return user, false, nil
	}
	out := Settings{}
	if _, ok := user[ptKeyConf]; !ok {
		var err error
		if out, err = pytorchFromSnapshot(rec); err != nil {
			return user, false, err
		}
	}
	for k, v := range user {
		out[k] = v
	}
	return out, true, nil
}

func pytorchFromSnapshot(rec map[string]string) (Settings, error) {
	out := Settings{}
	raw := rec["PYTORCH_CUDA_ALLOC_CONF"]
	if _, ok := rec["max_split_size"]; !ok {
		if raw != "" {
			out[ptKeyConf] = raw
		}
		return out, nil
	}
	bad := func(key string) error {
		return fmt.Errorf("recorded allocator setting %s=%q: not understood", key, rec[key])
	}
	if v := rec["max_split_size"]; v != "-1" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil || n%(1<<20) != 0 {
			return nil, bad("max_split_size")
		}
		out[ptKeyMaxSplit] = strconv.FormatUint(n>>20, 10)
	}
	if v := rec[ptKeyRoundup]; v != "" {
		divs, err := parseRecordedRoundup(v)
		if err != nil {
			return nil, bad(ptKeyRoundup)
		}
		if divs != "" {
			out[ptKeyRoundup] = divs
		}
	}
	if v := rec[ptKeyGCThreshold]; v != "" && v != "0" {
		out[ptKeyGCThreshold] = v
	}
	switch rec[ptKeyExpandableSegments] {
	case "true":
		out[ptKeyExpandableSegments] = "True"
	case "false", "":
	default:
		return nil, bad(ptKeyExpandableSegments)
	}
	if raw != "" {
		cfg := defaultPytorchConfig()
		if parsePytorchConf(raw, &cfg) == nil && cfg.maxNonSplitRounding != ptLargeBuffer {
			out[ptKeyMaxNonSplitRound] = strconv.FormatUint(cfg.maxNonSplitRounding>>20, 10)
		}
	}
	return out, nil
}

// parseRecordedRoundup turns a snapshot's roundup_power2_divisions, as
// trace/pytorch writes it ("1:0,2:0,4:8,...": interval start in MiB, then
// divisions), into the bracketed form, every interval named; "" when all
// are 0.
func parseRecordedRoundup(v string) (string, error) {
	type entry struct{ mb, d uint64 }
	var es []entry
	nonzero := false
	for _, kv := range strings.Split(v, ",") {
		k, d, ok := strings.Cut(kv, ":")
		mb, err1 := strconv.ParseUint(k, 10, 64)
		n, err2 := strconv.ParseUint(d, 10, 64)
		if !ok || err1 != nil || err2 != nil || !isPow2(mb) {
			return "", fmt.Errorf("bad entry %q", kv)
		}
		nonzero = nonzero || n != 0
		es = append(es, entry{mb, n})
	}
	if !nonzero {
		return "", nil
	}
	sort.Slice(es, func(i, j int) bool { return es[i].mb < es[j].mb })
	parts := make([]string, len(es))
	for i, e := range es {
		parts[i] = fmt.Sprintf("%d:%d", e.mb, e.d)
	}
	return "[" + strings.Join(parts, ",") + "]", nil
}

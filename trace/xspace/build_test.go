package xspace

import (
	"bytes"
	"compress/gzip"
	"math"

	"google.golang.org/protobuf/encoding/protowire"
)

// This file builds small XSpaces by hand, field by field, as the XLA
// profiler serializes them (xplane.proto's field numbers, in field order:
// a plane's lines before its metadata), for the tests.

// xstat is a stat: its name and value, an int64 (int64_value), a uint64
// (uint64_value), a float64 (double_value), a string (str_value) or a ref
// (ref_value: the id of the stat metadata with that name).
type xstat struct {
	name string
	val  any
}

type ref string

// xevent is an event: the name of its metadata, its offset_ps, its stats.
type xevent struct {
	name  string
	ps    int64
	stats []xstat
}

type xline struct {
	id    uint64
	ts    int64 // timestamp_ns
	evs   []xevent
	tsEnd bool // write timestamp_ns after the events
}

type xplane struct {
	name  string
	lines []xline
	stats []xstat
	// metaFirst writes the metadata before the lines.
	metaFirst bool
}

// ids numbers names from 1, in order of first use.
type ids struct {
	byName map[string]uint64
	names  []string
}

func (m *ids) id(name string) uint64 {
	if m.byName == nil {
		m.byName = map[string]uint64{}
	}
	if id, ok := m.byName[name]; ok {
		return id
	}
	m.names = append(m.names, name)
	m.byName[name] = uint64(len(m.names))
	return uint64(len(m.names))
}

func appendMessage(b []byte, num protowire.Number, msg []byte) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, msg)
}

func appendVarint(b []byte, num protowire.Number, v uint64) []byte {
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

func encodeStat(s xstat, stats *ids) []byte {
	b := appendVarint(nil, statMetadataID, stats.id(s.name))
	switch v := s.val.(type) {
	case int:
		b = appendVarint(b, statInt64, uint64(int64(v)))
	case int64:
		b = appendVarint(b, statInt64, uint64(v))
	case uint64:
		b = appendVarint(b, statUint64, v)
	case float64:
		b = protowire.AppendTag(b, statDouble, protowire.Fixed64Type)
		b = protowire.AppendFixed64(b, math.Float64bits(v))
	case string:
		b = appendMessage(b, statStr, []byte(v))
	case ref:
		b = appendVarint(b, statRef, stats.id(string(v)))
	default:
		panic("stat value of unknown type")
	}
	return b
}

func (p xplane) encode() []byte {
	var events, stats ids
	var lines []byte
	for _, l := range p.lines {
		line := appendVarint(nil, lineID, l.id)
		if !l.tsEnd {
			line = appendVarint(line, lineTimestamp, uint64(l.ts))
		}
		for _, e := range l.evs {
			ev := appendVarint(nil, eventMetadataID, events.id(e.name))
			ev = appendVarint(ev, eventOffset, uint64(e.ps))
			for _, s := range e.stats {
				ev = appendMessage(ev, eventStats, encodeStat(s, &stats))
			}
			line = appendMessage(line, lineEvents, ev)
		}
		if l.tsEnd {
			line = appendVarint(line, lineTimestamp, uint64(l.ts))
		}
		lines = appendMessage(lines, planeLines, line)
	}
	var pstats []byte
	for _, s := range p.stats {
		pstats = appendMessage(pstats, planeStats, encodeStat(s, &stats))
	}
	var meta []byte
	for k, name := range events.names {
		v := appendVarint(nil, metadataID, uint64(k+1))
		v = appendMessage(v, metadataName, []byte(name))
		entry := appendVarint(nil, mapKey, uint64(k+1))
		entry = appendMessage(entry, mapValue, v)
		meta = appendMessage(meta, planeEventMetadata, entry)
	}
	for k, name := range stats.names {
		v := appendVarint(nil, metadataID, uint64(k+1))
		v = appendMessage(v, metadataName, []byte(name))
		entry := appendVarint(nil, mapKey, uint64(k+1))
		entry = appendMessage(entry, mapValue, v)
		meta = appendMessage(meta, planeStatMetadata, entry)
	}
	b := appendMessage(nil, planeName, []byte(p.name))
	if p.metaFirst {
		b = append(b, meta...)
		b = append(b, lines...)
	} else {
		b = append(b, lines...)
		b = append(b, meta...)
	}
	return append(b, pstats...)
}

// space encodes an XSpace of the planes.
func space(planes ...xplane) []byte {
	var b []byte
	for _, p := range planes {
		b = appendMessage(b, spacePlanes, p.encode())
	}
	return b
}

func gzipped(b []byte) []byte {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write(b)
	zw.Close()
	return buf.Bytes()
}

// bfcEvent returns a MemoryAllocation (alloc) or MemoryDeallocation at
// offset ps on allocator, of the chunk at addr (requested bytes, chunk
// bytes), with BFC's figures after it: allocated bytes in use, peak, and
// the limit less both as bytes_available, as bfc_allocator.cc logs them
// (allocator_name a ref, the others int64, fragmentation a double).
func bfcEvent(alloc bool, ps int64, allocator string, addr, requested, chunk, allocated, peak, limit int64) xevent {
	name := deallocName
	if alloc {
		name = allocName
	}
	return xevent{name: name, ps: ps, stats: []xstat{
		{"allocator_name", ref(allocator)},
		{"bytes_reserved", 0},
		{"bytes_allocated", allocated},
		{"bytes_available", limit - allocated},
		{"fragmentation", 0.25},
		{"peak_bytes_in_use", peak},
		{"requested_bytes", requested},
		{"allocation_bytes", chunk},
		{"addr", addr},
		{"id", 0},
		{"data_type", 0},
	}}
}

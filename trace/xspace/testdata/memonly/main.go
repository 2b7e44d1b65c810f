// Command memonly writes a small XSpace that holds only the allocator
// events of a real one, for the tests of package xspace:
//
//	go run ./trace/xspace/testdata/memonly IN.xplane.pb[.gz] OUT.xplane.pb.gz
//
// Of each plane that has MemoryAllocation or MemoryDeallocation events it
// keeps those events, byte for byte, on their lines (each line's own
// fields, its other events left out; lines without such events dropped),
// with their event metadata and the stat metadata their stats name; of
// each /device: plane and of /host:metadata it keeps the name and the
// stats (the GPU's name and memory, the versions), with the stat metadata
// they name. Other planes are dropped, and so are the XSpace's other
// fields but its hostnames. The output is gzip-compressed.
//
// testdata/train.bfc.mem.xplane.pb.gz was made so from the XSpace of the
// train workload of testdata/jax/record.py (the run whose memory_stats()
// are testdata/jax/train.bfc.json: JAX 0.11.2, XLA's BFC preallocated, an
// NVIDIA H200), train.bfc.xplane.pb, 14093011 bytes.
package main

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"strings"

	"google.golang.org/protobuf/encoding/protowire"
)

type field struct {
	num protowire.Number
	typ protowire.Type
	raw []byte // the whole field, tag included
	val []byte // a bytes field's value
	v   uint64 // a varint's value
}

func fields(b []byte) ([]field, error) {
	var out []field
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return nil, protowire.ParseError(m)
		}
		f := field{num: num, typ: typ, raw: b[:n+m]}
		switch typ {
		case protowire.BytesType:
			f.val, _ = protowire.ConsumeBytes(b[n:])
		case protowire.VarintType:
			f.v, _ = protowire.ConsumeVarint(b[n:])
		}
		out = append(out, f)
		b = b[n+m:]
	}
	return out, nil
}

func must[T any](v T, err error) T {
	if err != nil {
		fmt.Fprintln(os.Stderr, "memonly:", err)
		os.Exit(1)
	}
	return v
}

// entry returns a metadata map entry's key and its value's name.
func entry(b []byte) (uint64, string) {
	var key uint64
	var name string
	for _, f := range must(fields(b)) {
		switch f.num {
		case 1:
			key = f.v
		case 2:
			for _, g := range must(fields(f.val)) {
				if g.num == 2 {
					name = string(g.val)
				}
			}
		}
	}
	return key, name
}

// statRefs adds the stat metadata ids a stat names to refs.
func statRefs(b []byte, refs map[uint64]bool) {
	for _, f := range must(fields(b)) {
		if f.num == 1 || f.num == 7 { // metadata_id, ref_value
			refs[f.v] = true
		}
	}
}

func plane(b []byte) []byte {
	fs := must(fields(b))
	var name string
	mem := map[uint64]bool{}
	for _, f := range fs {
		switch f.num {
		case 2:
			name = string(f.val)
		case 4:
			if k, n := entry(f.val); n == "MemoryAllocation" || n == "MemoryDeallocation" {
				mem[k] = true
			}
		}
	}
	keepStats := strings.HasPrefix(name, "/device:") || name == "/host:metadata"
	if len(mem) == 0 && !keepStats {
		return nil
	}
	refs := map[uint64]bool{}
	var lines [][]byte
	for _, f := range fs {
		if f.num != 3 {
			continue
		}
		var line []byte
		kept := 0
		for _, g := range must(fields(f.val)) {
			if g.num != 4 {
				line = append(line, g.raw...)
				continue
			}
			var id uint64
			evf := must(fields(g.val))
			for _, e := range evf {
				if e.num == 1 {
					id = e.v
				}
			}
			if !mem[id] {
				continue
			}
			for _, e := range evf {
				if e.num == 4 {
					statRefs(e.val, refs)
				}
			}
			line = append(line, g.raw...)
			kept++
		}
		if kept > 0 {
			lines = append(lines, line)
		}
	}
	for _, f := range fs {
		if f.num == 6 {
			statRefs(f.val, refs)
		}
	}
	var out []byte
	for _, f := range fs {
		switch f.num {
		case 1, 2:
			out = append(out, f.raw...)
		}
	}
	for _, l := range lines {
		out = protowire.AppendTag(out, 3, protowire.BytesType)
		out = protowire.AppendBytes(out, l)
	}
	for _, f := range fs {
		switch f.num {
		case 4:
			if k, _ := entry(f.val); mem[k] {
				out = append(out, f.raw...)
			}
		case 5:
			if k, _ := entry(f.val); refs[k] {
				out = append(out, f.raw...)
			}
		}
	}
	for _, f := range fs {
		if f.num == 6 {
			out = append(out, f.raw...)
		}
	}
	return out
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: memonly IN.xplane.pb[.gz] OUT.xplane.pb.gz")
		os.Exit(2)
	}
	raw := must(os.ReadFile(os.Args[1]))
	if bytes.HasPrefix(raw, []byte{0x1f, 0x8b}) {
		zr := must(gzip.NewReader(bytes.NewReader(raw)))
		raw = must(io.ReadAll(zr))
	}
	var space []byte
	for _, f := range must(fields(raw)) {
		switch f.num {
		case 1:
			if p := plane(f.val); p != nil {
				space = protowire.AppendTag(space, 1, protowire.BytesType)
				space = protowire.AppendBytes(space, p)
			}
		case 4: // hostnames
			space = append(space, f.raw...)
		}
	}
	var buf bytes.Buffer
	zw := must(gzip.NewWriterLevel(&buf, gzip.BestCompression))
	zw.Write(space)
	must(0, zw.Close())
	must(0, os.WriteFile(os.Args[2], buf.Bytes(), 0o644))
	fmt.Printf("%s: %d bytes (%d uncompressed)\n", os.Args[2], buf.Len(), len(space))
}

// Command gochild is the benchmark's Go child: one huge segment, bump
// placement, frees ignored, answers written as the protocol allows (flushed
// only when the engine waits): the protocol's cost with a child that
// costs next to nothing. The test builds it from this file. With the
// argument "echo" it speaks no protocol and echoes each line at once,
// flushed: the floor of a round trip over the pipes.
package main

import (
	"bufio"
	"bytes"
	"os"
	"strconv"
)

func main() {
	in := bufio.NewReaderSize(os.Stdin, 64<<10)
	out := bufio.NewWriterSize(os.Stdout, 64<<10)
	if len(os.Args) > 1 && os.Args[1] == "echo" {
		for {
			line, err := in.ReadSlice('\n')
			if err != nil {
				return
			}
			out.Write(line)
			out.Flush()
		}
	}
	out.WriteString("allocsim-policy 1 gochild\n")
	out.Flush()
	var top uint64
	var num []byte
	for {
		line, err := in.ReadSlice('\n')
		if err != nil {
			return
		}
		verb, rest, _ := bytes.Cut(line[:len(line)-1], []byte(" "))
		if string(verb) != "malloc" {
			continue
		}
		s, _, _ := bytes.Cut(rest, []byte(" "))
		size, _ := strconv.ParseUint(string(s), 10, 64)
		if top == 0 {
			out.WriteString("device_alloc 1125899906842624\n")
			out.Flush()
			a, _ := in.ReadSlice('\n')
			top, _ = strconv.ParseUint(string(a[3:len(a)-1]), 10, 64)
		}
		num = append(strconv.AppendUint(append(num[:0], "ok "...), top, 10), '\n')
		out.Write(num)
		out.Flush()
		top += max(size, 1)
	}
}

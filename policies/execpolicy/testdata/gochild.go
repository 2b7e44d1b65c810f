// Command gochild is the benchmark's Go child: one huge segment, bump
// placement, frees ignored, answers written as the protocol allows (flushed
// only when it would wait for the engine): the protocol's cost with a
// child that costs next to nothing. It asks for the hook pipeline, so that
// the mallocs told ahead come without a round trip each; with the argument
// "nopipeline" it does not. The test builds it from this file. With the
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
	pipeline := len(os.Args) < 2 || os.Args[1] != "nopipeline"
	if pipeline {
		out.WriteString("allocsim-policy 1 gochild pipeline\n")
	} else {
		out.WriteString("allocsim-policy 1 gochild\n")
	}
	out.Flush()
	var top uint64
	var num []byte
	var early [][]byte // event lines read while waiting for the device's answer
	for {
		var line []byte
		if len(early) > 0 {
			line, early = early[0], early[1:]
		} else {
			if in.Buffered() == 0 {
				out.Flush() // the engine may be waiting for an answer
			}
			l, err := in.ReadSlice('\n')
			if err != nil {
				return
			}
			line = l
		}
		verb, rest, _ := bytes.Cut(line[:len(line)-1], []byte(" "))
		if string(verb) != "malloc" {
			continue // frees are ignored, free_malloc as free
		}
		s, _, _ := bytes.Cut(rest, []byte(" "))
		size, _ := strconv.ParseUint(string(s), 10, 64)
		if top == 0 {
			out.WriteString("device_alloc 1125899906842624\n")
			out.Flush()
			for {
				a, err := in.ReadSlice('\n')
				if err != nil {
					return
				}
				if bytes.HasPrefix(a, []byte("ok ")) {
					top, _ = strconv.ParseUint(string(a[3:len(a)-1]), 10, 64)
					break
				}
				early = append(early, bytes.Clone(a))
			}
		}
		num = append(strconv.AppendUint(append(num[:0], "ok "...), top, 10), '\n')
		out.Write(num)
		if !pipeline {
			out.Flush()
		}
		top += max(size, 1)
	}
}

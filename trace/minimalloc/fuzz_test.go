package minimalloc

import (
	"bytes"
	"strings"
	"testing"
)

// FuzzRead: any bytes read as a MiniMalloc CSV give buffers or one
// error, one line, naming the file; never a panic.
func FuzzRead(f *testing.F) {
	f.Add([]byte("id,lower,upper,size\n1,0,2,100\n2,1,3,25\n"))
	f.Add([]byte("lower,upper,size\n0,10,5\n"))
	f.Add([]byte("id,lower,upper,size\n1,5,2,100\n"))
	// Aliases, an inclusive end, quoted fields, blank lines, a NUL byte.
	f.Add([]byte("\xef\xbb\xbfbuffer,start,end,size,alignment\n\"a,b\",0,1,5,8\n\nc,1,1,7,1\n"))
	f.Add([]byte("id,lower,upper,size\n1,0,2,1\x00\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		bufs, err := Read(bytes.NewReader(b), "fuzz.csv")
		if err != nil {
			if msg := err.Error(); strings.Contains(msg, "\n") || !strings.Contains(msg, "fuzz.csv") {
				t.Fatalf("error %q: not one line naming the file", msg)
			}
			return
		}
		for _, x := range bufs {
			if x.Upper <= x.Lower {
				t.Fatalf("buffer %+v: empty lifetime accepted", x)
			}
		}
	})
}

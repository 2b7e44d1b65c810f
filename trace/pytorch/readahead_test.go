package pytorch

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"testing/iotest"
)

// TestReadahead: the bytes of the reader come through whole and in order,
// whatever sizes it reads in, and then its error as it gave it: io.EOF,
// or another after the bytes it read before failing.
func TestReadahead(t *testing.T) {
	data := make([]byte, 3*aheadSize+12345)
	for i := range data {
		data[i] = byte(i * 7)
	}
	bad := errors.New("disk on fire")
	for _, tc := range []struct {
		name string
		r    io.Reader
		want error
	}{
		{"whole", bytes.NewReader(data), nil},
		{"one byte at a time", iotest.OneByteReader(bytes.NewReader(data[:5000])), nil},
		{"halves", iotest.HalfReader(bytes.NewReader(data)), nil},
		{"error", io.MultiReader(bytes.NewReader(data), iotest.ErrReader(bad)), bad},
		{"empty", bytes.NewReader(nil), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ra := newReadahead(tc.r)
			defer ra.close()
			got, err := io.ReadAll(iotest.HalfReader(ra))
			if err != tc.want {
				t.Fatalf("error %v, want %v", err, tc.want)
			}
			want := data
			if tc.name == "one byte at a time" {
				want = data[:5000]
			} else if tc.name == "empty" {
				want = nil
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%d bytes read, want %d as they were", len(got), len(want))
			}
		})
	}
}

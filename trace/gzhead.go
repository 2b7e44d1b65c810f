package trace

import (
	"bytes"
	"compress/gzip"
	"io"
)

// GunzipHead returns the start of what head, the first bytes of a file,
// decompress to when they begin a gzip stream (as far as they go, at most
// 4 KiB), and head itself otherwise, for the detection of a format by the
// content under a compression. A gzip header head cannot hold whole gives
// nil.
func GunzipHead(head []byte) []byte {
	if len(head) < 2 || head[0] != 0x1f || head[1] != 0x8b {
		return head
	}
	zr, err := gzip.NewReader(bytes.NewReader(head))
	if err != nil {
		return nil
	}
	buf := make([]byte, 4096)
	n, _ := io.ReadFull(zr, buf)
	return buf[:n]
}

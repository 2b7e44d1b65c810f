package trace

import (
	"bytes"
	"compress/gzip"
	"testing"
)

func TestGunzipHead(t *testing.T) {
	var z bytes.Buffer
	zw := gzip.NewWriter(&z)
	zw.Write([]byte(`{"schemaVersion": 1}`))
	zw.Close()
	if got := string(GunzipHead(z.Bytes())); got != `{"schemaVersion": 1}` {
		t.Errorf("gzip'd head: %q", got)
	}
	if got := string(GunzipHead([]byte("plain"))); got != "plain" {
		t.Errorf("plain head: %q", got)
	}
	if got := GunzipHead(z.Bytes()[:5]); got != nil {
		t.Errorf("a cut gzip header: %q, want nil", got)
	}
}

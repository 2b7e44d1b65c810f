package sopolicy_test

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestDocListsShim checks that docs/so-policy.md names every CUDA function
// the shim serves, so that the page's table cannot drift from it.
func TestDocListsShim(t *testing.T) {
	shim, err := os.ReadFile("shim/cudashim.c")
	if err != nil {
		t.Fatal(err)
	}
	page, err := os.ReadFile("../../docs/so-policy.md")
	if err != nil {
		t.Fatal(err)
	}
	fns := regexp.MustCompile(`(?m)^(?:int|const char \*)\s*(cu\w+)\(`).FindAllSubmatch(shim, -1)
	if len(fns) < 20 {
		t.Fatalf("found %d functions in the shim, want at least 20", len(fns))
	}
	for _, m := range fns {
		name := string(m[1])
		short := strings.TrimSuffix(name, "_v2") + "(_v2)"
		if !strings.Contains(string(page), "`"+name) && !strings.Contains(string(page), short) {
			t.Errorf("docs/so-policy.md does not name %s", name)
		}
	}
}

package cli

import "github.com/gpualloc/allocsim/internal/termsafe"

// Safe returns s as a terminal may show it (termsafe.String).
func Safe(s string) string { return termsafe.String(s) }

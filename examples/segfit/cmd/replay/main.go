// Command replay is allocsim's replay command with the segfit policy in
// it: `go run ./cmd/replay sim --policy segfit,pytorch TRACE`.
package main

import (
	"github.com/gpualloc/allocsim/cmd/replay/replaycli"

	_ "example.com/segfit" // registers segfit
)

func main() { replaycli.Main() }

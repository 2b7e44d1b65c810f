package main

// The policies exec:COMMAND, a child process speaking a line protocol
// (docs/exec-protocol.md), registered by their package's init.
import _ "github.com/gpualloc/allocsim/policies/execpolicy"

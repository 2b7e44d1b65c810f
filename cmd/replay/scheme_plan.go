package main

// The plan: scheme of policies (--policy plan:COMMAND).
import _ "github.com/gpualloc/allocsim/policies/planpolicy"

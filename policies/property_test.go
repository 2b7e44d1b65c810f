package policies_test

import (
	"testing"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/policies/policytest"
)

// Every registered policy (policies.Names(), so that a policy added later
// is covered without a change here) passes the conformance kit
// (policytest.Run: its registry entry, its settings, and the property
// test over random traces under the invariant checker), as a policy of
// another module must.

// kitSettings are the settings the kit gives a policy: none, but for the
// offline and optimal searches' node budgets, kept small so that a
// hundred traces plan in well under a second (the search runs all the
// same); optimal's without a time limit, so that its plans are
// deterministic.
var kitSettings = map[string]policies.Settings{
	policies.OfflineName: {"nodes": "2000"},
	policies.OptimalName: {"nodes": "2000", "time": "0"},
}

func TestConformanceAllPolicies(t *testing.T) {
	for _, name := range policies.Names() {
		t.Run(name, func(t *testing.T) {
			policytest.Run(t, name, &policytest.Options{Settings: kitSettings[name]})
		})
	}
}

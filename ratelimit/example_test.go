package ratelimit_test

import (
	"fmt"

	"github.com/bulwark-pds/bulwark/ratelimit"
)

// Per-account write points: a create costs 3 against 5000 per hour and
// 35000 per day.
func ExampleLimiter_AllowN() {
	writes := ratelimit.MustNew(ratelimit.Config{
		Name:  ratelimit.PolicyRepoWrite,
		Rules: ratelimit.DefaultPolicies()[ratelimit.PolicyRepoWrite],
	})
	d := writes.AllowN("did:plc:ewvi7nxzyoun6zhxrhs64oiz", ratelimit.WriteCostCreate)
	fmt.Println(d.Allowed, d.Rule.Name, d.Remaining)
	// Output: true hour 4997
}

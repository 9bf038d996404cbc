package config

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/account"
	"github.com/bulwark-pds/bulwark/budget"
	"github.com/bulwark-pds/bulwark/ratelimit"
)

// TestRateLimitPolicies: empty is the reference PDS's limits, "off" is
// none, overrides replace one policy each; unknown policies and bad rules
// stop the server naming the setting.
func TestRateLimitPolicies(t *testing.T) {
	t.Parallel()
	c := DefaultConfig()
	p, err := c.RateLimitPolicies()
	require.NoError(t, err)
	require.Equal(t, ratelimit.DefaultPolicies(), p)

	c.RateLimits = "off"
	p, err = c.RateLimitPolicies()
	require.NoError(t, err)
	set, err := ratelimit.NewSet(p, 0)
	require.NoError(t, err)
	require.Empty(t, set.All())

	c.RateLimits = "global=10/1m; createSession=off;"
	p, err = c.RateLimitPolicies()
	require.NoError(t, err)
	require.Equal(t, 10, p[ratelimit.PolicyGlobal][0].Limit)
	require.Empty(t, p[ratelimit.PolicyCreateSession])
	require.Equal(t, ratelimit.DefaultPolicies()[ratelimit.PolicyRepoWrite], p[ratelimit.PolicyRepoWrite])

	for _, bad := range []string{"nosuch=1/1m", "global", "global=ten/1m", "global=10/never"} {
		c := DefaultConfig()
		c.DataDir = t.TempDir()
		c.RateLimits = bad
		require.ErrorContains(t, c.Finalize(), "BULWARK_RATELIMITS", bad)
	}
	c = DefaultConfig()
	c.DataDir = t.TempDir()
	c.RateLimitMaxKeys = 0
	require.ErrorContains(t, c.Finalize(), "BULWARK_RATELIMIT_MAX_KEYS")
	c = DefaultConfig()
	c.DataDir = t.TempDir()
	c.InflightQueue = -1
	require.ErrorContains(t, c.Finalize(), "BULWARK_INFLIGHT_QUEUE")
	for _, bad := range []func(*Config){
		func(c *Config) { c.PasswordQueue = -1 },
		func(c *Config) { c.PasswordWait = 0 },
		func(c *Config) { c.PasswordWait = time.Minute },
	} {
		c = DefaultConfig()
		c.DataDir = t.TempDir()
		bad(c)
		require.ErrorContains(t, c.Finalize(), "BULWARK_PASSWORD_")
	}
}

// TestInflightBudgetDefault: the default is the budget package's, so that
// the server and its documentation have one rule.
func TestInflightBudgetDefault(t *testing.T) {
	t.Parallel()
	c := DefaultConfig()
	c.DataDir = t.TempDir()
	require.NoError(t, c.Finalize())
	require.Equal(t, budget.DefaultCapacity(), c.InflightBudget)
	require.Equal(t, DefaultInflightQueue, c.InflightQueue)
}

// TestPasswordQueueDefaults: the defaults are the account package's.
func TestPasswordQueueDefaults(t *testing.T) {
	t.Parallel()
	require.Equal(t, account.DefaultPasswordQueue, DefaultPasswordQueue)
	require.Equal(t, account.DefaultPasswordWait, DefaultPasswordWait)
	require.Equal(t, DefaultPasswordQueue, DefaultConfig().PasswordQueue)
}

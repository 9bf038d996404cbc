package config

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/bulwark-pds/bulwark/budget"
	"github.com/bulwark-pds/bulwark/priority"
	"github.com/bulwark-pds/bulwark/ratelimit"
)

// RateLimitsOff is the --ratelimits value that turns every rate limit off
// (subscribeRepos keeps its own admission, --firehose-rate).
const RateLimitsOff = "off"

// DefaultInflightQueue is how many expensive requests may wait for the
// in-flight byte budget (and, separately, for a getRepo export slot)
// before the next is refused with 503.
const DefaultInflightQueue = budget.DefaultMaxQueue

// DefaultPasswordQueue and DefaultPasswordWait bound the password checks
// waiting for a hash slot, and how long each may wait: the account
// package's defaults (a test holds them equal; this package cannot import
// that one, which the repository engine's tests would then import too).
const (
	DefaultPasswordQueue = 64
	DefaultPasswordWait  = 5 * time.Second
)

// MaxPasswordWait is the largest --password-wait accepted: a client that
// waits longer for a login has given up already.
const MaxPasswordWait = 30 * time.Second

// DefaultBackgroundMaxPause is how long, at most, a background stream (a
// getRepo export, a blob download) pauses before each chunk while writes
// are in flight.
const DefaultBackgroundMaxPause = priority.DefaultMaxPause

// MaxBackgroundMaxPause is the largest --background-max-pause accepted:
// under a steady stream of writes an export moves one chunk per pause, so
// a long one would stall exports rather than slow them.
const MaxBackgroundMaxPause = time.Second

// DefaultCARCache is the disk kept for cached getRepo answers.
const DefaultCARCache = 1 << 30

// DefaultExportRate is the bytes a second all getRepo answers share (a
// quarter of a gigabit: plenty for relays and backfills, little enough
// that a scraper fleet cannot turn a small server's cores into export
// bandwidth).
const DefaultExportRate = 32 << 20

// DefaultRefusalCoolOff is how long, at most, a connection just answered
// 429 or 503 waits before its next request is read: the shortest
// Retry-After Bulwark gives.
const DefaultRefusalCoolOff = time.Second

// MaxRefusalCoolOff is the largest --refusal-cooloff accepted.
const MaxRefusalCoolOff = time.Minute

// RateLimitPolicies returns the rate-limit policies in force: the reference
// PDS's (ratelimit.DefaultPolicies) with the overrides of RateLimits
// applied, or none at all when RateLimits is "off".
//
// RateLimits is empty (the defaults), "off", or semicolon-separated
// overrides "policy=rules", the rules as ratelimit.ParseRules reads them,
// e.g. "global=6000/5m;createSession=10/5m,100/1d;uploadBlob=off". Semicolons
// separate policies because commas already separate one policy's windows.
func (c *Config) RateLimitPolicies() (map[string][]ratelimit.Rule, error) {
	return parseRateLimits(c.RateLimits)
}

func parseRateLimits(s string) (map[string][]ratelimit.Rule, error) {
	s = strings.TrimSpace(s)
	if s == RateLimitsOff {
		return map[string][]ratelimit.Rule{}, nil
	}
	policies := ratelimit.DefaultPolicies()
	for item := range strings.SplitSeq(s, ";") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, rules, ok := strings.Cut(item, "=")
		name = strings.TrimSpace(name)
		if !ok {
			return nil, fmt.Errorf("%q: want policy=rules, like global=3000/5m", item)
		}
		if _, known := policies[name]; !known {
			names := make([]string, 0, len(policies))
			for n := range ratelimit.DefaultPolicies() {
				names = append(names, n)
			}
			slices.Sort(names)
			return nil, fmt.Errorf("unknown policy %q (known: %s)", name, strings.Join(names, ", "))
		}
		parsed, err := ratelimit.ParseRules(rules)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		policies[name] = parsed
	}
	return policies, nil
}

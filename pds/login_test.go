package pds

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/ratelimit"
)

// TestLoginAddressLimit: one address trying many identifiers no account
// has (each a password hash) is refused before its 31st login under the
// default limits, with the RateLimit headers; another address is not.
func TestLoginAddressLimit(t *testing.T) {
	t.Parallel()
	e := limitedEnv(t, nil)
	u := e.createUser(t)
	limit := ratelimit.DefaultPolicies()[ratelimit.PolicyLoginAddress][0].Limit
	require.Equal(t, 30, limit)
	refusedAt := 0
	for i := range 60 {
		res := e.postFrom(t, "192.0.2.10", "com.atproto.server.createSession", "", map[string]any{
			"identifier": fmt.Sprintf("nobody%d.test", i), "password": "guess " + strconv.Itoa(i),
		})
		if res.status == http.StatusTooManyRequests {
			requireRefusal(t, res, limit)
			refusedAt = i + 1
			break
		}
		res.fails(t, http.StatusUnauthorized, "AuthenticationRequired")
	}
	require.NotZero(t, refusedAt, "60 logins from one address were never refused")
	require.LessOrEqual(t, refusedAt, limit+1, "refused only at login %d", refusedAt)

	// An IPv6 /64 is one address.
	for i := range limit {
		e.postFrom(t, fmt.Sprintf("2001:db8:1:2::%x", i+1), "com.atproto.server.createSession", "", map[string]any{
			"identifier": fmt.Sprintf("v6nobody%d.test", i), "password": "guess",
		}).fails(t, http.StatusUnauthorized, "AuthenticationRequired")
	}
	requireRefusal(t, e.postFrom(t, "2001:db8:1:2::ffff", "com.atproto.server.createSession", "", map[string]any{
		"identifier": u.handle, "password": u.pass,
	}), limit)

	e.postFrom(t, "192.0.2.11", "com.atproto.server.createSession", "", map[string]any{
		"identifier": u.handle, "password": u.pass,
	}).ok(t)
}

// TestLoginAccountBudgetShared: an account's login budget is one, whether
// it is named by handle, DID or email, and whatever address asks.
func TestLoginAccountBudgetShared(t *testing.T) {
	t.Parallel()
	const limit = 3
	e := limitedEnv(t, map[string]string{ratelimit.PolicyCreateSession: strconv.Itoa(limit) + "/5m"})
	u := e.createUser(t)
	email := "user" + u.handle[len("user"):len(u.handle)-len(".test")] + "@example.com"
	login := func(ip, identifier string) xrpcResult {
		return e.postFrom(t, ip, "com.atproto.server.createSession", "", map[string]any{"identifier": identifier, "password": u.pass})
	}
	login("192.0.2.20", u.handle).ok(t)
	login("192.0.2.21", u.did.String()).ok(t)
	login("192.0.2.22", email).ok(t)
	for i, id := range []string{u.handle, u.did.String(), email, strings.ToUpper(email)} {
		requireRefusal(t, login(fmt.Sprintf("192.0.2.%d", 30+i), id), limit)
	}

	// An unknown identifier has a budget of its own, shared by its forms.
	for i := range limit {
		e.postFrom(t, fmt.Sprintf("192.0.2.%d", 40+i), "com.atproto.server.createSession", "", map[string]any{
			"identifier": "Ghost.test", "password": "guess",
		}).fails(t, http.StatusUnauthorized, "AuthenticationRequired")
	}
	requireRefusal(t, e.postFrom(t, "192.0.2.50", "com.atproto.server.createSession", "", map[string]any{
		"identifier": " @ghost.TEST", "password": "guess",
	}), limit)
}

// TestLoginLongIdentifierKey: an identifier longer than any real one is
// keyed by its hash, so the limiter never stores the client's string.
func TestLoginLongIdentifierKey(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", 1000)
	key := loginKey(nil, long)
	require.LessOrEqual(t, len(key), maxIdentifierKey)
	require.Equal(t, key, loginKey(nil, " "+long+" "))
	require.Equal(t, "alice.test", loginKey(nil, " @Alice.TEST"))
}

// TestAdminAuthFailureLimit: wrong admin passwords from one address are
// refused with 429 and the RateLimit headers once the adminAuth limit is
// spent, even when the right password follows from there; the right
// password from another address still works, and successes never count.
func TestAdminAuthFailureLimit(t *testing.T) {
	t.Parallel()
	const limit = 3
	e := limitedEnv(t, map[string]string{ratelimit.PolicyAdminAuth: strconv.Itoa(limit) + "/5m"})
	admin := func(ip, password string) xrpcResult {
		h := from(ip)
		h.Set("Authorization", "Basic "+basic(AdminUser, password))
		return e.do(t, http.MethodGet, adminNS+"getInviteCodes", "", nil, url.Values{}, h)
	}
	// Successes do not count: more of them than the limit all pass.
	for range limit + 2 {
		admin("192.0.2.60", testAdminPassword).ok(t)
	}
	for range limit {
		admin("192.0.2.61", "not the admin password").fails(t, http.StatusUnauthorized, "AuthenticationRequired")
	}
	requireRefusal(t, admin("192.0.2.61", "not the admin password"), limit)
	requireRefusal(t, admin("192.0.2.61", testAdminPassword), limit)
	admin("192.0.2.62", testAdminPassword).ok(t)
	admin("192.0.2.60", testAdminPassword).ok(t)
}

package pds

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/ratelimit"
)

// limitedEnv is an account env whose server has the reference PDS's
// limits with overrides (policy → rules, as --ratelimits writes them), and
// which believes X-Forwarded-For from the loopback, so that a test can
// speak from several addresses.
func limitedEnv(t *testing.T, overrides map[string]string) *accountEnv {
	t.Helper()
	policies := ratelimit.DefaultPolicies()
	for name, rules := range overrides {
		parsed, err := ratelimit.ParseRules(rules)
		require.NoError(t, err)
		policies[name] = parsed
	}
	set, err := ratelimit.NewSet(policies, 0)
	require.NoError(t, err)
	return newAccountEnv(t, envOptions{
		configure: func(c *config.Config) {
			c.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}
		},
		options: func(o *Options) { o.Limits = set },
	})
}

// from is the header that makes a request come from ip.
func from(ip string) http.Header { return http.Header{"X-Forwarded-For": {ip}} }

func (e *accountEnv) postFrom(t *testing.T, ip, nsid, token string, in any) xrpcResult {
	t.Helper()
	return e.do(t, http.MethodPost, nsid, token, jsonBody(t, in), nil, from(ip))
}

// requireRefusal checks a 429 as the reference PDS sends it: the XRPC
// error, one value of each RateLimit header describing the refusing rule,
// and a Retry-After of at least a second.
func requireRefusal(t *testing.T, res xrpcResult, limit int) {
	t.Helper()
	res.fails(t, http.StatusTooManyRequests, "RateLimitExceeded")
	require.Equal(t, []string{strconv.Itoa(limit)}, res.header.Values(ratelimit.HeaderLimit))
	require.Len(t, res.header.Values(ratelimit.HeaderRemaining), 1)
	reset, err := strconv.ParseInt(res.header.Get(ratelimit.HeaderReset), 10, 64)
	require.NoError(t, err)
	require.Greater(t, reset, time.Now().Add(-time.Second).Unix())
	retry := res.header.Values(ratelimit.HeaderRetryAfter)
	require.Len(t, retry, 1)
	secs, err := strconv.Atoi(retry[0])
	require.NoError(t, err)
	require.GreaterOrEqual(t, secs, 1)
}

// TestCreateSessionRateLimit: createSession is limited per account. The
// N+1th login to one account is refused with the headers, whatever the
// address, case or password; another account from the same address still
// gets through.
func TestCreateSessionRateLimit(t *testing.T) {
	t.Parallel()
	const limit = 3
	e := limitedEnv(t, map[string]string{ratelimit.PolicyCreateSession: strconv.Itoa(limit) + "/5m"})
	u := e.createUser(t)
	other := e.createUser(t)
	login := func(ip, identifier, password string) xrpcResult {
		return e.postFrom(t, ip, "com.atproto.server.createSession", "", map[string]any{"identifier": identifier, "password": password})
	}

	for i := range limit {
		res := login("192.0.2.1", u.handle, u.pass).ok(t)
		require.Equal(t, strconv.Itoa(limit), res.header.Get(ratelimit.HeaderLimit))
		require.Equal(t, strconv.Itoa(limit-1-i), res.header.Get(ratelimit.HeaderRemaining))
	}
	refused := login("192.0.2.1", u.handle, u.pass)
	requireRefusal(t, refused, limit)
	require.Equal(t, "0", refused.header.Get(ratelimit.HeaderRemaining))
	// Case does not make a new key.
	requireRefusal(t, login("192.0.2.1", "USER"+u.handle[len("user"):], u.pass), limit)
	// Wrong passwords count too: the limit is what slows guessing.
	requireRefusal(t, login("192.0.2.1", u.handle, "wrong password"), limit)
	// Another address does not get a fresh budget for the account.
	requireRefusal(t, login("192.0.2.2", u.handle, u.pass), limit)

	login("192.0.2.1", other.handle, other.pass).ok(t)
}

// TestGlobalRateLimit: every XRPC method counts against the per-address
// limit before its body is read; _health does not, and other addresses
// are unaffected.
func TestGlobalRateLimit(t *testing.T) {
	t.Parallel()
	const limit = 4
	e := limitedEnv(t, map[string]string{ratelimit.PolicyGlobal: strconv.Itoa(limit) + "/5m"})
	describe := func(ip string) xrpcResult {
		return e.do(t, http.MethodGet, "com.atproto.server.describeServer", "", nil, nil, from(ip))
	}
	for range limit - 1 {
		describe("198.51.100.7").ok(t)
	}
	// A procedure with a malformed body: refused for the limit, not the
	// body, since the body is never read.
	e.do(t, http.MethodPost, "com.atproto.server.createSession", "", jsonBody(t, "not an object"), nil, from("198.51.100.7")).fails(t, http.StatusBadRequest, "InvalidRequest")
	requireRefusal(t, describe("198.51.100.7"), limit)
	requireRefusal(t, e.do(t, http.MethodPost, "com.atproto.server.createSession", "", jsonBody(t, "not an object"), nil, from("198.51.100.7")), limit)

	health := e.do(t, http.MethodGet, "_health", "", nil, nil, from("198.51.100.7"))
	require.Equal(t, http.StatusOK, health.status, "body: %s", health.body)
	describe("198.51.100.8").ok(t)
	// IPv6 clients are limited by /64.
	for range limit {
		describe("2001:db8::1").ok(t)
	}
	requireRefusal(t, describe("2001:db8::2"), limit)
}

// TestWritePointsRateLimit: writes cost points per account (create 3,
// update 2, delete 1); a write that would overspend is refused before
// anything is committed.
func TestWritePointsRateLimit(t *testing.T) {
	t.Parallel()
	e := limitedEnv(t, map[string]string{ratelimit.PolicyRepoWrite: "7/1h"})
	u := e.createUser(t)
	create := func(rkey string) xrpcResult {
		return e.post(t, "com.atproto.repo.createRecord", u.access, map[string]any{
			"repo": u.did, "collection": "app.bsky.feed.post", "rkey": rkey, "record": post(rkey),
		})
	}
	res := create("3aaaaaaaaaaa2").ok(t)
	require.Equal(t, "4", res.header.Get(ratelimit.HeaderRemaining))
	create("3aaaaaaaaaaa3").ok(t)
	before := e.rowCounts(t)
	refused := create("3aaaaaaaaaaa4")
	requireRefusal(t, refused, 7)
	require.Equal(t, "1", refused.header.Get(ratelimit.HeaderRemaining), "the points left, too few for a create")
	require.Equal(t, before, e.rowCounts(t), "a refused write commits nothing")

	// One point left: a delete fits, an update does not.
	e.post(t, "com.atproto.repo.putRecord", u.access, map[string]any{
		"repo": u.did, "collection": "app.bsky.feed.post", "rkey": "3aaaaaaaaaaa2", "record": post("edited"),
	}).fails(t, http.StatusTooManyRequests, "RateLimitExceeded")
	e.post(t, "com.atproto.repo.deleteRecord", u.access, map[string]any{
		"repo": u.did, "collection": "app.bsky.feed.post", "rkey": "3aaaaaaaaaaa2",
	}).ok(t)

	// Another account has its own points.
	v := e.createUser(t)
	e.post(t, "com.atproto.repo.applyWrites", v.access, map[string]any{
		"repo": v.did,
		"writes": []map[string]any{
			{"$type": "com.atproto.repo.applyWrites#create", "collection": "app.bsky.feed.post", "value": post("a")},
			{"$type": "com.atproto.repo.applyWrites#create", "collection": "app.bsky.feed.post", "value": post("b")},
		},
	}).ok(t)
	// 6 of 7 spent in one call: a third create in a batch would overspend.
	e.post(t, "com.atproto.repo.applyWrites", v.access, map[string]any{
		"repo": v.did,
		"writes": []map[string]any{
			{"$type": "com.atproto.repo.applyWrites#create", "collection": "app.bsky.feed.post", "value": post("c")},
		},
	}).fails(t, http.StatusTooManyRequests, "RateLimitExceeded")
}

// jsonBody encodes v as a request body.
func jsonBody(t *testing.T, v any) io.Reader {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return bytes.NewReader(b)
}

// heldConns stands in for the cool-off's timer: it reports each hold the
// server starts, and ends them all when the test says so.
type heldConns struct {
	started chan time.Duration
	release chan struct{}
	once    sync.Once
}

func newHeldConns(t *testing.T) *heldConns {
	h := &heldConns{started: make(chan time.Duration, 16), release: make(chan struct{})}
	t.Cleanup(h.end)
	return h
}

func (h *heldConns) hold(ctx context.Context, d time.Duration) {
	h.started <- d
	select {
	case <-h.release:
	case <-ctx.Done():
	}
}

// next returns the length of the next hold the server starts; it fails
// rather than hangs when none comes.
func (h *heldConns) next(t *testing.T) time.Duration {
	t.Helper()
	select {
	case d := <-h.started:
		return d
	case <-time.After(10 * time.Second):
		t.Fatal("the server held no connection")
		return 0
	}
}

// end ends every hold, now and later.
func (h *heldConns) end() { h.once.Do(func() { close(h.release) }) }

// TestRefusalCoolOff: a client refused with 429 gets the answer at once,
// but its next request on the same connection is not read until the
// Retry-After (capped by --refusal-cooloff) has passed; another connection
// is answered meanwhile. Connections from a trusted proxy are never held.
// The hold's timer is the test's (heldConns), so nothing here waits on the
// clock.
func TestRefusalCoolOff(t *testing.T) {
	t.Parallel()
	envWith := func(t *testing.T, trustLoopback bool) (*accountEnv, *heldConns) {
		policies := ratelimit.DefaultPolicies()
		rules, err := ratelimit.ParseRules("2/5m")
		require.NoError(t, err)
		policies[ratelimit.PolicyGlobal] = rules
		set, err := ratelimit.NewSet(policies, 0)
		require.NoError(t, err)
		holds := newHeldConns(t)
		e := newAccountEnv(t, envOptions{
			configure: func(c *config.Config) {
				c.RefusalCoolOff = 2 * time.Second
				if trustLoopback {
					c.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}
				}
			},
			options: func(o *Options) {
				o.Limits = set
				o.holdRefused = holds.hold
			},
		})
		return e, holds
	}
	// ask sends a describeServer on conn and returns the response's status
	// on the channel once it has been read (0 if none came).
	ask := func(t *testing.T, conn net.Conn, br *bufio.Reader) <-chan int {
		out := make(chan int, 1)
		_, err := io.WriteString(conn, "GET /xrpc/com.atproto.server.describeServer HTTP/1.1\r\nHost: pds.test\r\nX-Forwarded-For: 203.0.113.9\r\n\r\n")
		require.NoError(t, err)
		go func() {
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				close(out)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			out <- resp.StatusCode
		}()
		return out
	}
	dial := func(t *testing.T, e *accountEnv) (net.Conn, *bufio.Reader) {
		u, err := url.Parse(e.url)
		require.NoError(t, err)
		conn, err := net.Dial("tcp", u.Host)
		require.NoError(t, err)
		t.Cleanup(func() { conn.Close() })
		require.NoError(t, conn.SetDeadline(time.Now().Add(30*time.Second)))
		return conn, bufio.NewReader(conn)
	}

	t.Run("direct client is held", func(t *testing.T) {
		e, holds := envWith(t, false)
		conn, br := dial(t, e)
		const held = "bulwark_http_refusal_cooloffs_total"
		before := scrape(t)[held]
		require.Equal(t, http.StatusOK, <-ask(t, conn, br))
		require.Equal(t, http.StatusOK, <-ask(t, conn, br))
		// The refusal itself arrives at once; then the server holds the
		// connection, for the Retry-After capped by --refusal-cooloff.
		require.Equal(t, http.StatusTooManyRequests, <-ask(t, conn, br))
		require.Equal(t, 2*time.Second, holds.next(t))
		require.GreaterOrEqual(t, scrape(t)[held]-before, 1.0)
		// The next request on that connection waits, unread, while the
		// hold lasts; another connection is served meanwhile (refused too:
		// same client, and held in turn).
		next := ask(t, conn, br)
		other, obr := dial(t, e)
		require.Equal(t, http.StatusTooManyRequests, <-ask(t, other, obr))
		require.Equal(t, 2*time.Second, holds.next(t))
		require.Empty(t, next, "answered while its connection was held")
		// Once the cool-off is over the held request is read and answered.
		holds.end()
		require.Equal(t, http.StatusTooManyRequests, <-next)
	})

	t.Run("trusted proxy is never held", func(t *testing.T) {
		e, holds := envWith(t, true)
		conn, br := dial(t, e)
		require.Equal(t, http.StatusOK, <-ask(t, conn, br))
		require.Equal(t, http.StatusOK, <-ask(t, conn, br))
		require.Equal(t, http.StatusTooManyRequests, <-ask(t, conn, br))
		require.Equal(t, http.StatusTooManyRequests, <-ask(t, conn, br), "answered at once on the same connection")
		require.Empty(t, holds.started, "a trusted proxy's connection was held")
	})
}

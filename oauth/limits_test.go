package oauth_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/oauth"
	"github.com/bulwark-pds/bulwark/ratelimit"
)

// recordingMux remembers the patterns Routes registers.
type recordingMux struct {
	*http.ServeMux
	patterns []string
}

func (m *recordingMux) HandleFunc(pattern string, h func(http.ResponseWriter, *http.Request)) {
	m.patterns = append(m.patterns, pattern)
	m.ServeMux.HandleFunc(pattern, h)
}

// TestEveryRouteIsLimitedPerAddress: whatever Routes registers is under a
// per-address limit: past it, 429 with the RateLimit-* headers and
// Retry-After, a page for the browser routes and JSON for the rest, before
// any work.
func TestEveryRouteIsLimitedPerAddress(t *testing.T) {
	t.Parallel()
	policies := ratelimit.DefaultPolicies()
	for name := range policies {
		if strings.HasPrefix(name, "oauth") {
			policies[name] = []ratelimit.Rule{{Name: "5m", Limit: 2, Window: 5 * time.Minute}}
		}
	}
	limits, err := ratelimit.NewSet(policies, 0)
	require.NoError(t, err)
	mux := &recordingMux{ServeMux: http.NewServeMux()}
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	s, err := oauth.New(oauth.Config{Issuer: srv.URL, Pool: setup(t).pool, Accounts: &testAccounts{}, Secret: []byte(strings.Repeat("s", 32)),
		Limits: limits, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		// Each route is sent from an address of its own, so that routes
		// sharing a policy do not spend each other's points.
		ClientAddr: func(r *http.Request) netip.Addr { return netip.MustParseAddr(r.Header.Get("X-Test-Addr")) }})
	require.NoError(t, err)
	s.Routes(mux)
	require.Len(t, mux.patterns, 16)

	for i, pattern := range mux.patterns {
		method, path, ok := strings.Cut(pattern, " ")
		if !ok { // any method
			method, path = http.MethodGet, pattern+"no-such-endpoint"
		}
		addr := "192.0.2." + strconv.Itoa(i+1)
		for n := 1; n <= 3; n++ {
			req, err := http.NewRequest(method, srv.URL+path, strings.NewReader("client_id=x"))
			require.NoError(t, err)
			req.Header.Set("X-Test-Addr", addr)
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if n <= 2 {
				require.NotEqual(t, http.StatusTooManyRequests, resp.StatusCode, pattern)
				require.Equal(t, strconv.Itoa(2-n), resp.Header.Get(ratelimit.HeaderRemaining), pattern)
				continue
			}
			require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, pattern)
			require.NotEmpty(t, resp.Header.Get(ratelimit.HeaderRetryAfter), pattern)
			require.Equal(t, "2", resp.Header.Get(ratelimit.HeaderLimit), pattern)
			require.Equal(t, "0", resp.Header.Get(ratelimit.HeaderRemaining), pattern)
			if path == oauth.PathAuthorize || path == oauth.PathAccount {
				require.Contains(t, string(body), "Too many requests", pattern)
				require.Equal(t, "text/html; charset=utf-8", resp.Header.Get("Content-Type"))
			} else {
				require.Contains(t, string(body), `"error":"RateLimitExceeded"`, pattern)
			}
		}
	}
}

// TestPendingRequestsCapped: one client's pushed requests waiting for a
// browser are capped, and so are all clients' together; expired ones make
// room; the single-use values they leave are trimmed to their cap.
func TestPendingRequestsCapped(t *testing.T) {
	t.Parallel()
	const perClient, overall, values = 20, 30, 40
	f := setup(t, fixtureOpts{configure: func(c *oauth.Config) {
		c.MaxPendingPerClient, c.MaxPendingRequests, c.MaxUsedValues = perClient, overall, values
	}})
	a := f.rawClient("flood-a", "atproto")
	accepted := 0
	for range 3 * perClient {
		r := a.post(oauth.PathPAR, a.parForm().Encode(), a.proof(oauth.PathPAR))
		if r.status == http.StatusCreated {
			accepted++
			continue
		}
		require.Equal(t, http.StatusTooManyRequests, r.status, r.body)
		require.Equal(t, oauth.CodeRateLimited, r.str("error"))
		require.NotEmpty(t, r.header.Get("Retry-After"))
	}
	require.Equal(t, perClient, accepted)

	b := f.rawClient("flood-b", "atproto")
	accepted = 0
	for range perClient {
		r := b.post(oauth.PathPAR, b.parForm().Encode(), b.proof(oauth.PathPAR))
		if r.status == http.StatusCreated {
			accepted++
			continue
		}
		require.Equal(t, http.StatusServiceUnavailable, r.status, r.body)
		require.Equal(t, oauth.CodeUnavailable, r.str("error"))
	}
	require.Equal(t, overall-perClient, accepted)
	rows := f.rows()
	require.Equal(t, overall, rows["oauth_requests"])
	// Two values per accepted request, trimmed every tenth of the cap.
	require.LessOrEqual(t, rows["oauth_used_values"], values+values/10)

	// Expired requests are deleted when they are in the way.
	_, err := f.pool.Exec(context.Background(), "UPDATE oauth_requests SET expires_at = now() - interval '1 second' WHERE client_id = $1", a.clientID)
	require.NoError(t, err)
	b.par(b.parForm())
	require.Equal(t, overall-perClient+1, f.rows()["oauth_requests"])
}

// TestPerClientLimit: a client's pushed requests from many addresses
// together meet its own limit, before its metadata is fetched again.
func TestPerClientLimit(t *testing.T) {
	t.Parallel()
	limits, err := ratelimit.NewSet(map[string][]ratelimit.Rule{
		ratelimit.PolicyOAuthClientPAR:   {{Name: "5m", Limit: 5, Window: 5 * time.Minute}},
		ratelimit.PolicyOAuthClientToken: {{Name: "5m", Limit: 5, Window: 5 * time.Minute}},
	}, 0)
	require.NoError(t, err)
	var next atomic.Uint32
	f := setup(t, fixtureOpts{configure: func(c *oauth.Config) {
		c.Limits = limits
		c.ClientAddr = func(*http.Request) netip.Addr { return netip.AddrFrom4([4]byte{198, 51, 100, byte(next.Add(1))}) }
	}})
	c := f.rawClient("busy", "atproto")
	other := f.rawClient("quiet", "atproto")
	for range 5 {
		c.par(c.parForm())
	}
	r := c.post(oauth.PathPAR, c.parForm().Encode(), c.proof(oauth.PathPAR))
	require.Equal(t, http.StatusTooManyRequests, r.status)
	require.Equal(t, oauth.CodeRateLimited, r.str("error"))
	require.Equal(t, "5", r.header.Get(ratelimit.HeaderLimit))
	other.par(other.parForm())

	form := url.Values{"grant_type": {"refresh_token"}, "client_id": {c.clientID}, "refresh_token": {"ref-x"}}
	for range 5 {
		require.Equal(t, "invalid_grant", c.post(oauth.PathToken, form.Encode(), c.proof(oauth.PathToken)).str("error"))
	}
	require.Equal(t, http.StatusTooManyRequests, c.post(oauth.PathToken, form.Encode(), c.proof(oauth.PathToken)).status)
}

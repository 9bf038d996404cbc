package pds

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/oauth"
	"github.com/bulwark-pds/bulwark/oauth/dpop/dpoptest"
	"github.com/bulwark-pds/bulwark/ratelimit"
)

// oauthTables are every table of package oauth.
var oauthTables = []string{"oauth_devices", "oauth_device_accounts", "oauth_requests", "oauth_grants", "oauth_spent_refresh", "oauth_used_values"}

func (e *oauthEnv) oauthRows(t *testing.T) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, table := range oauthTables {
		var n int
		require.NoError(t, e.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n))
		out[table] = n
	}
	return out
}

// oauthFlooder sends requests to the OAuth routes from one address, as an
// anonymous visitor or a client app, and counts the answers.
type oauthFlooder struct {
	t      *testing.T
	e      *oauthEnv
	http   *http.Client
	status map[string]map[int]int // route -> status -> count
	key    *dpoptest.Key
}

func (fl *oauthFlooder) send(route, method, path string, body url.Values, h http.Header, c *http.Client) *http.Response {
	t := fl.t
	var rd io.Reader
	if body != nil {
		rd = strings.NewReader(body.Encode())
	}
	req, err := http.NewRequest(method, fl.e.url+path, rd)
	require.NoError(t, err)
	for k, vs := range h {
		req.Header[k] = vs
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if c == nil {
		c = fl.http
	}
	resp, err := c.Do(req)
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	resp.Body.Close()
	resp.Body = io.NopCloser(strings.NewReader(string(b)))
	if fl.status[route] == nil {
		fl.status[route] = map[int]int{}
	}
	fl.status[route][resp.StatusCode]++
	if resp.StatusCode == http.StatusTooManyRequests {
		require.NotEmpty(t, resp.Header.Get(ratelimit.HeaderRetryAfter), route)
		require.NotEmpty(t, resp.Header.Get(ratelimit.HeaderLimit), route)
		require.NotEmpty(t, resp.Header.Get(ratelimit.HeaderReset), route)
	}
	return resp
}

// parForm is a valid pushed request of the app at clientID.
func parForm(clientID, redirect string) url.Values {
	v := make([]byte, 32)
	_, _ = rand.Read(v)
	verifier := base64.RawURLEncoding.EncodeToString(v)
	sum := sha256.Sum256([]byte(verifier))
	return url.Values{"client_id": {clientID}, "response_type": {"code"}, "redirect_uri": {redirect}, "scope": {"atproto"},
		"state": {verifier + "s"}, "code_challenge": {base64.RawURLEncoding.EncodeToString(sum[:])}, "code_challenge_method": {"S256"}}
}

func (fl *oauthFlooder) par(form url.Values) *http.Response {
	proof := fl.key.Proof(dpoptest.Claims{Method: http.MethodPost, URL: fl.e.publicURL() + oauth.PathPAR, Nonce: fl.e.server.OAuth().DPoPNonce()})
	return fl.send("par", http.MethodPost, oauth.PathPAR, form, http.Header{"DPoP": {proof}}, nil)
}

func jarClient(t *testing.T) *http.Client {
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	return &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// TestOAuthAnonymousBurstLeavesBoundedState is the OAuth part of the
// state-growth test: with the default rate limits, a burst from one
// address at every OAuth route and the metadata routes (GET and POST,
// with and without cookies, valid and invalid pushed requests from one
// app) meets 429 on each, and leaves every oauth_* table as it was or
// within the bound named below.
func TestOAuthAnonymousBurstLeavesBoundedState(t *testing.T) {
	t.Parallel()
	e := newOAuthEnv(t, oauthEnvOptions{
		configure: func(c *config.Config) { c.RefusalCoolOff = 0 },
		options: func(o *Options) {
			limits, err := ratelimit.NewSet(ratelimit.DefaultPolicies(), 0)
			require.NoError(t, err)
			o.Limits = limits
		},
	})
	app := e.app("flood", "atproto")
	clientID, redirect := app.Config.ClientID, app.Config.CallbackURL
	fl := &oauthFlooder{t: t, e: e, http: &http.Client{}, status: map[string]map[int]int{}, key: dpoptest.NewKey()}
	before := e.oauthRows(t)
	start := time.Now()

	// Links to open in the browser, from a few valid requests.
	var authURLs []string
	for range 3 {
		resp := fl.par(parForm(clientID, redirect))
		require.Equal(t, http.StatusCreated, resp.StatusCode)
		var out struct {
			RequestURI string `json:"request_uri"`
		}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
		authURLs = append(authURLs, oauth.PathAuthorize+"?"+url.Values{"client_id": {clientID}, "request_uri": {out.RequestURI}}.Encode())
	}

	fl.burstEveryRoute(clientID, redirect, authURLs)

	for _, route := range []string{"account", "authorize", "metadata", "par", "token"} {
		require.NotZero(t, fl.status[route][http.StatusTooManyRequests], "%s: %v", route, fl.status[route])
	}
	// The bounds: no browser is remembered and nothing is granted without
	// a sign-in; each pushed request the PAR limit lets through leaves one
	// request and two single-use values (its PKCE challenge and state).
	// PARs allowed: the limit's worth and what its bucket refilled while
	// the test ran.
	par := ratelimit.DefaultPolicies()[ratelimit.PolicyOAuthPAR][0]
	allowed := par.Limit + int(time.Since(start)*time.Duration(par.Limit)/par.Window)
	accepted := fl.status["par"][http.StatusCreated]
	require.LessOrEqual(t, accepted, allowed)
	bound := map[string]int{
		"oauth_devices":         0,
		"oauth_device_accounts": 0,
		"oauth_grants":          0,
		"oauth_spent_refresh":   0,
		"oauth_requests":        allowed,
		"oauth_used_values":     2 * allowed,
	}
	after := e.oauthRows(t)
	for _, table := range oauthTables {
		require.LessOrEqual(t, after[table]-before[table], bound[table], "%s: %v", table, after)
	}
	require.Equal(t, accepted, after["oauth_requests"]-before["oauth_requests"])
}

// burstEveryRoute sends requests to every OAuth route until each has been
// refused a few times (the buckets refill as it runs): the pages as
// anonymous browsers and as one with a cookie, the metadata, valid and
// invalid pushed requests from the app at clientID, and token and
// revocation requests with made-up tokens.
func (fl *oauthFlooder) burstEveryRoute(clientID, redirect string, authURLs []string) {
	t := fl.t
	policy := ratelimit.DefaultPolicies()
	limit := func(name string) int { return policy[name][0].Limit }
	const refusals = 20
	burst := func(route string, policy string, send func(i int)) {
		for i := 0; fl.status[route][http.StatusTooManyRequests] < refusals; i++ {
			require.Less(t, i, 3*limit(policy), "%s: no 429 yet: %v", route, fl.status[route])
			send(i)
		}
	}
	// The pages, every variant over and over, as anonymous browsers and
	// as one with a cookie.
	withCookie := jarClient(t)
	forged := url.Values{"csrf_token": {"forged"}, "action": {"signin"}, "identifier": {"nobody.test"}, "password": {"x"}}
	pageVariants := []func(i int){
		func(int) { fl.send("account", http.MethodGet, oauth.PathAccount, nil, nil, nil) },
		func(int) { fl.send("account", http.MethodGet, oauth.PathAccount, nil, nil, withCookie) },
		func(int) { fl.send("account", http.MethodPost, oauth.PathAccount, forged, nil, withCookie) },
		func(i int) { fl.send("authorize", http.MethodGet, authURLs[i%len(authURLs)], nil, nil, nil) },
		func(int) { fl.send("authorize", http.MethodGet, authURLs[0], nil, nil, withCookie) },
		func(int) {
			fl.send("authorize", http.MethodGet, oauth.PathAuthorize+"?request_uri=nope", nil, nil, nil)
		},
		func(int) { fl.send("authorize", http.MethodPost, oauth.PathAuthorize, forged, nil, withCookie) },
	}
	burst("account", ratelimit.PolicyOAuthPage, func(i int) {
		for _, v := range pageVariants {
			v(i)
		}
	})
	// Metadata and the stylesheet.
	burst("metadata", ratelimit.PolicyOAuthMetadata, func(i int) {
		p := []string{oauth.PathASMetadata, oauth.PathRSMetadata, oauth.PathStyle}[i%3]
		fl.send("metadata", http.MethodGet, p, nil, nil, nil)
	})
	// Pushed requests, valid and not.
	burst("par", ratelimit.PolicyOAuthPAR, func(i int) {
		if i%2 == 0 {
			fl.par(parForm(clientID, redirect))
		} else {
			fl.send("par", http.MethodPost, oauth.PathPAR, parForm(clientID, redirect), nil, nil) // no DPoP
		}
	})
	// Token and revocation requests with made-up tokens.
	burst("token", ratelimit.PolicyOAuthToken, func(i int) {
		if i%2 == 0 {
			fl.send("token", http.MethodPost, oauth.PathToken, url.Values{"client_id": {clientID}, "grant_type": {"refresh_token"}, "refresh_token": {"ref-x"}}, nil, nil)
		} else {
			fl.send("token", http.MethodPost, oauth.PathRevoke, url.Values{"client_id": {clientID}, "token": {"ref-x"}}, nil, nil)
		}
	})

}

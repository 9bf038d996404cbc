package oauth_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	indigo "github.com/bluesky-social/indigo/atproto/auth/oauth"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/oauth"
	"github.com/bulwark-pds/bulwark/oauth/dpop/dpoptest"
)

func TestPARRefusals(t *testing.T) {
	t.Parallel()
	f := setup(t)
	c := f.rawClient("par", "atproto transition:generic include:com.example.authFull")
	c.scope = "atproto transition:generic" // what valid requests ask for
	tests := []struct {
		name   string
		edit   func(url.Values)
		status int
		code   string
	}{
		{"no PKCE", func(v url.Values) { v.Del("code_challenge"); v.Del("code_challenge_method") }, 400, "invalid_request"},
		{"plain PKCE", func(v url.Values) { v.Set("code_challenge_method", "plain") }, 400, "invalid_request"},
		{"PKCE without method", func(v url.Values) { v.Del("code_challenge_method") }, 400, "invalid_request"},
		{"challenge not a hash", func(v url.Values) { v.Set("code_challenge", "short") }, 400, "invalid_request"},
		{"redirect_uri not in metadata", func(v url.Values) { v.Set("redirect_uri", f.srv.URL+"/elsewhere") }, 400, "invalid_request"},
		{"no redirect_uri", func(v url.Values) { v.Del("redirect_uri") }, 400, "invalid_request"},
		{"scope not declared", func(v url.Values) { v.Set("scope", "atproto transition:chat.bsky") }, 400, "invalid_scope"},
		{"scope without atproto", func(v url.Values) { v.Set("scope", "transition:generic") }, 400, "invalid_scope"},
		{"permission set", func(v url.Values) { v.Set("scope", "atproto include:com.example.authFull") }, 400, "invalid_scope"},
		{"implicit flow", func(v url.Values) { v.Set("response_type", "token") }, 400, "unsupported_response_type"},
		{"no state", func(v url.Values) { v.Del("state") }, 400, "invalid_request"},
		{"form_post", func(v url.Values) { v.Set("response_mode", "form_post") }, 400, "invalid_request"},
		{"public client sends an assertion", func(v url.Values) {
			v.Set("client_assertion_type", indigo.ClientAssertionJWTBearer)
			v.Set("client_assertion", "x.y.z")
		}, 401, "invalid_client"},
		{"unknown client", func(v url.Values) { v.Set("client_id", f.srv.URL+"/client/nobody.json") }, 401, "invalid_client"},
	}
	for _, tt := range tests {
		form := c.parForm()
		tt.edit(form)
		a := c.post(oauth.PathPAR, form.Encode(), c.proof(oauth.PathPAR))
		require.Equal(t, tt.status, a.status, tt.name)
		require.Equal(t, tt.code, a.str("error"), "%s: %v", tt.name, a.body)
		require.NotEmpty(t, a.header.Get("DPoP-Nonce"), tt.name)
	}

	// Control characters or broken UTF-8 never reach storage.
	for _, bad := range []string{"a\x00b", "a\nb", "\xff"} {
		form := c.parForm()
		form.Set("state", bad)
		a := c.post(oauth.PathPAR, form.Encode(), c.proof(oauth.PathPAR))
		require.Equal(t, "invalid_request", a.str("error"), "%q", bad)
	}

	// A parameter sent twice.
	form := c.parForm()
	a := c.post(oauth.PathPAR, form.Encode()+"&state=again", c.proof(oauth.PathPAR))
	require.Equal(t, "invalid_request", a.str("error"))

	// Without DPoP, or without its nonce.
	a = c.post(oauth.PathPAR, c.parForm().Encode(), "")
	require.Equal(t, "invalid_dpop_proof", a.str("error"))
	a = c.post(oauth.PathPAR, c.parForm().Encode(), c.key.Proof(dpoptest.Claims{Method: "POST", URL: f.srv.URL + oauth.PathPAR}))
	require.Equal(t, http.StatusBadRequest, a.status)
	require.Equal(t, "use_dpop_nonce", a.str("error"))
	require.Equal(t, f.oauth.DPoPNonce(), a.header.Get("DPoP-Nonce"))

	// A PKCE challenge is good for one request only.
	form = c.parForm()
	c.par(form)
	form.Set("state", "another state")
	a = c.post(oauth.PathPAR, form.Encode(), c.proof(oauth.PathPAR))
	require.Equal(t, "invalid_request", a.str("error"))
	require.Contains(t, a.str("error_description"), "code_challenge")
}

func TestClientIDRules(t *testing.T) {
	t.Parallel()
	f := setup(t, fixtureOpts{strictClientIDs: true})
	// A well-formed client on the test server's 127.0.0.1:port, which only
	// the development setting allows.
	c := f.rawClient("local", "atproto")
	a := c.post(oauth.PathPAR, c.parForm().Encode(), c.proof(oauth.PathPAR))
	require.Equal(t, http.StatusUnauthorized, a.status)
	require.Equal(t, "invalid_client", a.str("error"))
	require.Contains(t, a.str("error_description"), "port")

	for _, id := range []string{
		"http://127.0.0.1/client.json",                                  // http only for the localhost form
		"http://localhost:8080/",                                        // no port
		"http://localhost/path",                                         // no path
		"http://localhost?redirect_uri=https%3A%2F%2Fevil.example%2Fcb", // loopback redirects only
		"https://localhost/client.json",                                 // not a public name
		"https://10.0.0.1/client.json",                                  // not an IP address
		"https://user@app.example.com/x",                                // no credentials
		"ftp://app.example.com/client.json",                             // https only
		"https://" + strings.Repeat("a", 2100) + ".com/",
	} {
		form := c.parForm()
		form.Set("client_id", id)
		a := c.post(oauth.PathPAR, form.Encode(), c.proof(oauth.PathPAR))
		require.Equal(t, "invalid_client", a.str("error"), id)
	}
}

func TestClientMetadataFetchLimits(t *testing.T) {
	t.Parallel()
	f := setup(t)
	c := f.rawClient("good", "atproto")
	cfg := indigo.NewPublicConfig("", c.redirect, []string{"atproto"})
	md := cfg.ClientMetadata()
	cases := map[string]rawDoc{
		"big":      {status: 200, header: map[string]string{"Content-Type": "application/json"}, body: []byte(`{"client_name":"` + strings.Repeat("x", oauth.MaxDocumentBytes) + `"}`)},
		"missing":  {status: 404, header: map[string]string{"Content-Type": "application/json"}, body: []byte(`{}`)},
		"html":     {status: 200, header: map[string]string{"Content-Type": "text/html"}, body: []byte(`{}`)},
		"redirect": {status: 302, header: map[string]string{"Location": "/client/good.json"}},
		"notjson":  {status: 200, header: map[string]string{"Content-Type": "application/json"}, body: []byte(`{`)},
	}
	for name, doc := range cases {
		id := f.putDoc("/client/"+name+".json", doc)
		form := c.parForm()
		form.Set("client_id", id)
		a := c.post(oauth.PathPAR, form.Encode(), c.proof(oauth.PathPAR))
		require.Equal(t, "invalid_client", a.str("error"), name)
	}
	// A document naming another client_id.
	md.ClientID = c.clientID
	id := f.putDoc("/client/copy.json", md)
	form := c.parForm()
	form.Set("client_id", id)
	a := c.post(oauth.PathPAR, form.Encode(), c.proof(oauth.PathPAR))
	require.Equal(t, "invalid_client", a.str("error"))
}

func TestCodeIsSingleUseAndReuseRevokesGrant(t *testing.T) {
	t.Parallel()
	f := setup(t)
	c := f.rawClient("code", "atproto transition:generic")
	code := c.code()
	first := c.exchange(code)
	require.Equal(t, http.StatusOK, first.status, first.body)
	require.Equal(t, "DPoP", first.str("token_type"))
	require.Equal(t, aliceDID, first.str("sub"))
	require.Equal(t, "atproto transition:generic", first.str("scope"))
	access := first.str("access_token")
	resp := c.call(access, c.key, "")
	require.Equal(t, http.StatusOK, resp.StatusCode)

	second := c.exchange(code)
	require.Equal(t, http.StatusBadRequest, second.status)
	require.Equal(t, "invalid_grant", second.str("error"))
	// The code leaked: what it produced is revoked.
	require.Equal(t, http.StatusUnauthorized, c.call(access, c.key, "").StatusCode)
	require.Equal(t, "invalid_grant", c.refresh(first.str("refresh_token")).str("error"))
}

func TestTokenEndpointDPoPRefusals(t *testing.T) {
	t.Parallel()
	f := setup(t)
	c := f.rawClient("dpop", "atproto")
	form := url.Values{"grant_type": {"authorization_code"}, "client_id": {c.clientID}, "code": {"cod-unknown"},
		"redirect_uri": {c.redirect}, "code_verifier": {randomString()}}
	u := f.srv.URL + oauth.PathToken

	// A proof is accepted once (the unknown code is refused after it).
	proof := c.proof(oauth.PathToken)
	require.Equal(t, "invalid_grant", c.post(oauth.PathToken, form.Encode(), proof).str("error"))
	require.Equal(t, "invalid_dpop_proof", c.post(oauth.PathToken, form.Encode(), proof).str("error"))

	for name, claims := range map[string]dpoptest.Claims{
		"wrong htu": {Method: "POST", URL: f.srv.URL + oauth.PathPAR, Nonce: f.oauth.DPoPNonce()},
		"wrong htm": {Method: "GET", URL: u, Nonce: f.oauth.DPoPNonce()},
		"stale iat": {Method: "POST", URL: u, Nonce: f.oauth.DPoPNonce(), IssuedAt: time.Now().Add(-10 * time.Minute)},
		"wrong typ": {Method: "POST", URL: u, Nonce: f.oauth.DPoPNonce(), Typ: "JWT"},
	} {
		a := c.post(oauth.PathToken, form.Encode(), c.key.Proof(claims))
		require.Equal(t, http.StatusBadRequest, a.status, name)
		require.Equal(t, "invalid_dpop_proof", a.str("error"), name)
	}
	a := c.post(oauth.PathToken, form.Encode(), c.key.Proof(dpoptest.Claims{Method: "POST", URL: u}))
	require.Equal(t, "use_dpop_nonce", a.str("error"))
	require.NotEmpty(t, a.header.Get("DPoP-Nonce"))

	// The code must be redeemed with the key the request was pushed with.
	code := c.code()
	c.key = dpoptest.NewKey()
	a = c.exchange(code)
	require.Equal(t, "invalid_grant", a.str("error"))
	require.Contains(t, a.str("error_description"), "DPoP key")
}

func TestAccessTokenNeedsItsDPoPKey(t *testing.T) {
	t.Parallel()
	f := setup(t)
	c := f.rawClient("bound", "atproto transition:generic")
	access := c.tokens().str("access_token")
	require.Equal(t, http.StatusOK, c.call(access, c.key, "").StatusCode)

	resp := c.call(access, dpoptest.NewKey(), "")
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	require.Contains(t, resp.Header.Get("WWW-Authenticate"), `error="invalid_token"`)

	resp = c.call(access, nil, "")
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	require.Contains(t, resp.Header.Get("WWW-Authenticate"), `error="invalid_dpop_proof"`)

	// A proof without the resource server's nonce: use_dpop_nonce, 401.
	u := f.srv.URL + "/xrpc/test.resource"
	req, _ := http.NewRequest(http.MethodGet, u, nil)
	req.Header.Set("Authorization", "DPoP "+access)
	req.Header.Set("DPoP", c.key.Proof(dpoptest.Claims{Method: "GET", URL: u, AccessToken: access}))
	resp, err := f.srv.Client().Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	require.Contains(t, resp.Header.Get("WWW-Authenticate"), `error="use_dpop_nonce"`)
	require.Equal(t, f.oauth.DPoPNonce(), resp.Header.Get("DPoP-Nonce"))

	// A proof for another access token, or a tampered token.
	resp = c.call(access[:len(access)-2]+"xx", c.key, "")
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
}

func TestRefreshTokenReuseRevokesGrant(t *testing.T) {
	t.Parallel()
	f := setup(t)
	c := f.rawClient("rotate", "atproto transition:generic")
	first := c.tokens()
	second := c.refresh(first.str("refresh_token"))
	require.Equal(t, http.StatusOK, second.status, second.body)
	require.NotEqual(t, first.str("refresh_token"), second.str("refresh_token"))
	require.Equal(t, http.StatusOK, c.call(second.str("access_token"), c.key, "").StatusCode)

	// Another key cannot refresh.
	owner := c.key
	c.key = dpoptest.NewKey()
	require.Equal(t, "invalid_grant", c.refresh(second.str("refresh_token")).str("error"))
	c.key = owner

	again := c.refresh(first.str("refresh_token"))
	require.Equal(t, http.StatusBadRequest, again.status)
	require.Equal(t, "invalid_grant", again.str("error"))
	// The whole grant is gone: the current refresh token and access token too.
	require.Equal(t, "invalid_grant", c.refresh(second.str("refresh_token")).str("error"))
	require.Equal(t, http.StatusUnauthorized, c.call(second.str("access_token"), c.key, "").StatusCode)
}

func TestScopeLimitedToken(t *testing.T) {
	t.Parallel()
	f := setup(t)
	c := f.rawClient("posts", "atproto repo:app.bsky.feed.post?action=create")
	a := c.tokens()
	require.Equal(t, "atproto repo:app.bsky.feed.post?action=create", a.str("scope"))
	access := a.str("access_token")
	for query, want := range map[string]int{
		"check=repo&collection=app.bsky.feed.post&action=create":                          http.StatusOK,
		"check=repo&collection=app.bsky.feed.post&action=delete":                          http.StatusForbidden,
		"check=repo&collection=app.bsky.feed.like&action=create":                          http.StatusForbidden,
		"check=blob&mime=image/png":                                                       http.StatusForbidden,
		"check=rpc&lxm=app.bsky.feed.getTimeline&aud=did:web:api.bsky.app%23bsky_appview": http.StatusForbidden,
	} {
		require.Equal(t, want, c.call(access, c.key, query).StatusCode, query)
	}
}

func TestRevocationEndpoint(t *testing.T) {
	t.Parallel()
	f := setup(t)
	c := f.rawClient("revoke", "atproto transition:generic")
	a := c.tokens()
	// Unknown tokens are fine (RFC 7009); another client cannot revoke.
	other := f.rawClient("other", "atproto")
	r := other.post(oauth.PathRevoke, url.Values{"client_id": {other.clientID}, "token": {a.str("refresh_token")}}.Encode(), "")
	require.Equal(t, http.StatusOK, r.status)
	require.Equal(t, http.StatusOK, c.call(a.str("access_token"), c.key, "").StatusCode)

	r = c.post(oauth.PathRevoke, url.Values{"client_id": {c.clientID}, "token": {a.str("access_token")}}.Encode(), c.proof(oauth.PathRevoke))
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.Equal(t, http.StatusUnauthorized, c.call(a.str("access_token"), c.key, "").StatusCode)
	require.Equal(t, "invalid_grant", c.refresh(a.str("refresh_token")).str("error"))
}

func TestRefreshNeedsDeclaredGrantType(t *testing.T) {
	t.Parallel()
	f := setup(t)
	c := f.rawClient("norefresh", "atproto")
	cfg := indigo.NewPublicConfig(c.clientID, c.redirect, []string{"atproto"})
	md := cfg.ClientMetadata()
	md.GrantTypes = []string{"authorization_code"}
	f.putDoc("/client/norefresh.json", md)
	a := c.tokens()
	r := c.refresh(a.str("refresh_token"))
	require.Equal(t, http.StatusBadRequest, r.status)
	require.Equal(t, "unauthorized_client", r.str("error"))
}

package oauth_test

import (
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
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

// rawClient speaks the protocol by hand, so tests can send what a real
// client never would.
type rawClient struct {
	f        *fixture
	t        *testing.T
	key      *dpoptest.Key
	clientID string
	redirect string
	scope    string
	verifier string
	state    string
	// assertKey, when set, signs a client assertion into every PAR and
	// token request (a confidential client).
	assertKey *ecdsa.PrivateKey
}

// authenticate adds a client assertion to form when c is confidential.
func (c *rawClient) authenticate(form url.Values) url.Values {
	if c.assertKey != nil {
		form.Set("client_assertion_type", indigo.ClientAssertionJWTBearer)
		form.Set("client_assertion", assertion(c.t, c.assertKey, map[string]any{
			"iss": c.clientID, "sub": c.clientID, "aud": c.f.srv.URL, "jti": randomString(), "iat": time.Now().Unix()}))
	}
	return form
}

func (f *fixture) rawClient(name, scope string) *rawClient {
	c := &rawClient{f: f, t: f.t, key: dpoptest.NewKey(), redirect: f.srv.URL + "/callback", scope: scope}
	cfg := indigo.NewPublicConfig("", c.redirect, strings.Fields(scope))
	md := cfg.ClientMetadata()
	md.ClientID = f.srv.URL + "/client/" + name + ".json"
	c.clientID = f.putDoc("/client/"+name+".json", md)
	return c
}

func randomString() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// parForm is a valid PAR body with a fresh verifier and state.
func (c *rawClient) parForm() url.Values {
	c.verifier = randomString()
	c.state = randomString()
	sum := sha256.Sum256([]byte(c.verifier))
	return c.authenticate(url.Values{
		"client_id": {c.clientID}, "response_type": {"code"}, "redirect_uri": {c.redirect}, "scope": {c.scope},
		"state": {c.state}, "code_challenge": {base64.RawURLEncoding.EncodeToString(sum[:])}, "code_challenge_method": {"S256"},
	})
}

// proof is a valid proof for a POST to path on our server.
func (c *rawClient) proof(path string) string {
	return c.key.Proof(dpoptest.Claims{Method: http.MethodPost, URL: c.f.srv.URL + path, Nonce: c.f.oauth.DPoPNonce()})
}

type answer struct {
	status int
	header http.Header
	body   map[string]any
}

func (a answer) str(k string) string { s, _ := a.body[k].(string); return s }

// post sends a form with the given DPoP header ("" for none).
func (c *rawClient) post(path, body, proof string) answer {
	req, err := http.NewRequest(http.MethodPost, c.f.srv.URL+path, strings.NewReader(body))
	require.NoError(c.t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if proof != "" {
		req.Header.Set("DPoP", proof)
	}
	resp, err := c.f.srv.Client().Do(req)
	require.NoError(c.t, err)
	defer resp.Body.Close()
	a := answer{status: resp.StatusCode, header: resp.Header, body: map[string]any{}}
	_ = json.NewDecoder(resp.Body).Decode(&a.body)
	return a
}

// par pushes form and returns the request_uri.
func (c *rawClient) par(form url.Values) string {
	a := c.post(oauth.PathPAR, form.Encode(), c.proof(oauth.PathPAR))
	require.Equal(c.t, http.StatusCreated, a.status, a.body)
	return a.str("request_uri")
}

// code runs PAR and the pages (as alice) and returns the code.
func (c *rawClient) code() string {
	uri := c.par(c.parForm())
	q := url.Values{"client_id": {c.clientID}, "request_uri": {uri}}
	params := c.f.browser().SignInAndApprove(c.f.srv.URL+oauth.PathAuthorize+"?"+q.Encode(), "alice.test", "alice password")
	require.Equal(c.t, c.state, params.Get("state"))
	return params.Get("code")
}

func (c *rawClient) exchange(code string) answer {
	form := url.Values{"grant_type": {"authorization_code"}, "client_id": {c.clientID}, "code": {code},
		"redirect_uri": {c.redirect}, "code_verifier": {c.verifier}}
	c.authenticate(form)
	return c.post(oauth.PathToken, form.Encode(), c.proof(oauth.PathToken))
}

func (c *rawClient) refresh(token string) answer {
	form := url.Values{"grant_type": {"refresh_token"}, "client_id": {c.clientID}, "refresh_token": {token}}
	c.authenticate(form)
	return c.post(oauth.PathToken, form.Encode(), c.proof(oauth.PathToken))
}

// tokens runs the whole flow and returns the token response.
func (c *rawClient) tokens() answer {
	a := c.exchange(c.code())
	require.Equal(c.t, http.StatusOK, a.status, a.body)
	return a
}

// call calls the test resource with an access token and a proof by key
// (nil: no DPoP header).
func (c *rawClient) call(access string, key *dpoptest.Key, query string) *http.Response {
	u := c.f.srv.URL + "/xrpc/test.resource"
	req, err := http.NewRequest(http.MethodGet, u+"?"+query, nil)
	require.NoError(c.t, err)
	req.Header.Set("Authorization", "DPoP "+access)
	if key != nil {
		req.Header.Set("DPoP", key.Proof(dpoptest.Claims{Method: http.MethodGet, URL: u, Nonce: c.f.oauth.DPoPNonce(), AccessToken: access}))
	}
	resp, err := c.f.srv.Client().Do(req)
	require.NoError(c.t, err)
	resp.Body.Close()
	return resp
}

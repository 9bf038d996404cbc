package main

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/oauth"
	"github.com/bulwark-pds/bulwark/oauth/dpop/dpoptest"
	"github.com/bulwark-pds/bulwark/oauth/oauthtest"
)

// Purposes of the signed values the server issues, as the purpose test
// names them.
const (
	pConsoleSession     = "console session cookie"
	pConsoleLogin       = "console login cookie"
	pConsoleLoginCSRF   = "console login CSRF token"
	pConsoleSessionCSRF = "console session CSRF token"
	pOAuthDevice        = "OAuth device cookie"
	pOAuthCSRF          = "OAuth page CSRF token"
	pOAuthCode          = "OAuth authorization code"
	pOAuthRequestURI    = "OAuth request_uri"
	pOAuthRefresh       = "OAuth refresh token"
	pOAuthAccess        = "OAuth access token"
	pDPoPNonce          = "DPoP nonce"
	pAccess             = "account access JWT"
	pRefresh            = "account refresh JWT"
	pAppPassAccess      = "app-password access JWT"
	pAppPassRefresh     = "app-password refresh JWT"
	pServiceAuth        = "service-auth JWT"
	pConfirmEmail       = "confirm_email code"
	pUpdateEmail        = "update_email code"
	pResetPassword      = "reset_password code"
	pDeleteAccount      = "delete_account code"
	pPLCOperation       = "plc_operation code"
)

// purposeServer is a running server and the clients the purpose test
// speaks to it with.
type purposeServer struct {
	*liveServer
	public string // the public URL (the OAuth issuer)
	// raw sends exactly the cookies and headers a test sets, and follows
	// no redirect.
	raw *http.Client
}

// testUser is an account made for the test.
type purposeUser struct {
	did, handle, email, password, access, refresh string
}

// newUser creates an account (password sign-up) and returns it.
func (s *purposeServer) newUser(t *testing.T, name string) *purposeUser {
	t.Helper()
	u := &purposeUser{handle: name + ".test", email: name + "@example.com", password: "a password for " + name}
	var out struct {
		DID        string `json:"did"`
		AccessJwt  string `json:"accessJwt"`
		RefreshJwt string `json:"refreshJwt"`
	}
	status, body := s.xrpc(t, http.MethodPost, "com.atproto.server.createAccount", "", nil,
		map[string]string{"handle": u.handle, "email": u.email, "password": u.password}, &out)
	require.Equal(t, http.StatusOK, status, "%s", body)
	u.did, u.access, u.refresh = out.DID, out.AccessJwt, out.RefreshJwt
	return u
}

// code asks for a code of purpose (with the request method nsid, as u)
// and reads it from the held outbox with the admin password.
func (s *purposeServer) code(t *testing.T, u *purposeUser, nsid string, body any, purpose string) string {
	t.Helper()
	status, raw := s.xrpc(t, http.MethodPost, nsid, u.access, nil, body, nil)
	require.Equal(t, http.StatusOK, status, "%s: %s", nsid, raw)
	var pending pendingEmailTokens
	s.adminJSON(t, &pending, "account", "tokens", u.did)
	for _, tok := range pending.Tokens {
		if tok.Purpose == purpose {
			return tok.Code
		}
	}
	t.Fatalf("no %s code for %s after %s", purpose, u.did, nsid)
	return ""
}

// emailCodes confirms u's address, then asks for a code of every purpose:
// all live at once, for the same account.
func (s *purposeServer) emailCodes(t *testing.T, u *purposeUser, values map[string]string) {
	t.Helper()
	confirm := s.code(t, u, "com.atproto.server.requestEmailConfirmation", nil, "confirm_email")
	status, raw := s.xrpc(t, http.MethodPost, "com.atproto.server.confirmEmail", u.access, nil, map[string]string{"email": u.email, "token": confirm}, nil)
	require.Equal(t, http.StatusOK, status, "%s", raw)
	values[pConfirmEmail] = s.code(t, u, "com.atproto.server.requestEmailConfirmation", nil, "confirm_email")
	values[pUpdateEmail] = s.code(t, u, "com.atproto.server.requestEmailUpdate", nil, "update_email")
	values[pResetPassword] = s.code(t, u, "com.atproto.server.requestPasswordReset", map[string]string{"email": u.email}, "reset_password")
	values[pDeleteAccount] = s.code(t, u, "com.atproto.server.requestAccountDelete", nil, "delete_account")
	values[pPLCOperation] = s.code(t, u, "com.atproto.identity.requestPlcOperationSignature", nil, "plc_operation")
}

// accountValues collects u's session JWTs, an app password's session and
// a service-auth JWT for createAccount.
func (s *purposeServer) accountValues(t *testing.T, u *purposeUser, values map[string]string) {
	t.Helper()
	values[pAccess], values[pRefresh] = u.access, u.refresh
	var app struct{ Password string }
	status, raw := s.xrpc(t, http.MethodPost, "com.atproto.server.createAppPassword", u.access, nil, map[string]string{"name": "purpose test"}, &app)
	require.Equal(t, http.StatusOK, status, "%s", raw)
	var sess struct{ AccessJwt, RefreshJwt string }
	status, raw = s.xrpc(t, http.MethodPost, "com.atproto.server.createSession", "", nil, map[string]string{"identifier": u.handle, "password": app.Password}, &sess)
	require.Equal(t, http.StatusOK, status, "%s", raw)
	values[pAppPassAccess], values[pAppPassRefresh] = sess.AccessJwt, sess.RefreshJwt
	var desc struct{ DID string }
	status, _ = s.xrpc(t, http.MethodGet, "com.atproto.server.describeServer", "", nil, nil, &desc)
	require.Equal(t, http.StatusOK, status)
	var sa struct{ Token string }
	status, raw = s.xrpc(t, http.MethodGet, "com.atproto.server.getServiceAuth", u.access,
		url.Values{"aud": {desc.DID}, "lxm": {"com.atproto.server.createAccount"}}, nil, &sa)
	require.Equal(t, http.StatusOK, status, "%s", raw)
	values[pServiceAuth] = sa.Token
}

var csrfInput = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// consoleValues collects the console's values as a browser gets them:
// the login page's cookie and CSRF token, then, after logging in, the
// session cookie and its pages' CSRF token.
func (s *purposeServer) consoleValues(t *testing.T, values map[string]string) {
	t.Helper()
	resp, body := s.send(t, http.MethodGet, "/admin/login", nil, nil, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	values[pConsoleLogin] = setCookie(t, resp, "bulwark_console_login")
	values[pConsoleLoginCSRF] = csrfInput.FindStringSubmatch(body)[1]
	resp, body = s.send(t, http.MethodPost, "/admin/login",
		url.Values{"csrf": {values[pConsoleLoginCSRF]}, "password": {s.adminPassword(t)}},
		[]*http.Cookie{{Name: "bulwark_console_login", Value: values[pConsoleLogin]}}, nil)
	require.Equal(t, http.StatusSeeOther, resp.StatusCode, body)
	values[pConsoleSession] = setCookie(t, resp, "bulwark_console")
	resp, body = s.send(t, http.MethodGet, "/admin/", nil, []*http.Cookie{{Name: "bulwark_console", Value: values[pConsoleSession]}}, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	values[pConsoleSessionCSRF] = csrfInput.FindStringSubmatch(body)[1]
}

// send makes a request to path (a form when form is not nil) with exactly
// cookies and header, and returns the answer with its body read.
func (s *purposeServer) send(t *testing.T, method, path string, form url.Values, cookies []*http.Cookie, header http.Header) (*http.Response, string) {
	t.Helper()
	var rd io.Reader
	if form != nil {
		rd = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, s.url+path, rd)
	require.NoError(t, err)
	for k, v := range header {
		req.Header[k] = v
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for _, c := range cookies {
		req.AddCookie(c)
	}
	resp, err := s.raw.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(b)
}

func setCookie(t *testing.T, resp *http.Response, name string) string {
	t.Helper()
	for _, c := range resp.Cookies() {
		if c.Name == name && c.Value != "" {
			return c.Value
		}
	}
	t.Fatalf("no cookie %s set", name)
	return ""
}

// oauthClient is a development (http://localhost) OAuth client with one
// DPoP key, speaking the protocol by hand.
type oauthClient struct {
	s                           *purposeServer
	key                         *dpoptest.Key
	id, redirect, nonce         string
	verifier, state, requestURI string
}

func (s *purposeServer) oauthClient() *oauthClient {
	redirect := "http://127.0.0.1/callback"
	return &oauthClient{s: s, key: dpoptest.NewKey(), redirect: redirect,
		id: "http://localhost?" + url.Values{"redirect_uri": {redirect}, "scope": {"atproto transition:generic"}}.Encode()}
}

// post sends a DPoP-bound form to an OAuth endpoint, taking the server's
// nonce when it asks for one.
func (c *oauthClient) post(t *testing.T, path string, form url.Values) (int, map[string]any) {
	t.Helper()
	for range 2 {
		proof := c.key.Proof(dpoptest.Claims{Method: http.MethodPost, URL: c.s.public + path, Nonce: c.nonce})
		resp, body := c.s.send(t, http.MethodPost, path, form, nil, http.Header{"Dpop": {proof}})
		out := map[string]any{}
		require.NoError(t, json.Unmarshal([]byte(body), &out), body)
		if n := resp.Header.Get("DPoP-Nonce"); n != "" {
			c.nonce = n
		}
		if out["error"] == oauth.CodeUseDPoPNonce {
			continue
		}
		return resp.StatusCode, out
	}
	t.Fatal("the server asked for a nonce twice")
	return 0, nil
}

// resource calls getSession with access as a DPoP-bound token and
// returns the status, taking a new nonce once if the server asks.
func (c *oauthClient) resource(t *testing.T, access string) int {
	t.Helper()
	const nsid = "/xrpc/com.atproto.server.getSession"
	for range 2 {
		proof := c.key.Proof(dpoptest.Claims{Method: http.MethodGet, URL: c.s.public + nsid, Nonce: c.nonce, AccessToken: access})
		resp, _ := c.s.send(t, http.MethodGet, nsid, nil, nil, http.Header{"Authorization": {"DPoP " + access}, "Dpop": {proof}})
		n := resp.Header.Get("DPoP-Nonce")
		if resp.StatusCode != http.StatusUnauthorized || n == "" || n == c.nonce {
			return resp.StatusCode
		}
		c.nonce = n
	}
	return http.StatusUnauthorized
}

// par pushes a fresh authorization request and returns its request_uri.
func (c *oauthClient) par(t *testing.T) string {
	t.Helper()
	c.verifier, c.state = rand.Text()+rand.Text(), rand.Text()
	sum := sha256.Sum256([]byte(c.verifier))
	status, out := c.post(t, oauth.PathPAR, url.Values{
		"client_id": {c.id}, "response_type": {"code"}, "redirect_uri": {c.redirect}, "scope": {"atproto transition:generic"},
		"state": {c.state}, "code_challenge": {base64.RawURLEncoding.EncodeToString(sum[:])}, "code_challenge_method": {"S256"},
	})
	require.Equal(t, http.StatusCreated, status, "%v", out)
	c.requestURI = out["request_uri"].(string)
	return c.requestURI
}

// authorizeURL is the page a browser opens for request_uri.
func (c *oauthClient) authorizeURL(requestURI string) string {
	return c.s.public + oauth.PathAuthorize + "?" + url.Values{"client_id": {c.id}, "request_uri": {requestURI}}.Encode()
}

// code runs a flow in br as u (signing in unless br is signed in already)
// up to the redirect back, and returns the code and the consent page's
// CSRF token.
func (c *oauthClient) code(t *testing.T, br *oauthtest.Browser, u *purposeUser) (code, csrf string) {
	t.Helper()
	authURL := c.authorizeURL(c.par(t))
	consent := br.Get(authURL)
	if strings.Contains(consent.Body, `id="signin-form"`) {
		consent = br.SignIn(authURL, u.handle, u.password)
	}
	require.Equal(t, http.StatusOK, consent.Status, consent.Body)
	csrf = consent.FormFields(t, "consent-form").Get("csrf_token")
	params := br.Approve(consent)
	require.Equal(t, c.state, params.Get("state"))
	return params.Get("code"), csrf
}

// exchange trades code for tokens.
func (c *oauthClient) exchange(t *testing.T, code string) (int, map[string]any) {
	t.Helper()
	return c.post(t, oauth.PathToken, url.Values{"grant_type": {"authorization_code"}, "client_id": {c.id}, "code": {code},
		"redirect_uri": {c.redirect}, "code_verifier": {c.verifier}})
}

// oauthValues runs two flows as u: the first to its tokens, the second to
// an unexchanged code; a third request is pushed and left pending. It
// collects the device cookie, a page's CSRF token and the DPoP nonce too.
func (s *purposeServer) oauthValues(t *testing.T, u *purposeUser, values map[string]string) (*oauthClient, *oauthClient) {
	t.Helper()
	br := oauthtest.NewBrowser(t, s.public, nil)
	first := s.oauthClient()
	code, csrf := first.code(t, br, u)
	status, tokens := first.exchange(t, code)
	require.Equal(t, http.StatusOK, status, "%v", tokens)
	values[pOAuthAccess], values[pOAuthRefresh] = tokens["access_token"].(string), tokens["refresh_token"].(string)
	values[pOAuthCSRF] = csrf
	second := s.oauthClient()
	values[pOAuthCode], _ = second.code(t, br, u)
	values[pOAuthRequestURI] = s.oauthClient().par(t)
	values[pDPoPNonce] = first.nonce
	pub, err := url.Parse(s.public)
	require.NoError(t, err)
	for _, c := range br.HTTP.Jar.Cookies(pub) {
		if strings.HasSuffix(c.Name, "bulwark-device") {
			values[pOAuthDevice] = c.Value
		}
	}
	require.NotEmpty(t, values[pOAuthDevice], "signing in left a device cookie")
	return first, second
}

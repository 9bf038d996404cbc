package pds

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/bluesky-social/indigo/atproto/atclient"
	indigo "github.com/bluesky-social/indigo/atproto/auth/oauth"
	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/account"
	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/oauth"
)

// oauthEnv is a running Bulwark with OAuth on, its issuer the server's
// public URL (plain http, as a local server is), beside a TLS server that
// publishes apps' client metadata documents as an app's own web server
// would. Apps (indigo's OAuth client) find accounts through dir.
type oauthEnv struct {
	*accountEnv
	t    *testing.T
	apps *httptest.Server
	dir  *identity.MockDirectory
	mu   sync.Mutex
	docs map[string]any
}

// oauthEnvOptions adjust an oauthEnv.
type oauthEnvOptions struct {
	// configure adjusts the server's configuration before it is final.
	configure func(*config.Config)
	// options adjusts the server's Options (rate limits, the proxy's
	// outbound client).
	options func(*Options)
}

func newOAuthEnv(t *testing.T, oo oauthEnvOptions) *oauthEnv {
	t.Helper()
	e := &oauthEnv{t: t, dir: identity.NewMockDirectory(), docs: map[string]any{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /client/", func(w http.ResponseWriter, r *http.Request) {
		e.mu.Lock()
		doc, ok := e.docs[r.URL.Path]
		e.mu.Unlock()
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(doc)
	})
	e.apps = httptest.NewTLSServer(mux)
	t.Cleanup(e.apps.Close)
	e.accountEnv = newAccountEnv(t, envOptions{
		sessionEnders: []account.SessionEnder{oauth.RevokeAllGrants},
		configure:     oo.configure,
		blobs:         true,
		options: func(o *Options) {
			o.OAuth = &oauth.Config{
				Issuer: o.Config.PublicURL(), Secret: []byte(o.Config.JWTSecret),
				HTTPClient: e.apps.Client(), AllowPrivateClientIDs: true,
			}
			if oo.options != nil {
				oo.options(o)
			}
		},
	})
	return e
}

// publicURL is where apps reach the server: the issuer, and the PDS
// endpoint of its accounts' DID documents.
func (e *oauthEnv) publicURL() string { return e.cfg.PublicURL() }

// newUser creates an account and makes it known to apps.
func (e *oauthEnv) newUser() *user {
	u := e.createUser(e.t)
	e.dir.Insert(identity.Identity{
		DID: u.did, Handle: syntax.Handle(u.handle), AlsoKnownAs: []string{"at://" + u.handle},
		Services: map[string]identity.ServiceEndpoint{"atproto_pds": {Type: "AtprotoPersonalDataServer", URL: e.publicURL()}},
	})
	return u
}

// app publishes a public client's metadata document and returns indigo's
// client for it.
func (e *oauthEnv) app(name string, scopes ...string) *indigo.ClientApp {
	cfg := indigo.NewPublicConfig(e.apps.URL+"/client/"+name+".json", e.apps.URL+"/callback", scopes)
	e.mu.Lock()
	e.docs["/client/"+name+".json"] = cfg.ClientMetadata()
	e.mu.Unlock()
	app := indigo.NewClientApp(&cfg, indigo.NewMemStore())
	app.Client = &http.Client{}
	app.Dir = e.dir
	return app
}

// startFlow sends the pushed authorization request as indigo's client
// does and returns the URL the app sends the browser to. indigo's
// StartAuthFlow would refuse an http issuer with a port, so the metadata
// is fetched here and the request stored as StartAuthFlow stores it.
func (e *oauthEnv) startFlow(app *indigo.ClientApp, u *user) string {
	t := e.t
	ctx := context.Background()
	resp, err := http.Get(e.publicURL() + oauth.PathASMetadata)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var md indigo.AuthServerMetadata
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&md))
	require.Equal(t, e.publicURL(), md.Issuer)
	info, err := app.SendAuthRequest(ctx, &md, app.Config.Scopes, u.handle)
	require.NoError(t, err)
	info.AccountDID = &u.did
	require.NoError(t, app.Store.SaveAuthRequestInfo(ctx, *info))
	return md.AuthorizationEndpoint + "?" + url.Values{"client_id": {app.Config.ClientID}, "request_uri": {info.RequestURI}}.Encode()
}

// session runs the whole flow for u (sign in and allow in a browser, the
// callback, the token request) and returns the app's session.
func (e *oauthEnv) session(app *indigo.ClientApp, u *user) *indigo.ClientSession {
	t := e.t
	ctx := context.Background()
	params := e.browser().signInAndApprove(e.startFlow(app, u), u.handle, u.pass)
	require.Equal(t, e.publicURL(), params.Get("iss"))
	data, err := app.ProcessCallback(ctx, params)
	require.NoError(t, err)
	require.Equal(t, u.did, data.AccountDID)
	sess, err := app.ResumeSession(ctx, data.AccountDID, data.SessionID)
	require.NoError(t, err)
	return sess
}

// upload sends uploadBlob through the session.
func (e *oauthEnv) upload(sess *indigo.ClientSession, mime, data string) int {
	req, err := http.NewRequest(http.MethodPost, e.publicURL()+"/xrpc/com.atproto.repo.uploadBlob", strings.NewReader(data))
	require.NoError(e.t, err)
	req.Header.Set("Content-Type", mime)
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(data)), nil }
	resp, err := sess.DoWithAuth(http.DefaultClient, req, "com.atproto.repo.uploadBlob")
	require.NoError(e.t, err)
	resp.Body.Close()
	return resp.StatusCode
}

// xrpcCall is one authenticated call through the session, as an app makes
// it (DPoP proofs, nonce retries, refresh on an expired token), with the
// headers of extra (atproto-proxy).
func (e *oauthEnv) xrpcCall(sess *indigo.ClientSession, method, nsid string, body any, extra ...http.Header) xrpcResult {
	t := e.t
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		require.NoError(t, err)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, e.publicURL()+"/xrpc/"+nsid, rd)
	require.NoError(t, err)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
		req.GetBody = func() (io.ReadCloser, error) {
			b, _ := json.Marshal(body)
			return io.NopCloser(bytes.NewReader(b)), nil
		}
	}
	for _, h := range extra {
		for k, vs := range h {
			req.Header[k] = vs
		}
	}
	resp, err := sess.DoWithAuth(http.DefaultClient, req, syntax.NSID(strings.SplitN(nsid, "?", 2)[0]))
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return xrpcResult{status: resp.StatusCode, header: resp.Header, body: b}
}

// requireScopeRefusal requires the 403 an OAuth session gets for a method
// outside its grant.
func requireScopeRefusal(t *testing.T, res xrpcResult, need string) {
	t.Helper()
	msg := res.fails(t, http.StatusForbidden, "InsufficientScope")
	require.Contains(t, res.header.Get("WWW-Authenticate"), `error="insufficient_scope"`)
	if need != "" {
		require.Contains(t, msg, need)
	}
}

// apiStatus is the status of an atclient call's error (200 for none).
func apiStatus(t *testing.T, err error) (int, string) {
	t.Helper()
	if err == nil {
		return http.StatusOK, ""
	}
	var ae *atclient.APIError
	require.True(t, errors.As(err, &ae), "not an API error: %v", err)
	return ae.StatusCode, ae.Name
}

// browser is a person's browser for the sign-in pages: it keeps cookies
// and stops at redirects, so the test sees where they lead.
type browser struct {
	t    *testing.T
	base string
	http *http.Client
}

func (e *oauthEnv) browser() *browser {
	jar, err := cookiejar.New(nil)
	require.NoError(e.t, err)
	return &browser{t: e.t, base: e.publicURL(), http: &http.Client{
		Jar:           jar,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
}

// page is a fetched HTML page.
type page struct {
	status int
	header http.Header
	body   string
}

func (b *browser) get(u string) *page {
	resp, err := b.http.Get(u)
	require.NoError(b.t, err)
	return readPage(b.t, resp)
}

// post submits a form as a browser does from a page of the server.
func (b *browser) post(path string, form url.Values) *page {
	req, err := http.NewRequest(http.MethodPost, b.base+path, strings.NewReader(form.Encode()))
	require.NoError(b.t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", b.base)
	resp, err := b.http.Do(req)
	require.NoError(b.t, err)
	return readPage(b.t, resp)
}

func readPage(t *testing.T, resp *http.Response) *page {
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return &page{status: resp.StatusCode, header: resp.Header, body: string(body)}
}

var hiddenInput = regexp.MustCompile(`<input type="hidden" name="([a-z_]+)" value="([^"]*)">`)

// formFields returns the hidden fields of the form with the given id.
func (p *page) formFields(t *testing.T, id string) url.Values {
	t.Helper()
	start := strings.Index(p.body, `<form id="`+id+`"`)
	require.GreaterOrEqual(t, start, 0, "form %s not on the page:\n%s", id, p.body)
	end := strings.Index(p.body[start:], "</form>")
	vals := url.Values{}
	for _, m := range hiddenInput.FindAllStringSubmatch(p.body[start:start+end], -1) {
		vals.Set(m[1], htmlUnescape(m[2]))
	}
	return vals
}

func htmlUnescape(s string) string {
	return strings.NewReplacer("&amp;", "&", "&#43;", "+", "&#34;", `"`, "&#39;", "'", "&lt;", "<", "&gt;", ">").Replace(s)
}

// signIn opens the authorization page and signs in, returning the page
// that follows (the consent page on success).
func (b *browser) signIn(authURL, identifier, password string) *page {
	t := b.t
	p := b.get(authURL)
	require.Equal(t, http.StatusOK, p.status, p.body)
	form := p.formFields(t, "signin-form")
	form.Set("identifier", identifier)
	form.Set("password", password)
	return b.post(oauth.PathAuthorize, form)
}

// signInAndApprove signs in, allows the app, and returns the parameters
// of the redirect back to it.
func (b *browser) signInAndApprove(authURL, identifier, password string) url.Values {
	t := b.t
	p := b.signIn(authURL, identifier, password)
	require.Equal(t, http.StatusOK, p.status, p.body)
	form := p.formFields(t, "consent-form")
	form.Set("action", "approve")
	p = b.post(oauth.PathAuthorize, form)
	require.Equal(t, http.StatusSeeOther, p.status, p.body)
	loc, err := url.Parse(p.header.Get("Location"))
	require.NoError(t, err)
	return loc.Query()
}

// grantCount counts did's OAuth grants.
func (e *oauthEnv) grantCount(did syntax.DID) int {
	var n int
	require.NoError(e.t, e.pool.QueryRow(context.Background(), "SELECT count(*) FROM oauth_grants WHERE did = $1", did.String()).Scan(&n))
	return n
}

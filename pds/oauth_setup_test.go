package pds

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
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
	"github.com/bulwark-pds/bulwark/oauth/oauthtest"
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
	// env adjusts the account environment (password slots).
	env func(*envOptions)
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
	eo := envOptions{
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
	}
	if oo.env != nil {
		oo.env(&eo)
	}
	e.accountEnv = newAccountEnv(t, eo)
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
	md := e.metadata()
	info, err := app.SendAuthRequest(ctx, md, app.Config.Scopes, u.handle)
	require.NoError(t, err)
	info.AccountDID = &u.did
	require.NoError(t, app.Store.SaveAuthRequestInfo(ctx, *info))
	return md.AuthorizationEndpoint + "?" + url.Values{"client_id": {app.Config.ClientID}, "request_uri": {info.RequestURI}}.Encode()
}

// metadata is the server's authorization server metadata, as indigo's
// client reads it.
func (e *oauthEnv) metadata() *indigo.AuthServerMetadata {
	t := e.t
	resp, err := http.Get(e.publicURL() + oauth.PathASMetadata)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var md indigo.AuthServerMetadata
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&md))
	require.Equal(t, e.publicURL(), md.Issuer)
	return &md
}

// session runs the whole flow for u (sign in and allow in a browser, the
// callback, the token request) and returns the app's session.
func (e *oauthEnv) session(app *indigo.ClientApp, u *user) *indigo.ClientSession {
	t := e.t
	ctx := context.Background()
	params := e.browser().SignInAndApprove(e.startFlow(app, u), u.handle, u.pass)
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

// browser is a person's browser on the server's sign-in pages.
func (e *oauthEnv) browser() *oauthtest.Browser {
	return oauthtest.NewBrowser(e.t, e.publicURL(), nil)
}

// grantCount counts did's OAuth grants.
func (e *oauthEnv) grantCount(did syntax.DID) int {
	var n int
	require.NoError(e.t, e.pool.QueryRow(context.Background(), "SELECT count(*) FROM oauth_grants WHERE did = $1", did.String()).Scan(&n))
	return n
}

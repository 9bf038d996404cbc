package pds

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/oauth"
	"github.com/bulwark-pds/bulwark/oauth/dpop/dpoptest"
)

// TestOAuthIndigoClientFlow: indigo's OAuth client signs in to a real
// server (PAR, the pages, callback, token), writes a record with its
// DPoP-bound token, refreshes, revokes, and is refused afterwards.
func TestOAuthIndigoClientFlow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newOAuthEnv(t, oauthEnvOptions{})
	u := e.newUser()
	app := e.app("app", "atproto", "transition:generic")
	sess := e.session(app, u)
	require.ElementsMatch(t, []string{"atproto", "transition:generic"}, sess.Data.Scopes)

	c := sess.APIClient()
	var out struct{ URI, CID string }
	require.NoError(t, c.Post(ctx, "com.atproto.repo.createRecord",
		map[string]any{"repo": u.did.String(), "collection": "app.bsky.feed.post", "record": postRecord("hello over OAuth")}, &out))
	require.True(t, strings.HasPrefix(out.URI, "at://"+u.did.String()+"/app.bsky.feed.post/"), out.URI)
	rec := e.get(t, "com.atproto.repo.getRecord", "", url.Values{"repo": {u.did.String()}, "collection": {"app.bsky.feed.post"},
		"rkey": {out.URI[strings.LastIndex(out.URI, "/")+1:]}}).ok(t)
	require.Contains(t, string(rec.body), "hello over OAuth")

	// Successful answers carry the current DPoP nonce.
	res := e.xrpcCall(sess, http.MethodGet, "com.atproto.server.getSession", nil).ok(t)
	require.NotEmpty(t, res.header.Get("DPoP-Nonce"))
	require.Equal(t, u.handle, res.str(t, "handle"))
	require.Empty(t, res.str(t, "email"), "no transition:email, no email")

	// transition:generic mints service-auth tokens for any method but chat,
	// each naming its method: a token good for every method (no lxm) needs
	// rpc:*.
	e.xrpcCall(sess, http.MethodGet, "com.atproto.server.getServiceAuth?aud=did:web:api.bsky.app&lxm=app.bsky.feed.getTimeline", nil).ok(t)
	requireScopeRefusal(t, e.xrpcCall(sess, http.MethodGet, "com.atproto.server.getServiceAuth?aud=did:web:api.bsky.chat&lxm=chat.bsky.convo.listConvos", nil), "rpc:chat.bsky.convo.listConvos")
	requireScopeRefusal(t, e.xrpcCall(sess, http.MethodGet, "com.atproto.server.getServiceAuth?aud=did:web:api.bsky.app", nil), "rpc:*?aud=did:web:api.bsky.app")

	old := sess.Data.AccessToken
	_, err := sess.RefreshTokens(ctx)
	require.NoError(t, err)
	require.NotEqual(t, old, sess.Data.AccessToken)
	require.NoError(t, c.Post(ctx, "com.atproto.repo.createRecord",
		map[string]any{"repo": u.did.String(), "collection": "app.bsky.feed.post", "record": postRecord("after refresh")}, &out))

	require.NoError(t, sess.RevokeSession(ctx))
	require.Zero(t, e.grantCount(u.did))
	res = e.rawCall(sess, sess.Data.AccessToken, "")
	res.fails(t, http.StatusUnauthorized, oauth.CodeInvalidToken)
	require.Contains(t, res.header.Get("WWW-Authenticate"), `error="invalid_token"`)
	_, err = sess.RefreshTokens(ctx)
	require.ErrorContains(t, err, "invalid_grant")
}

// rawCall makes getSession with token and a proof signed by sess's DPoP
// key, or by another key when sess is nil; proof "-" sends none. No
// retries: the answer is the server's first.
func (e *oauthEnv) rawCall(sess interface {
	NewHostDPoP(method, url string) (string, error)
}, token, proof string) xrpcResult {
	u := e.publicURL() + "/xrpc/com.atproto.server.getSession"
	if proof == "" && sess != nil {
		var err error
		proof, err = sess.NewHostDPoP(http.MethodGet, u)
		require.NoError(e.t, err)
	}
	h := http.Header{"Authorization": {"DPoP " + token}}
	if proof != "-" {
		h.Set("DPoP", proof)
	}
	return e.do(e.t, http.MethodGet, "com.atproto.server.getSession", "", nil, nil, h)
}

// TestOAuthScopeLimitsMethods: a token granted only
// repo:app.bsky.feed.post?action=create creates posts and nothing else.
func TestOAuthScopeLimitsMethods(t *testing.T) {
	t.Parallel()
	e := newOAuthEnv(t, oauthEnvOptions{})
	u := e.newUser()
	sess := e.session(e.app("poster", "atproto", "repo:app.bsky.feed.post?action=create"), u)
	repoArg := u.did.String()

	created := e.xrpcCall(sess, http.MethodPost, "com.atproto.repo.createRecord",
		map[string]any{"repo": repoArg, "collection": "app.bsky.feed.post", "record": postRecord("allowed")}).ok(t)
	rkey := created.str(t, "uri")[strings.LastIndex(created.str(t, "uri"), "/")+1:]
	before := e.rowCounts(t)

	like := map[string]any{"$type": "app.bsky.feed.like", "createdAt": "2026-01-01T00:00:00Z",
		"subject": map[string]any{"uri": created.str(t, "uri"), "cid": created.str(t, "cid")}}
	refusals := []struct {
		method, nsid string
		body         any
		need         string
	}{
		{"POST", "com.atproto.repo.createRecord", map[string]any{"repo": repoArg, "collection": "app.bsky.feed.like", "record": like}, "repo:app.bsky.feed.like?action=create"},
		{"POST", "com.atproto.repo.deleteRecord", map[string]any{"repo": repoArg, "collection": "app.bsky.feed.post", "rkey": rkey}, "action=delete"},
		{"POST", "com.atproto.repo.putRecord", map[string]any{"repo": repoArg, "collection": "app.bsky.feed.post", "rkey": rkey, "record": postRecord("edited")}, "action=update"},
		{"POST", "com.atproto.repo.applyWrites", map[string]any{"repo": repoArg, "writes": []any{
			map[string]any{"$type": "com.atproto.repo.applyWrites#create", "collection": "app.bsky.feed.post", "value": postRecord("one")},
			map[string]any{"$type": "com.atproto.repo.applyWrites#create", "collection": "app.bsky.feed.like", "value": like},
		}}, "app.bsky.feed.like"},
		{"POST", "com.atproto.server.createAppPassword", map[string]any{"name": "sneaky"}, ""},
		{"POST", "com.atproto.identity.updateHandle", map[string]any{"handle": "other" + u.handle}, "identity:handle"},
		{"GET", "com.atproto.server.getServiceAuth?aud=did:web:api.bsky.app&lxm=app.bsky.feed.getTimeline", nil, "rpc:app.bsky.feed.getTimeline"},
		{"GET", "com.atproto.server.listAppPasswords", nil, ""},
		{"GET", "com.atproto.server.checkAccountStatus", nil, "transition:generic"},
	}
	for _, tc := range refusals {
		res := e.xrpcCall(sess, tc.method, tc.nsid, tc.body)
		require.Equal(t, http.StatusForbidden, res.status, "%s: %s", tc.nsid, res.body)
		requireScopeRefusal(t, res, tc.need)
	}
	require.Equal(t, before, e.rowCounts(t), "a refused write stores nothing")

	// uploadBlob needs blob: for the upload's type.
	require.Equal(t, http.StatusForbidden, e.upload(sess, "image/png", "png bytes"))

	// Who the account is, any grant may learn; the email it may not.
	res := e.xrpcCall(sess, http.MethodGet, "com.atproto.server.getSession", nil).ok(t)
	require.Equal(t, u.did.String(), res.str(t, "did"))
	require.Empty(t, res.str(t, "email"))
	// Methods without a session are as before.
	e.get(t, "com.atproto.server.describeServer", "", nil).ok(t)
}

// TestOAuthScopeGrantsWhatItNames: the granular permissions open exactly
// their methods: a like collection, an image upload, the email address,
// a service-auth token for one method at one service.
func TestOAuthScopeGrantsWhatItNames(t *testing.T) {
	t.Parallel()
	e := newOAuthEnv(t, oauthEnvOptions{})
	u := e.newUser()
	sess := e.session(e.app("granular", "atproto", "repo:app.bsky.feed.like", "account:email", "blob:image/*",
		"rpc:app.bsky.feed.getTimeline?aud=did:web:api.bsky.app%23bsky_appview"), u)
	require.Equal(t, http.StatusOK, e.upload(sess, "image/png", string(pngData(t, 100))))
	require.Equal(t, http.StatusForbidden, e.upload(sess, "text/plain", "text"))
	like := map[string]any{"$type": "app.bsky.feed.like", "createdAt": "2026-01-01T00:00:00Z",
		"subject": map[string]any{"uri": "at://did:plc:abc/app.bsky.feed.post/3k", "cid": "bafyreie5737gdxlw5i64vzichcalba3z2v5n6icifvx5xytvske7mr3hpm"}}
	created := e.xrpcCall(sess, http.MethodPost, "com.atproto.repo.createRecord",
		map[string]any{"repo": u.did.String(), "collection": "app.bsky.feed.like", "record": like}).ok(t)
	rkey := created.str(t, "uri")[strings.LastIndex(created.str(t, "uri"), "/")+1:]
	e.xrpcCall(sess, http.MethodPost, "com.atproto.repo.deleteRecord",
		map[string]any{"repo": u.did.String(), "collection": "app.bsky.feed.like", "rkey": rkey}).ok(t)

	res := e.xrpcCall(sess, http.MethodGet, "com.atproto.server.getSession", nil).ok(t)
	require.NotEmpty(t, res.str(t, "email"))

	tok := e.xrpcCall(sess, http.MethodGet, "com.atproto.server.getServiceAuth?aud=did:web:api.bsky.app%23bsky_appview&lxm=app.bsky.feed.getTimeline", nil).ok(t)
	require.NotEmpty(t, tok.str(t, "token"))
	res = e.xrpcCall(sess, http.MethodGet, "com.atproto.server.getServiceAuth?aud=did:web:api.bsky.app%23bsky_appview&lxm=app.bsky.feed.getAuthorFeed", nil)
	requireScopeRefusal(t, res, "rpc:app.bsky.feed.getAuthorFeed")
	res = e.xrpcCall(sess, http.MethodGet, "com.atproto.server.getServiceAuth?aud=did:web:api.bsky.app%23bsky_appview", nil)
	requireScopeRefusal(t, res, "rpc:*")

	// transition:chat.bsky adds chat to transition:generic.
	chat := e.session(e.app("chat", "atproto", "transition:generic", "transition:chat.bsky"), u)
	e.xrpcCall(chat, http.MethodGet, "com.atproto.server.getServiceAuth?aud=did:web:api.bsky.chat&lxm=chat.bsky.convo.listConvos", nil).ok(t)
}

// TestOAuthServiceAuthForAnyMethod: a service-auth token without lxm,
// good for any method at its audience, takes the wildcard permission for
// that audience.
func TestOAuthServiceAuthForAnyMethod(t *testing.T) {
	t.Parallel()
	e := newOAuthEnv(t, oauthEnvOptions{})
	u := e.newUser()
	const appview = "did:web:api.bsky.app%23bsky_appview"
	sess := e.session(e.app("wildcard", "atproto", "rpc:*?aud="+appview), u)
	tok := e.xrpcCall(sess, http.MethodGet, "com.atproto.server.getServiceAuth?aud="+appview, nil).ok(t)
	require.NotEmpty(t, tok.str(t, "token"))
	requireScopeRefusal(t, e.xrpcCall(sess, http.MethodGet, "com.atproto.server.getServiceAuth?aud=did:web:other.example%23svc", nil), "rpc:*")
}

// TestOAuthTokenNeedsItsDPoPKey: a stolen access token is useless without
// the key it is bound to.
func TestOAuthTokenNeedsItsDPoPKey(t *testing.T) {
	t.Parallel()
	e := newOAuthEnv(t, oauthEnvOptions{})
	u := e.newUser()
	sess := e.session(e.app("app", "atproto", "transition:generic"), u)
	token := sess.Data.AccessToken

	first := e.rawCall(sess, token, "")
	if first.status == http.StatusUnauthorized {
		// A nonce was needed; the answer carried the current one.
		sess.Data.DPoPHostNonce = first.header.Get("DPoP-Nonce")
		first = e.rawCall(sess, token, "")
	}
	first.ok(t)
	nonce := first.header.Get("DPoP-Nonce")
	require.NotEmpty(t, nonce)

	thief := dpoptest.NewKey()
	proof := thief.Proof(dpoptest.Claims{Method: http.MethodGet, URL: e.publicURL() + "/xrpc/com.atproto.server.getSession", Nonce: nonce, AccessToken: token})
	res := e.rawCall(nil, token, proof)
	res.fails(t, http.StatusUnauthorized, oauth.CodeInvalidToken)
	require.Contains(t, res.header.Get("WWW-Authenticate"), `error="invalid_token"`)
	require.NotEmpty(t, res.header.Get("DPoP-Nonce"))

	res = e.rawCall(nil, token, "-")
	res.fails(t, http.StatusUnauthorized, oauth.CodeInvalidDPoP)
	// As a bearer token it is no session token either.
	e.get(t, "com.atproto.server.getSession", token, nil).fails(t, http.StatusBadRequest, "InvalidToken")
	// With its own key it still works.
	e.rawCall(sess, token, "").ok(t)
}

// TestOAuthConsentNeedsCSRF: the consent form is refused without its CSRF
// token (or with another browser's), and no code is issued.
func TestOAuthConsentNeedsCSRF(t *testing.T) {
	t.Parallel()
	e := newOAuthEnv(t, oauthEnvOptions{})
	u := e.newUser()
	app := e.app("app", "atproto", "transition:generic")
	b := e.browser()
	p := b.SignIn(e.startFlow(app, u), u.handle, u.pass)
	require.Equal(t, http.StatusOK, p.Status, p.Body)
	form := p.FormFields(t, "consent-form")
	form.Set("action", "approve")

	missing := url.Values{}
	for k, v := range form {
		if k != "csrf_token" {
			missing[k] = v
		}
	}
	for _, f := range []url.Values{missing, withValue(form, "csrf_token", "forged")} {
		refused := b.Post(oauth.PathAuthorize, f)
		require.Equal(t, http.StatusForbidden, refused.Status, refused.Body)
		require.Contains(t, refused.Body, "This form has expired")
		require.Empty(t, refused.Header.Get("Location"))
	}
	var codes int
	require.NoError(t, e.pool.QueryRow(context.Background(), "SELECT count(*) FROM oauth_requests WHERE code_hash IS NOT NULL").Scan(&codes))
	require.Zero(t, codes)

	// The request itself was not spoiled: with the token the form works.
	ok := b.Post(oauth.PathAuthorize, form)
	require.Equal(t, http.StatusSeeOther, ok.Status, ok.Body)
	require.Contains(t, ok.Header.Get("Location"), "code=")
}

func withValue(v url.Values, key, value string) url.Values {
	out := url.Values{}
	for k, vs := range v {
		out[k] = vs
	}
	out.Set(key, value)
	return out
}

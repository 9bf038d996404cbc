package pds

import (
	"bytes"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/account"
	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/oauth"
)

// takendownReach is what a taken-down account's session
// (createSession's allowTakendown) may do beyond an anonymous caller: the
// methods the reference PDS opens to its com.atproto.takendown scope.
var takendownReach = map[string]bool{
	"com.atproto.sync.getRepo":                          true,
	"com.atproto.sync.getCheckout":                      true,
	"com.atproto.sync.getBlob":                          true,
	"com.atproto.sync.listBlobs":                        true,
	"com.atproto.sync.getLatestCommit":                  true,
	"com.atproto.sync.getHead":                          true,
	"com.atproto.sync.getRecord":                        true,
	"com.atproto.sync.getBlocks":                        true,
	"com.atproto.sync.getRepoStatus":                    true,
	"com.atproto.server.getServiceAuth":                 true,
	"com.atproto.server.deactivateAccount":              true,
	"com.atproto.identity.requestPlcOperationSignature": true,
	"com.atproto.identity.signPlcOperation":             true,
	"app.bsky.actor.getPreferences":                     true,
}

// takendownUser makes an account with an app password and (when the
// server stores blobs) a record with a blob, and takes it down.
func takendownUser(t *testing.T, e *accountEnv) (*user, string, string) {
	t.Helper()
	u := e.createUser(t)
	app := e.post(t, "com.atproto.server.createAppPassword", u.access, map[string]any{"name": "phone"}).ok(t).str(t, "password")
	if e.blobs == nil {
		takedown(t, e, u)
		return u, app, ""
	}
	up := e.do(t, http.MethodPost, "com.atproto.repo.uploadBlob", u.access, bytes.NewReader([]byte("\x89PNG\r\n\x1a\nnot really")), nil,
		http.Header{"Content-Type": {"image/png"}}).ok(t).json(t)
	blob := up["blob"].(map[string]any)
	cid := blob["ref"].(map[string]any)["$link"].(string)
	e.post(t, "com.atproto.repo.createRecord", u.access, map[string]any{
		"repo": u.did.String(), "collection": "app.bsky.feed.post",
		"record": map[string]any{"$type": "app.bsky.feed.post", "text": "with a picture", "createdAt": "2026-11-29T12:00:00.000Z",
			"embed": map[string]any{"$type": "app.bsky.embed.images", "images": []any{map[string]any{"alt": "", "image": blob}}}},
	}).ok(t)
	takedown(t, e, u)
	return u, app, cid
}

func takedown(t *testing.T, e *accountEnv, u *user) {
	t.Helper()
	e.adminProc(t, "updateSubjectStatus", map[string]any{
		"subject":  map[string]any{"$type": "com.atproto.admin.defs#repoRef", "did": u.did.String()},
		"takedown": map[string]any{"applied": true, "ref": "t-1"},
	}).ok(t)
}

// A taken-down account signs in with allowTakendown and its account
// password only, gets a session that exports its repository and moves it
// away, and nothing else; the session is never refreshed, even after the
// takedown is lifted.
func TestTakendownSession(t *testing.T) {
	t.Parallel()
	// Blobs tracked by the engine (listBlobs), OAuth on: the method table
	// of serve, but for subscribeRepos.
	e := newAccountEnv(t, envOptions{blobs: true, options: func(o *Options) {
		o.OAuth = &oauth.Config{Issuer: o.Config.PublicURL(), Secret: []byte(o.Config.JWTSecret)}
	}})
	u, app, blobCID := takendownUser(t, e)
	const create = "com.atproto.server.createSession"
	e.post(t, create, "", map[string]any{"identifier": u.handle, "password": u.pass}).fails(t, http.StatusUnauthorized, "AccountTakedown")
	e.post(t, create, "", map[string]any{"identifier": u.handle, "password": u.pass, "allowTakendown": false}).
		fails(t, http.StatusUnauthorized, "AccountTakedown")
	e.post(t, create, "", map[string]any{"identifier": u.handle, "password": app, "allowTakendown": true}).
		fails(t, http.StatusUnauthorized, "AuthenticationRequired")
	e.post(t, create, "", map[string]any{"identifier": u.handle, "password": "wrong password", "allowTakendown": true}).
		fails(t, http.StatusUnauthorized, "AuthenticationRequired")
	sess := e.post(t, create, "", map[string]any{"identifier": u.handle, "password": u.pass, "allowTakendown": true}).ok(t).json(t)
	require.Equal(t, false, sess["active"])
	require.Equal(t, "takendown", sess["status"])
	tok, refresh := sess["accessJwt"].(string), sess["refreshJwt"].(string)
	a, err := e.accounts.ParseAccess(tok)
	require.NoError(t, err)
	require.Equal(t, account.ScopeTakendown, a.Scope)

	// What moving away needs.
	mine := url.Values{"did": {u.did.String()}}
	car := e.get(t, "com.atproto.sync.getRepo", tok, mine).ok(t)
	require.Equal(t, carContentType, car.header.Get("Content-Type"))
	require.NotEmpty(t, car.body)
	e.get(t, "com.atproto.sync.getRepo", "", mine).fails(t, http.StatusBadRequest, "RepoTakendown")
	require.Contains(t, string(e.get(t, "com.atproto.sync.listBlobs", tok, mine).ok(t).body), blobCID)
	e.get(t, "com.atproto.sync.getBlob", tok, url.Values{"did": {u.did.String()}, "cid": {blobCID}}).ok(t)
	e.get(t, "com.atproto.sync.getBlob", "", url.Values{"did": {u.did.String()}, "cid": {blobCID}}).fails(t, http.StatusBadRequest, "RepoTakendown")
	e.get(t, "app.bsky.actor.getPreferences", tok, nil).ok(t)
	e.get(t, "com.atproto.server.getServiceAuth", tok, url.Values{"aud": {"did:web:elsewhere.example"}, "lxm": {"com.atproto.server.createAccount"}}).ok(t)
	e.get(t, "com.atproto.server.getServiceAuth", tok, url.Values{"aud": {"did:web:elsewhere.example"}, "lxm": {"app.bsky.feed.getTimeline"}}).
		fails(t, http.StatusBadRequest, "InvalidToken")
	e.get(t, "com.atproto.server.getServiceAuth", tok, url.Values{"aud": {"did:web:elsewhere.example"}}).
		fails(t, http.StatusBadRequest, "InvalidToken")
	e.post(t, "com.atproto.identity.requestPlcOperationSignature", tok, nil).ok(t)
	require.NotEmpty(t, e.heldCode(t, u.did, "plc_operation"))

	// Nothing else: every method answers the session no better than an
	// anonymous caller.
	for _, nsid := range sortedKeys(e.server.methods) {
		if takendownReach[nsid] {
			continue
		}
		m := e.server.methods[nsid]
		call := func(token string) xrpcResult {
			if m.kind == kindProcedure {
				return e.do(t, http.MethodPost, nsid, token, strings.NewReader(`{"repo":"`+u.did.String()+`","did":"`+u.did.String()+`"}`), nil, nil)
			}
			return e.do(t, http.MethodGet, nsid, token, nil, url.Values{"did": {u.did.String()}, "repo": {u.did.String()}}, nil)
		}
		with := call(tok)
		require.Less(t, with.status, 500, "%s: %s", nsid, with.body)
		if with.status < 300 {
			require.Less(t, call("").status, 300, "%s answered a taken-down session (%d %s) but not an anonymous caller", nsid, with.status, with.body)
		}
	}
	e.post(t, "com.atproto.server.refreshSession", refresh, nil).fails(t, http.StatusUnauthorized, "AccountTakedown")

	// deactivateAccount is accepted and leaves the takedown in place.
	e.post(t, "com.atproto.server.deactivateAccount", tok, nil).ok(t)
	got, err := e.accounts.Get(t.Context(), u.did)
	require.NoError(t, err)
	require.Equal(t, account.StatusTakendown, got.Status)

	// Lifted takedown: the session is still only a taken-down one.
	e.adminProc(t, "updateSubjectStatus", map[string]any{
		"subject":  map[string]any{"$type": "com.atproto.admin.defs#repoRef", "did": u.did.String()},
		"takedown": map[string]any{"applied": false},
	}).ok(t)
	e.post(t, "com.atproto.repo.createRecord", tok, map[string]any{
		"repo": u.did.String(), "collection": "app.bsky.feed.post", "record": post("should not be written"),
	}).fails(t, http.StatusBadRequest, "InvalidToken")
	e.get(t, "com.atproto.server.getSession", tok, nil).fails(t, http.StatusBadRequest, "InvalidToken")
	e.post(t, "com.atproto.server.refreshSession", refresh, nil).fails(t, http.StatusBadRequest, "InvalidToken")
	// A normal sign-in works again.
	e.post(t, create, "", map[string]any{"identifier": u.handle, "password": u.pass}).ok(t)
}

// A taken-down account may still report (createReport, through the proxy
// to the report service, with a service token of its own), as in the
// reference PDS; nothing else reaches a proxied service with its session.
func TestTakendownSessionReports(t *testing.T) {
	t.Parallel()
	e := newProxyEnv(t, proxyEnvOptions{configure: func(c *config.Config) {
		// The fake app view stands in for the report service too.
		c.ReportServiceURL, c.ReportServiceDID = c.AppViewURL, c.AppViewDID
	}})
	u, _, _ := takendownUser(t, e.accountEnv)
	tok := e.post(t, "com.atproto.server.createSession", "", map[string]any{"identifier": u.handle, "password": u.pass, "allowTakendown": true}).
		ok(t).str(t, "accessJwt")
	e.call(t, "app.bsky.feed.getTimeline", tok, "", nil).fails(t, http.StatusBadRequest, "InvalidToken")
	require.Empty(t, e.calls("app.bsky.feed.getTimeline"))
	res := e.post(t, "com.atproto.moderation.createReport", tok, map[string]any{
		"reasonType": "com.atproto.moderation.defs#reasonAppeal",
		"subject":    map[string]any{"$type": "com.atproto.admin.defs#repoRef", "did": u.did.String()},
	})
	require.NotEqual(t, http.StatusBadRequest, res.status, "%s", res.body)
	e.requireOneVerified(t, e.fakes.AppView.Name, "com.atproto.moderation.createReport", u.did, e.fakes.AppView.DID, "com.atproto.moderation.createReport")
}

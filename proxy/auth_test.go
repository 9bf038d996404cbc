package proxy

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/bluesky-social/indigo/atproto/auth"
	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/stretchr/testify/require"
)

func TestRefusalsMakeNoUpstreamCall(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, jsonOK(`{}`))
	res := &stubResolver{services: map[syntax.DID]map[string]string{chatDID: {"bsky_chat": up.URL}}}
	k, _ := account(t, callerDID)
	f := newFront(t, Config{AppViewURL: up.URL, AppViewDID: appViewDID, Resolver: res, Keys: k}, authed)

	for nsid := range protectedMethods {
		for _, hdr := range []map[string]string{nil, {"atproto-proxy": "did:web:chat.test#bsky_chat"}} {
			r := f.get(t, string(nsid), hdr)
			require.Equal(t, 400, r.status, nsid)
			require.Equal(t, "InvalidToken", r.err["error"], nsid)
		}
	}
	f.setCaller(Caller{DID: callerDID, Authenticated: true, Privileged: true})
	r := f.get(t, "com.atproto.server.getSession", nil)
	require.Equal(t, 400, r.status, "protected even for a privileged caller")

	f.setCaller(authed) // an app-password session without the privileged flag
	for _, nsid := range []string{"chat.bsky.convo.listConvos", "chat.bsky.actor.deleteAccount", "com.atproto.server.createAccount"} {
		r := f.get(t, nsid, map[string]string{"atproto-proxy": "did:web:chat.test#bsky_chat"})
		require.Equal(t, 400, r.status, nsid)
		require.Equal(t, "InvalidToken", r.err["error"], nsid)
	}
	f.setCaller(Caller{})
	r = f.get(t, "chat.bsky.convo.listConvos", map[string]string{"atproto-proxy": "did:web:chat.test#bsky_chat"})
	require.Equal(t, 400, r.status, "unauthenticated chat")

	require.Zero(t, up.hits.Load(), "no refused request reached the upstream")
	require.Zero(t, res.calls.Load(), "nor was any DID resolved for one")

	f.setCaller(Caller{DID: callerDID, Authenticated: true, Privileged: true})
	r = f.get(t, "chat.bsky.convo.listConvos", map[string]string{"atproto-proxy": "did:web:chat.test#bsky_chat"})
	require.Equal(t, 200, r.status, r.body)
	require.EqualValues(t, 1, up.hits.Load())

	// Policy helpers used by getServiceAuth.
	require.True(t, IsProtected("com.atproto.identity.signPlcOperation"))
	require.False(t, IsProtected("app.bsky.feed.getTimeline"))
	require.True(t, IsPrivileged("chat.bsky.convo.sendMessage"))
	require.True(t, IsPrivileged("com.atproto.server.createAccount"))
	require.False(t, IsPrivileged("app.bsky.feed.getTimeline"))
}

// tokenRecorder is a fake service that validates each request's service
// token the way a real service does (indigo's ServiceAuthValidator against
// the caller's DID document) and records the outcome.
type tokenRecorder struct {
	mu     sync.Mutex
	auths  []string
	issers []syntax.DID
	errs   []error
}

func (tr *tokenRecorder) handler(aud string, lxm syntax.NSID, dir identity.Directory) http.HandlerFunc {
	v := &auth.ServiceAuthValidator{Audience: aud, Dir: dir}
	return func(w http.ResponseWriter, r *http.Request) {
		h := r.Header.Get("Authorization")
		var iss syntax.DID
		var err error
		if h != "" {
			iss, err = v.Validate(r.Context(), strings.TrimPrefix(h, "Bearer "), &lxm)
		}
		tr.mu.Lock()
		tr.auths, tr.issers, tr.errs = append(tr.auths, h), append(tr.issers, iss), append(tr.errs, err)
		tr.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"ok":true}`))
	}
}

func claims(t *testing.T, authz string) map[string]any {
	t.Helper()
	parts := strings.Split(strings.TrimPrefix(authz, "Bearer "), ".")
	require.Len(t, parts, 3)
	raw, err := base64.RawURLEncoding.DecodeString(parts[1])
	require.NoError(t, err)
	var c map[string]any
	require.NoError(t, json.Unmarshal(raw, &c))
	return c
}

func TestServiceTokenClaims(t *testing.T) {
	t.Parallel()
	k, dir := account(t, callerDID)
	var app, chat tokenRecorder
	appUp := newUpstream(t, app.handler(string(appViewDID), "app.bsky.feed.getTimeline", dir))
	chatUp := newUpstream(t, chat.handler(string(chatDID), "chat.bsky.convo.listConvos", dir))
	res := &stubResolver{services: map[syntax.DID]map[string]string{chatDID: {"bsky_chat": chatUp.URL}}}
	f := newFront(t, Config{AppViewURL: appUp.URL, AppViewDID: appViewDID, Resolver: res, Keys: k}, authed)

	r := f.get(t, "app.bsky.feed.getTimeline", map[string]string{"Authorization": "Bearer client-session-token"})
	require.Equal(t, 200, r.status, r.body)
	f.setCaller(Caller{DID: callerDID, Authenticated: true, Privileged: true})
	r = f.get(t, "chat.bsky.convo.listConvos", map[string]string{"atproto-proxy": "did:web:chat.test#bsky_chat"})
	require.Equal(t, 200, r.status, r.body)

	for _, tr := range []*tokenRecorder{&app, &chat} {
		require.Len(t, tr.auths, 1)
		require.NoError(t, tr.errs[0], "the token verifies against the caller's DID document")
		require.Equal(t, callerDID, tr.issers[0])
		c := claims(t, tr.auths[0])
		require.EqualValues(t, 60, c["exp"].(float64)-c["iat"].(float64))
		require.NotEmpty(t, c["jti"])
		require.NotContains(t, c["aud"], "#", "aud is the bare DID")
	}
	require.Equal(t, "chat.bsky.convo.listConvos", claims(t, chat.auths[0])["lxm"])
	require.Equal(t, string(chatDID), claims(t, chat.auths[0])["aud"])

	// Two requests, two different tokens.
	f.setCaller(authed)
	f.get(t, "app.bsky.feed.getTimeline", nil)
	require.Len(t, app.auths, 2)
	require.NotEqual(t, claims(t, app.auths[0])["jti"], claims(t, app.auths[1])["jti"])

	// Unauthenticated: forwarded without any token (and never the client's).
	f.setCaller(Caller{})
	r = f.get(t, "app.bsky.feed.getTimeline", map[string]string{"Authorization": "Bearer client-session-token"})
	require.Equal(t, 200, r.status)
	require.Len(t, app.auths, 3)
	require.Empty(t, app.auths[2])

	// No key for the account: a server fault, and no upstream call.
	f.setCaller(Caller{DID: "did:plc:keyless0000000000000000", Authenticated: true})
	hits := appUp.hits.Load()
	r = f.get(t, "app.bsky.feed.getTimeline", nil)
	require.Equal(t, 500, r.status)
	require.Equal(t, hits, appUp.hits.Load())
}

func TestGetFeedToken(t *testing.T) {
	t.Parallel()
	const feedGenDID = "did:web:feedgen.test"
	const feedURI = "at://did:plc:creator000000000000000/app.bsky.feed.generator/cats"
	k, dir := account(t, callerDID)
	var rec tokenRecorder
	feed := rec.handler(feedGenDID, "app.bsky.feed.getFeedSkeleton", dir)
	var lookups sync.Map
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/xrpc/app.bsky.feed.getFeedGenerator":
			uri := r.URL.Query().Get("feed")
			n, _ := lookups.LoadOrStore(uri, new(int))
			*n.(*int)++
			if uri != feedURI {
				w.WriteHeader(400)
				_, _ = w.Write([]byte(`{"error":"InvalidRequest","message":"could not find feed"}`))
				return
			}
			jsonOK(`{"view":{"uri":"`+feedURI+`","did":"`+feedGenDID+`","displayName":"Cats"},"isOnline":true,"isValid":true}`)(w, r)
		case "/xrpc/app.bsky.feed.getFeed":
			feed(w, r)
		}
	})
	f := newFront(t, Config{AppViewURL: up.URL, AppViewDID: appViewDID, Keys: k}, authed)

	for range 2 {
		r := f.get(t, "app.bsky.feed.getFeed?feed="+feedURI+"&limit=30", nil)
		require.Equal(t, 200, r.status, r.body)
	}
	require.Len(t, rec.auths, 2)
	for i := range rec.auths {
		require.NoError(t, rec.errs[i], "aud = the generator, lxm = getFeedSkeleton")
		c := claims(t, rec.auths[i])
		require.Equal(t, feedGenDID, c["aud"])
		require.Equal(t, "app.bsky.feed.getFeedSkeleton", c["lxm"])
	}
	n, _ := lookups.Load(feedURI)
	require.Equal(t, 1, *n.(*int), "the generator lookup is cached")

	r := f.get(t, "app.bsky.feed.getFeed?feed=at://did:plc:creator000000000000000/app.bsky.feed.generator/dogs", nil)
	require.Equal(t, 400, r.status)
	require.Equal(t, "UnknownFeed", r.err["error"])
	r = f.get(t, "app.bsky.feed.getFeed?feed=not-a-uri", nil)
	require.Equal(t, 400, r.status)
	require.Equal(t, "InvalidRequest", r.err["error"])
	require.Len(t, rec.auths, 2, "failed lookups never reach getFeed")
}

// TestCallerPermits: a caller limited by Permits (an OAuth grant) is asked
// about the method at its target's did#service reference; a refusal is a
// 403 InsufficientScope and nothing reaches the service.
func TestCallerPermits(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, jsonOK(`{}`))
	var asked []string
	c := Caller{Permits: func(lxm, aud string) bool {
		asked = append(asked, lxm+" "+aud)
		return lxm == "app.bsky.feed.getTimeline"
	}}
	f := newFront(t, Config{AppViewURL: up.URL, AppViewDID: appViewDID}, c)
	require.Equal(t, 200, f.get(t, "app.bsky.feed.getTimeline", nil).status)
	r := f.get(t, "app.bsky.feed.getAuthorFeed", nil)
	require.Equal(t, 403, r.status)
	require.Equal(t, "InsufficientScope", r.err["error"])
	require.Contains(t, r.err["message"], "rpc:app.bsky.feed.getAuthorFeed?aud=did:web:appview.test#bsky_appview")
	require.Equal(t, int64(1), up.hits.Load())
	require.Equal(t, []string{
		"app.bsky.feed.getTimeline did:web:appview.test#bsky_appview",
		"app.bsky.feed.getAuthorFeed did:web:appview.test#bsky_appview",
	}, asked)
}

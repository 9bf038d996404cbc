package pds

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"testing"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/internal/fakeservices"
)

// The reads a Bluesky client makes, through Bulwark to a fake app view
// that checks each service token with indigo's validator against the PLC
// directory the account lives in.
func TestProxyAppViewReads(t *testing.T) {
	t.Parallel()
	e := newProxyEnv(t, proxyEnvOptions{})
	u := e.createUser(t)
	av := e.fakes.AppView

	tl := e.call(t, "app.bsky.feed.getTimeline", u.access, "", url.Values{"limit": {"30"}}).ok(t)
	require.Len(t, tl.json(t)["feed"], 2)
	e.requireOneVerified(t, fakeservices.AppViewName, "app.bsky.feed.getTimeline", u.did, av.DID, "app.bsky.feed.getTimeline")

	prof := e.call(t, "app.bsky.actor.getProfile", u.access, av.DID.String()+"#bsky_appview", url.Values{"actor": {u.did.String()}}).ok(t)
	require.Equal(t, "Upstream name", prof.str(t, "displayName"))
	e.requireOneVerified(t, fakeservices.AppViewName, "app.bsky.actor.getProfile", u.did, av.DID, "app.bsky.actor.getProfile")
	require.Equal(t, "application/json; charset=utf-8", prof.header.Get("Content-Type"))

	e.call(t, "app.bsky.notification.listNotifications", u.access, "", nil).ok(t)
	e.requireOneVerified(t, fakeservices.AppViewName, "app.bsky.notification.listNotifications", u.did, av.DID, "app.bsky.notification.listNotifications")

	// getFeed: the token is for the feed generator's getFeedSkeleton, and
	// the app view passes it on to the generator, which checks it too.
	feed := e.call(t, "app.bsky.feed.getFeed", u.access, "", url.Values{"feed": {e.fakes.FeedURI}}).ok(t)
	require.Len(t, feed.json(t)["feed"], 1)
	fg := e.fakes.FeedGen.DID
	e.requireOneVerified(t, fakeservices.AppViewName, "app.bsky.feed.getFeed", u.did, fg, "app.bsky.feed.getFeedSkeleton")
	e.requireOneVerified(t, fakeservices.FeedGenName, "app.bsky.feed.getFeedSkeleton", u.did, fg, "app.bsky.feed.getFeedSkeleton")
	lookups := e.calls("app.bsky.feed.getFeedGenerator")
	require.Len(t, lookups, 1)
	require.Empty(t, lookups[0].Iss, "the generator lookup carries no token")

	// Anonymous: proxied without a token; the app view decides.
	e.call(t, "app.bsky.actor.getProfile", "", "", url.Values{"actor": {u.did.String()}}).ok(t)
	e.call(t, "app.bsky.feed.getTimeline", "", "", nil).fails(t, http.StatusUnauthorized, "AuthenticationRequired")
	for _, c := range e.fakes.Calls() {
		require.True(t, c.Verified || c.Iss == "", "no token was refused: %+v", c)
	}

	// HEAD takes the GET path and sends no body.
	head := e.do(t, http.MethodHead, "app.bsky.actor.getProfile", u.access, nil, url.Values{"actor": {u.did.String()}}, nil)
	require.Equal(t, http.StatusOK, head.status)
	require.Empty(t, head.body)
	require.Equal(t, "application/json; charset=utf-8", head.header.Get("Content-Type"))

	// Preferences are this server's, also when the header names the
	// configured app view: nothing goes upstream.
	prefsBody := func() io.Reader {
		return jsonBody(t, map[string]any{"preferences": []any{map[string]any{"$type": "app.bsky.actor.defs#adultContentPref", "enabled": false}}})
	}
	e.do(t, http.MethodPost, "app.bsky.actor.putPreferences", u.access, prefsBody(), nil, nil).ok(t)
	prefs := e.call(t, "app.bsky.actor.getPreferences", u.access, av.DID.String()+"#bsky_appview", nil).ok(t)
	require.Len(t, prefs.json(t)["preferences"], 1)
	require.Empty(t, e.calls("app.bsky.actor.putPreferences"))
	require.Empty(t, e.calls("app.bsky.actor.getPreferences"))

	// A header naming another service sends them there, POST body and all.
	other := http.Header{"Atproto-Proxy": {e.fakes.Chat.DID.String() + "#bsky_chat"}}
	e.do(t, http.MethodPost, "app.bsky.actor.putPreferences", u.access, prefsBody(), nil, other)
	e.requireOneVerified(t, fakeservices.ChatName, "app.bsky.actor.putPreferences", u.did, e.fakes.Chat.DID, "app.bsky.actor.putPreferences")
}

// Chat is reached only through the atproto-proxy header, whose DID is
// resolved in the PLC directory; its methods need a privileged session.
func TestProxyChat(t *testing.T) {
	t.Parallel()
	e := newProxyEnv(t, proxyEnvOptions{})
	u := e.createUser(t)
	chat := e.fakes.Chat
	header := chat.DID.String() + "#bsky_chat"

	res := e.call(t, "chat.bsky.convo.listConvos", u.access, header, nil).ok(t)
	require.Equal(t, map[string]any{"convos": []any{}}, res.json(t))
	e.requireOneVerified(t, fakeservices.ChatName, "chat.bsky.convo.listConvos", u.did, chat.DID, "chat.bsky.convo.listConvos")

	// A privileged app password may chat too.
	priv := e.appPasswordSession(t, u, true)
	e.call(t, "chat.bsky.convo.listConvos", priv, header, nil).ok(t)
	require.Len(t, e.calls("chat.bsky.convo.listConvos"), 2)
}

// Read-after-write: when the app view answers with an atproto-repo-rev
// older than the account's repository, the posts and profile written
// since are spliced into its answer.
func TestProxyReadAfterWrite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newProxyEnv(t, proxyEnvOptions{})
	u := e.createUser(t)
	e.post(t, "com.atproto.repo.putRecord", u.access, map[string]any{"repo": u.did, "collection": "app.bsky.actor.profile", "rkey": "self",
		"record": map[string]any{"$type": "app.bsky.actor.profile", "displayName": "Old name"}}).ok(t)
	e.post(t, "com.atproto.repo.createRecord", u.access, map[string]any{"repo": u.did, "collection": "app.bsky.feed.post", "record": post("seen upstream")}).ok(t)
	seen, err := e.engine.Rev(ctx, u.did)
	require.NoError(t, err)

	fresh := e.post(t, "com.atproto.repo.createRecord", u.access, map[string]any{"repo": u.did, "collection": "app.bsky.feed.post", "record": post("written just now")}).ok(t)
	e.post(t, "com.atproto.repo.putRecord", u.access, map[string]any{"repo": u.did, "collection": "app.bsky.actor.profile", "rkey": "self",
		"record": map[string]any{"$type": "app.bsky.actor.profile", "displayName": "New name"}}).ok(t)
	e.fakes.SetRepoRev(u.did, seen)

	firstPost := func(r xrpcResult) map[string]any {
		t.Helper()
		feed, _ := r.json(t)["feed"].([]any)
		require.NotEmpty(t, feed)
		return feed[0].(map[string]any)["post"].(map[string]any)
	}
	tl := e.call(t, "app.bsky.feed.getTimeline", u.access, "", nil).ok(t)
	require.NotEmpty(t, tl.header.Get("Atproto-Upstream-Lag"))
	require.Len(t, tl.json(t)["feed"], 3, "the two upstream posts and the new one")
	top := firstPost(tl)
	require.Equal(t, fresh.str(t, "uri"), top["uri"])
	require.Equal(t, "written just now", top["record"].(map[string]any)["text"])
	require.Equal(t, "New name", top["author"].(map[string]any)["displayName"])

	af := e.call(t, "app.bsky.feed.getAuthorFeed", u.access, "", url.Values{"actor": {u.did.String()}}).ok(t)
	require.NotEmpty(t, af.header.Get("Atproto-Upstream-Lag"))
	require.Equal(t, fresh.str(t, "uri"), firstPost(af)["uri"])

	prof := e.call(t, "app.bsky.actor.getProfile", u.access, "", url.Values{"actor": {u.did.String()}}).ok(t)
	require.NotEmpty(t, prof.header.Get("Atproto-Upstream-Lag"))
	require.Equal(t, "New name", prof.str(t, "displayName"))

	// Once the app view has caught up, its answers go out as they are.
	now, err := e.engine.Rev(ctx, u.did)
	require.NoError(t, err)
	e.fakes.SetRepoRev(u.did, now)
	prof = e.call(t, "app.bsky.actor.getProfile", u.access, "", url.Values{"actor": {u.did.String()}}).ok(t)
	require.Empty(t, prof.header.Get("Atproto-Upstream-Lag"))
	require.Equal(t, "Upstream name", prof.str(t, "displayName"))
	require.Equal(t, now, prof.header.Get("Atproto-Repo-Rev"))

	// Another account's profile is never rewritten.
	other := e.createUser(t)
	prof = e.call(t, "app.bsky.actor.getProfile", other.access, "", url.Values{"actor": {u.did.String()}}).ok(t)
	require.Equal(t, "Upstream name", prof.str(t, "displayName"))
	require.Equal(t, syntax.DID(prof.str(t, "did")), u.did)
}

// A handle this server cannot resolve itself is asked of the app view, as
// the reference PDS does; what the app view cannot resolve either is the
// usual HandleNotFound.
func TestResolveHandleFallsBackToAppView(t *testing.T) {
	t.Parallel()
	e := newProxyEnv(t, proxyEnvOptions{})
	res := e.call(t, "com.atproto.identity.resolveHandle", "", "", url.Values{"handle": {fakeservices.ResolvableHandle}}).ok(t)
	require.Equal(t, "did:plc:fakeauthor2345fakeauthor", res.json(t)["did"])
	e.call(t, "com.atproto.identity.resolveHandle", "", "", url.Values{"handle": {"nobody.elsewhere.invalid"}}).fails(t, http.StatusBadRequest, "HandleNotFound")
	require.Len(t, e.calls("com.atproto.identity.resolveHandle"), 2)
}

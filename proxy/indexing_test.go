package proxy

import (
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/stretchr/testify/require"
)

// freshFixture is a rawFixture whose repository's current commit was made
// just now.
func freshFixture(t *testing.T) (*rawFixture, syntax.TID) {
	fx := newRawFixture(t)
	current := syntax.NewTIDFromTime(time.Now(), 0)
	fx.local.rev = current.String()
	return fx, current
}

// The reference app view records a commit's revision while it indexes
// the commit's records: for a moment its atproto-repo-rev is the
// repository's current one and the post just written is not in its
// answers, nor, now and then, one written a moment before. Within
// indexingGrace of the commit, the posts of the last indexingGrace are
// added: getPostThread of the new post is built here (with the app
// view's revision on it), and the author feed and timeline get the post;
// the app view's own views of the caller's profile, and a profile read,
// are left alone.
func TestReadAfterWriteWhileIndexing(t *testing.T) {
	t.Parallel()
	fx, current := freshFixture(t)
	f := fx.front(t, newThreadAppView(t, current.String(), "").upstream)
	asked := time.Now()
	r := f.get(t, "app.bsky.feed.getPostThread?uri="+url.QueryEscape(fx.postURI), nil)
	answered := time.Now()
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.Equal(t, fx.postURI, asMap(asMap(decodeJSON(t, r.body)["thread"])["post"])["uri"])
	require.NotEmpty(t, r.header.Get(UpstreamLagHeader))
	require.Equal(t, current.String(), r.header.Get("Atproto-Repo-Rev"), "the app view's revision goes out with the thread built here")
	// The posts of the last indexingGrace, not only of the current commit:
	// the app view may still lack a post of the commit before it.
	require.Len(t, fx.local.sinceRevs, 1)
	since, err := syntax.ParseTID(fx.local.sinceRevs[0])
	require.NoError(t, err)
	require.False(t, since.Time().Before(asked.Add(-indexingGrace).Truncate(time.Microsecond)), "since %s", since.Time())
	require.False(t, since.Time().After(answered.Add(-indexingGrace)), "since %s", since.Time())

	feed := `{"feed":[` + fx.feedItem("at://"+string(callerDID)+"/app.bsky.feed.post/old", string(callerDID), "Me", time.Hour) + `]}`
	f = fx.front(t, fx.appView(t, current.String(), func(*http.Request) string { return feed }))
	for _, nsid := range []string{"app.bsky.feed.getAuthorFeed?actor=" + string(callerDID), "app.bsky.feed.getTimeline"} {
		r = f.get(t, nsid, nil)
		require.Equal(t, http.StatusOK, r.status, r.body)
		items := decodeJSON(t, r.body)["feed"].([]any)
		require.Len(t, items, 2, nsid)
		require.Equal(t, fx.postURI, itemPost(items[0])["uri"], "%s: the new post first", nsid)
		author := asMap(itemPost(items[1])["author"])
		require.Equal(t, "Me", author["displayName"], "%s: only the commit's posts are added; the app view's profile views stay", nsid)
	}

	// Already there: the answer goes out as it came.
	has := `{"feed":[` + fx.feedItem(fx.postURI, string(callerDID), "Me", time.Second) + `]}`
	f = fx.front(t, fx.appView(t, current.String(), func(*http.Request) string { return has }))
	r = f.get(t, "app.bsky.feed.getTimeline", nil)
	require.Equal(t, has, r.body)
	require.Empty(t, r.header.Get(UpstreamLagHeader))

	profile := `{"did":"` + string(callerDID) + `","handle":"me.test","displayName":"Upstream"}`
	f = fx.front(t, fx.appView(t, current.String(), func(*http.Request) string { return profile }))
	r = f.get(t, "app.bsky.actor.getProfile?actor="+string(callerDID), nil)
	require.Equal(t, profile, r.body, "the profile is the app view's")
}

// An app view that has seen no commit of the caller sends no revision: its
// NotFound for the caller's new post is answered with the post's thread;
// its other answers, like those of any service that sends no revision,
// go out as they came.
func TestReadAfterWriteNoRevision(t *testing.T) {
	t.Parallel()
	fx, _ := freshFixture(t)
	f := fx.front(t, newThreadAppView(t, "", "").upstream)
	r := f.get(t, "app.bsky.feed.getPostThread?uri="+url.QueryEscape(fx.postURI), nil)
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.Equal(t, fx.postURI, asMap(asMap(decodeJSON(t, r.body)["thread"])["post"])["uri"])
	require.Empty(t, r.header.Get("Atproto-Repo-Rev"))

	feed := `{"feed":[]}`
	f = fx.front(t, fx.appView(t, "", func(*http.Request) string { return feed }))
	r = f.get(t, "app.bsky.feed.getAuthorFeed?actor="+string(callerDID), nil)
	require.Equal(t, feed, r.body)
	require.Len(t, fx.local.sinceRevs, 1, "only the thread looked")
}

// Another app view, named by atproto-proxy, gets no read-after-write: its
// NotFound without a revision goes out as it came.
func TestReadAfterWriteNoRevisionOtherAppView(t *testing.T) {
	t.Parallel()
	fx, _ := freshFixture(t)
	other := newThreadAppView(t, "", "")
	res := &stubResolver{services: map[syntax.DID]map[string]string{chatDID: {"bsky_appview": other.URL}}}
	f := newFront(t, Config{AppViewURL: fx.appView(t, "", func(*http.Request) string { return "{}" }).URL, AppViewDID: appViewDID,
		Local: fx.local, Resolver: res, PublicURL: "https://pds.test/"}, authed)
	r := f.get(t, "app.bsky.feed.getPostThread?uri="+url.QueryEscape(fx.postURI), map[string]string{"Atproto-Proxy": string(chatDID) + "#bsky_appview"})
	require.Equal(t, http.StatusBadRequest, r.status, r.body)
	require.Equal(t, "NotFound", r.err["error"])
	require.Len(t, other.requests(), 1)
	require.Zero(t, fx.local.sinceCalls.Load())
}

// An app view at the repository's revision whose commit is older than
// indexingGrace has indexed it: its answers go out as they came.
func TestReadAfterWriteIndexedCommit(t *testing.T) {
	t.Parallel()
	fx := newRawFixture(t)
	fx.local.rev = syntax.NewTIDFromTime(time.Now().Add(-2*indexingGrace), 0).String()
	f := fx.front(t, newThreadAppView(t, fx.local.rev, "").upstream)
	r := f.get(t, "app.bsky.feed.getPostThread?uri="+url.QueryEscape(fx.postURI), nil)
	require.Equal(t, http.StatusBadRequest, r.status, r.body)
	require.Equal(t, "NotFound", r.err["error"])

	feed := `{"feed":[]}`
	f = fx.front(t, fx.appView(t, fx.local.rev, func(*http.Request) string { return feed }))
	r = f.get(t, "app.bsky.feed.getAuthorFeed?actor="+string(callerDID), nil)
	require.Equal(t, feed, r.body)
	require.Empty(t, r.header.Get(UpstreamLagHeader))
	require.Zero(t, fx.local.sinceCalls.Load())
}

// A repository whose first commit here is younger than indexingGrace (a
// new account): the start of the grace is not one of its revisions and
// finds nothing, so the posts of its current commit are asked for.
func TestReadAfterWriteWhileIndexingNewAccount(t *testing.T) {
	t.Parallel()
	fx, current := freshFixture(t)
	fx.local.first = syntax.NewTIDFromTime(time.Now().Add(-indexingGrace/2), 0).String()
	f := fx.front(t, newThreadAppView(t, current.String(), "").upstream)
	r := f.get(t, "app.bsky.feed.getPostThread?uri="+url.QueryEscape(fx.postURI), nil)
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.Equal(t, fx.postURI, asMap(asMap(decodeJSON(t, r.body)["thread"])["post"])["uri"])
	require.Len(t, fx.local.sinceRevs, 2)
	require.Equal(t, syntax.NewTIDFromInteger(current.Integer()-1).String(), fx.local.sinceRevs[1])
}

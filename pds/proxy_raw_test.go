package pds

import (
	"context"
	"net/http"
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/internal/fakeservices"
)

// A new account whose app view has seen only its genesis commit: its
// profile and first posts are news, however few records it had then.
// getPostThread of its own new post, which the app view answers NotFound,
// is built here, quote and reply included; getAuthorFeed of its own feed,
// which the app view answers empty, gets the posts.
func TestProxyReadAfterWriteNewAccount(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newProxyEnv(t, proxyEnvOptions{})
	u := e.createUser(t)
	genesis, err := e.engine.Rev(ctx, u.did)
	require.NoError(t, err)
	e.fakes.SetRepoRev(u.did, genesis)

	e.post(t, "com.atproto.repo.putRecord", u.access, map[string]any{"repo": u.did, "collection": "app.bsky.actor.profile", "rkey": "self",
		"record": map[string]any{"$type": "app.bsky.actor.profile", "displayName": "Brand new"}}).ok(t)
	quoted := "at://" + fakeservices.FakeAuthor + "/app.bsky.feed.post/quoted"
	first := post("my first post")
	first["embed"] = map[string]any{"$type": "app.bsky.embed.record", "record": map[string]any{"uri": quoted, "cid": "bafyreie5737gdxlw5i64vzichcalba3z2v5n6icifvx5xytvske7mr3hpm"}}
	mine := e.post(t, "com.atproto.repo.createRecord", u.access, map[string]any{"repo": u.did, "collection": "app.bsky.feed.post", "record": first}).ok(t)
	ref := map[string]any{"uri": mine.str(t, "uri"), "cid": mine.str(t, "cid")}
	answer := post("and a reply to it")
	answer["reply"] = map[string]any{"root": ref, "parent": ref}
	reply := e.post(t, "com.atproto.repo.createRecord", u.access, map[string]any{"repo": u.did, "collection": "app.bsky.feed.post", "record": answer}).ok(t)

	th := e.call(t, "app.bsky.feed.getPostThread", u.access, "", url.Values{"uri": {mine.str(t, "uri")}})
	require.Equal(t, http.StatusOK, th.status, "not the app view's NotFound: %s", th.body)
	require.NotEmpty(t, th.header.Get("Atproto-Upstream-Lag"))
	thread := th.json(t)["thread"].(map[string]any)
	anchor := thread["post"].(map[string]any)
	require.Equal(t, mine.str(t, "uri"), anchor["uri"])
	require.Equal(t, "Brand new", anchor["author"].(map[string]any)["displayName"])
	quote := anchor["embed"].(map[string]any)["record"].(map[string]any)
	require.Equal(t, "app.bsky.embed.record#viewRecord", quote["$type"], "the quoted post, as the app view has it")
	require.Equal(t, quoted, quote["uri"])
	replies := thread["replies"].([]any)
	require.Len(t, replies, 1)
	require.Equal(t, reply.str(t, "uri"), replies[0].(map[string]any)["post"].(map[string]any)["uri"])
	e.requireOneVerified(t, fakeservices.AppViewName, "app.bsky.feed.getPosts", u.did, e.fakes.AppView.DID, "app.bsky.feed.getPosts")

	// The reply's thread: its parent is the caller's post, which the app
	// view does not know either; the thread is the reply alone.
	th = e.call(t, "app.bsky.feed.getPostThread", u.access, "", url.Values{"uri": {reply.str(t, "uri")}})
	require.Equal(t, http.StatusOK, th.status, th.body)
	require.Equal(t, reply.str(t, "uri"), th.json(t)["thread"].(map[string]any)["post"].(map[string]any)["uri"])

	af := e.call(t, "app.bsky.feed.getAuthorFeed", u.access, "", url.Values{"actor": {u.did.String()}}).ok(t)
	require.NotEmpty(t, af.header.Get("Atproto-Upstream-Lag"))
	feed := af.json(t)["feed"].([]any)
	require.Len(t, feed, 2, "the app view's empty feed gets both posts")
	require.Equal(t, reply.str(t, "uri"), feed[0].(map[string]any)["post"].(map[string]any)["uri"])

	prof := e.call(t, "app.bsky.actor.getProfile", u.access, "", url.Values{"actor": {u.did.String()}}).ok(t)
	require.Equal(t, "Brand new", prof.str(t, "displayName"))

	// Someone else's post the app view does not know stays not found.
	e.call(t, "app.bsky.feed.getPostThread", u.access, "", url.Values{"uri": {"at://" + fakeservices.FakeAuthor + "x/app.bsky.feed.post/nope"}}).
		fails(t, http.StatusBadRequest, "NotFound")
}

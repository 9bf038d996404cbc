package proxy

import (
	"compress/gzip"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/stretchr/testify/require"
)

// threadAppView is an app view that has not seen the caller's new posts:
// getPostThread of one of them is 400 NotFound (gzipped when the proxy
// asks for gzip), of anything else a thread of its own; every request's
// path and query are recorded. With rev "", it sends no revision, as the
// reference app view does for an account it has seen no commit of.
type threadAppView struct {
	*upstream
	mu    sync.Mutex
	asked []string
}

func newThreadAppView(t *testing.T, rev string, known string) *threadAppView {
	av := &threadAppView{}
	av.upstream = newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		av.mu.Lock()
		av.asked = append(av.asked, r.URL.Path+"?"+r.URL.RawQuery)
		av.mu.Unlock()
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		if rev != "" {
			w.Header().Set("Atproto-Repo-Rev", rev)
		}
		uri := r.URL.Query().Get("uri")
		if uri == known {
			_, _ = io.WriteString(w, `{"thread":{"$type":"app.bsky.feed.defs#threadViewPost","post":{"uri":"`+uri+`","record":{"text":"the parent"}},`+
				`"parent":{"$type":"app.bsky.feed.defs#notFoundPost","uri":"at://`+otherDID+`/app.bsky.feed.post/gone","notFound":true}}}`)
			return
		}
		var out io.Writer = w
		if r.Header.Get("Accept-Encoding") == "gzip" {
			w.Header().Set("Content-Encoding", "gzip")
			zw := gzip.NewWriter(w)
			defer zw.Close()
			out = zw
		}
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(out, `{"error":"NotFound","message":"Post not found: `+uri+`"}`)
	})
	return av
}

func (av *threadAppView) requests() []string {
	av.mu.Lock()
	defer av.mu.Unlock()
	return append([]string(nil), av.asked...)
}

// A getPostThread of the caller's own post that the app view answers
// NotFound, with a revision older than the post, is answered from the
// caller's records as the reference PDS answers it: the post, the
// caller's newer replies to it, and its parents as the app view has them.
func TestReadAfterWriteThreadNotFound(t *testing.T) {
	t.Parallel()
	fx := newRawFixture(t)
	parent := "at://" + otherDID + "/app.bsky.feed.post/parent"
	replyURI := "at://" + string(callerDID) + "/app.bsky.feed.post/3lnewreply222"
	ref := func(uri string) string { return `{"uri":"` + uri + `","cid":"` + recordCID + `"}` }
	fx.local.records.Posts[0].Value = json.RawMessage(`{"$type":"app.bsky.feed.post","text":"my reply","createdAt":"2026-01-01T00:00:00Z",` +
		`"reply":{"root":` + ref(parent) + `,"parent":` + ref(parent) + `}}`)
	fx.local.records.Posts = append(fx.local.records.Posts, Record{
		URI: syntax.ATURI(replyURI), CID: recordCID, IndexedAt: fx.now.Add(-30 * time.Second),
		Value: json.RawMessage(`{"$type":"app.bsky.feed.post","text":"and another","createdAt":"2026-01-01T00:00:00Z",` +
			`"reply":{"root":` + ref(parent) + `,"parent":` + ref(fx.postURI) + `}}`),
	})
	av := newThreadAppView(t, fx.oldRev, parent)
	f := fx.front(t, av.upstream)

	for _, tc := range []struct{ uri, encoding string }{
		{fx.postURI, ""},
		{strings.Replace(fx.postURI, string(callerDID), "ME.test", 1), "gzip"},
	} {
		r := f.get(t, "app.bsky.feed.getPostThread?parentHeight=5&uri="+url.QueryEscape(tc.uri), map[string]string{"Accept-Encoding": tc.encoding})
		require.Equal(t, http.StatusOK, r.status, r.body)
		require.NotEmpty(t, r.header.Get(UpstreamLagHeader))
		require.Equal(t, fx.oldRev, r.header.Get("Atproto-Repo-Rev"), "the app view's revision, as on every answer it gave")
		thread := asMap(decodeJSON(t, r.body)["thread"])
		require.Equal(t, threadViewPostType, thread["$type"])
		post := asMap(thread["post"])
		require.Equal(t, fx.postURI, post["uri"])
		require.Equal(t, "my reply", asMap(post["record"])["text"])
		require.Equal(t, "Me <new>", asMap(post["author"])["displayName"])
		replies := thread["replies"].([]any)
		require.Len(t, replies, 1, "the caller's reply to it")
		require.Equal(t, replyURI, asMap(asMap(replies[0])["post"])["uri"])
		up := asMap(thread["parent"])
		require.Equal(t, parent, asMap(up["post"])["uri"], "the parents, from the app view")
		require.Equal(t, "app.bsky.feed.defs#notFoundPost", asMap(up["parent"])["$type"])
	}
	require.Contains(t, av.requests(), "/xrpc/app.bsky.feed.getPostThread?depth=0&parentHeight=5&uri="+url.QueryEscape(parent))

	// Not the caller's post, not a post written since, or an app view
	// that has caught up: its NotFound goes out as it came.
	for _, uri := range []string{"at://" + otherDID + "/app.bsky.feed.post/x", "at://" + string(callerDID) + "/app.bsky.feed.post/older"} {
		r := f.get(t, "app.bsky.feed.getPostThread?uri="+url.QueryEscape(uri), nil)
		require.Equal(t, http.StatusBadRequest, r.status)
		require.Equal(t, `{"error":"NotFound","message":"Post not found: `+uri+`"}`, r.body)
	}
	current := fx.front(t, newThreadAppView(t, fx.newRev, parent).upstream)
	r := current.get(t, "app.bsky.feed.getPostThread?uri="+url.QueryEscape(fx.postURI), nil)
	require.Equal(t, http.StatusBadRequest, r.status)
	require.Equal(t, "NotFound", r.err["error"])
}

// Quoted records, and videos, in the caller's spliced posts are rendered
// as the app view renders them: the quoted records asked of the app view
// in one call per kind, a video's URLs from the configured patterns.
func TestReadAfterWriteEmbeds(t *testing.T) {
	t.Parallel()
	fx := newRawFixture(t)
	quoted := "at://" + otherDID + "/app.bsky.feed.post/quoted"
	gen := "at://" + otherDID + "/app.bsky.feed.generator/feed"
	list := "at://" + otherDID + "/app.bsky.graph.list/list"
	missing := "at://" + otherDID + "/app.bsky.feed.post/missing"
	blob := `{"$type":"blob","ref":{"$link":"` + blobCID + `"},"mimeType":"video/mp4","size":1000}`
	strong := func(uri string) string { return `{"uri":"` + uri + `","cid":"` + recordCID + `"}` }
	embeds := []string{
		`{"$type":"app.bsky.embed.record","record":` + strong(quoted) + `}`,
		`{"$type":"app.bsky.embed.recordWithMedia","record":{"$type":"app.bsky.embed.record","record":` + strong(gen) + `},` +
			`"media":{"$type":"app.bsky.embed.video","video":` + blob + `,"alt":"a clip","aspectRatio":{"width":16,"height":9}}}`,
		`{"$type":"app.bsky.embed.record","record":` + strong(list) + `}`,
		`{"$type":"app.bsky.embed.record","record":` + strong(missing) + `}`,
		`{"$type":"app.bsky.embed.video","video":` + blob + `}`,
		`{"$type":"app.bsky.embed.external","external":{"uri":"https://example.com","title":"t","description":"d"}}`,
	}
	fx.local.records.Posts = nil
	for i, e := range embeds {
		fx.local.records.Posts = append(fx.local.records.Posts, Record{
			URI: syntax.ATURI("at://" + string(callerDID) + "/app.bsky.feed.post/3lpost" + string(rune('a'+i))), CID: recordCID,
			IndexedAt: fx.now.Add(-time.Duration(len(embeds)-i) * time.Second),
			Value:     json.RawMessage(`{"$type":"app.bsky.feed.post","text":"post","createdAt":"2026-01-01T00:00:00Z","embed":` + e + `}`),
		})
	}
	var mu sync.Mutex
	calls := map[string]url.Values{}
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		calls[r.URL.Path] = r.URL.Query()
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Atproto-Repo-Rev", fx.oldRev)
		switch r.URL.Path {
		case "/xrpc/app.bsky.feed.getPosts":
			_, _ = io.WriteString(w, `{"posts":[{"uri":"`+quoted+`","cid":"`+recordCID+`","author":{"did":"`+otherDID+`","handle":"o.test"},`+
				`"record":{"text":"quoted"},"embed":{"$type":"app.bsky.embed.images#view","images":[]},"labels":[],"likeCount":3,"indexedAt":"2025-01-01T00:00:00.000Z"}]}`)
		case "/xrpc/app.bsky.feed.getFeedGenerators":
			_, _ = io.WriteString(w, `{"feeds":[{"uri":"`+gen+`","cid":"`+recordCID+`","did":"did:web:feed.test","displayName":"A feed"}]}`)
		case "/xrpc/app.bsky.graph.getList":
			_, _ = io.WriteString(w, `{"list":{"uri":"`+list+`","cid":"`+recordCID+`","name":"A list","purpose":"app.bsky.graph.defs#curatelist"},"items":[]}`)
		default:
			_, _ = io.WriteString(w, `{"feed":[]}`)
		}
	})
	f := newFront(t, Config{AppViewURL: up.URL, AppViewDID: appViewDID, Local: fx.local, PublicURL: "https://pds.test",
		VideoPlaylistPattern: "https://video.test/watch/%s/%s/playlist.m3u8", VideoThumbnailPattern: "https://video.test/watch/%s/%s/thumbnail.jpg"}, authed)

	r := f.get(t, "app.bsky.feed.getAuthorFeed?actor="+string(callerDID), nil)
	require.Equal(t, http.StatusOK, r.status, r.body)
	feed := decodeJSON(t, r.body)["feed"].([]any)
	require.Len(t, feed, len(embeds))
	embed := func(i int) map[string]any { return asMap(itemPost(feed[len(embeds)-1-i])["embed"]) } // newest first

	quote := embed(0)
	require.Equal(t, "app.bsky.embed.record#view", quote["$type"])
	require.Equal(t, map[string]any{
		"$type": "app.bsky.embed.record#viewRecord", "uri": quoted, "cid": recordCID,
		"author": map[string]any{"did": otherDID, "handle": "o.test"}, "value": map[string]any{"text": "quoted"},
		"labels": []any{}, "embeds": []any{map[string]any{"$type": "app.bsky.embed.images#view", "images": []any{}}},
		"indexedAt": "2025-01-01T00:00:00.000Z",
	}, asMap(quote["record"]))

	withMedia := embed(1)
	require.Equal(t, "app.bsky.embed.recordWithMedia#view", withMedia["$type"])
	generator := asMap(asMap(withMedia["record"])["record"])
	require.Equal(t, "app.bsky.feed.defs#generatorView", generator["$type"])
	require.Equal(t, "A feed", generator["displayName"])
	videoURL := "https://video.test/watch/" + url.QueryEscape(string(callerDID)) + "/" + blobCID
	require.Equal(t, map[string]any{
		"$type": "app.bsky.embed.video#view", "cid": blobCID, "alt": "a clip",
		"playlist": videoURL + "/playlist.m3u8", "thumbnail": videoURL + "/thumbnail.jpg",
		"aspectRatio": map[string]any{"width": json.Number("16"), "height": json.Number("9")},
	}, asMap(withMedia["media"]))

	require.Equal(t, "app.bsky.graph.defs#listView", asMap(embed(2)["record"])["$type"])
	require.Equal(t, map[string]any{"$type": "app.bsky.embed.record#viewNotFound", "uri": missing, "notFound": true}, asMap(embed(3)["record"]))
	require.Equal(t, "app.bsky.embed.video#view", embed(4)["$type"])
	require.Equal(t, "app.bsky.embed.external#view", embed(5)["$type"])

	mu.Lock()
	defer mu.Unlock()
	require.ElementsMatch(t, []string{quoted, missing}, calls["/xrpc/app.bsky.feed.getPosts"]["uris"], "one call for all quoted posts")
	require.Equal(t, []string{gen}, calls["/xrpc/app.bsky.feed.getFeedGenerators"]["feeds"])
	require.Equal(t, list, calls["/xrpc/app.bsky.graph.getList"].Get("list"))
}

// The lookups one answer makes share one HeaderTimeout: an app view that
// stalls on the first holds the answer that long, and the rest are not
// sent at all.
func TestReadAfterWriteLookupsShareADeadline(t *testing.T) {
	t.Parallel()
	fx := newRawFixture(t)
	fx.local.records.Posts = nil
	for i, c := range []string{"app.bsky.feed.post", "app.bsky.graph.list", "app.bsky.graph.list"} {
		uri := "at://" + otherDID + "/" + c + "/r" + string(rune('a'+i))
		fx.local.records.Posts = append(fx.local.records.Posts, Record{
			URI: syntax.ATURI("at://" + string(callerDID) + "/app.bsky.feed.post/3lq" + string(rune('a'+i))), CID: recordCID, IndexedAt: fx.now,
			Value: json.RawMessage(`{"$type":"app.bsky.feed.post","text":"q","createdAt":"2026-01-01T00:00:00Z",` +
				`"embed":{"$type":"app.bsky.embed.record","record":{"uri":"` + uri + `","cid":"` + recordCID + `"}}}`),
		})
	}
	var mu sync.Mutex
	var lookups []string
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Atproto-Repo-Rev", fx.oldRev)
		if r.URL.Path == "/xrpc/app.bsky.feed.getTimeline" {
			_, _ = io.WriteString(w, `{"feed":[]}`)
			return
		}
		mu.Lock()
		lookups = append(lookups, r.URL.Path)
		mu.Unlock()
		<-r.Context().Done() // stalls until the proxy gives up
	})
	f := newFront(t, Config{AppViewURL: up.URL, AppViewDID: appViewDID, Local: fx.local, HeaderTimeout: 200 * time.Millisecond}, authed)
	r := f.get(t, "app.bsky.feed.getTimeline", nil)
	require.Equal(t, http.StatusOK, r.status)
	feed := decodeJSON(t, r.body)["feed"].([]any)
	require.Len(t, feed, 3, "the posts are there, their quotes not found")
	for _, it := range feed {
		require.Equal(t, "app.bsky.embed.record#viewNotFound", asMap(asMap(itemPost(it)["embed"])["record"])["$type"])
	}
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []string{"/xrpc/app.bsky.feed.getPosts"}, lookups, "the list lookups were never sent")
}

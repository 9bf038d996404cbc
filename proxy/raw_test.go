package proxy

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/stretchr/testify/require"
)

const (
	blobCID   = "bafkreibme22gw2h7y2h7tg2fhqotaqjucnbc24deqo72b6mkl2egezxhvy"
	recordCID = "bafyreie5737gdxlw5i64vzichcalba3z2v5n6icifvx5xytvske7mr3hpm"
	otherDID  = "did:plc:other000000000000000000"
)

// fakeLocal is the caller's repository as LocalState sees it.
type fakeLocal struct {
	rev     string
	records *LocalRecords
	// first, when set, is the repository's first revision here: a
	// revision older than it finds nothing, as in the repo engine.
	first string

	mu         sync.Mutex
	sinceRevs  []string
	sinceCalls atomic.Int64
}

func (l *fakeLocal) RepoRev(_ context.Context, did syntax.DID) (string, error) {
	if did != callerDID {
		return "", nil
	}
	return l.rev, nil
}

func (l *fakeLocal) RecordsSince(_ context.Context, did syntax.DID, rev string) (*LocalRecords, error) {
	l.sinceCalls.Add(1)
	l.mu.Lock()
	l.sinceRevs = append(l.sinceRevs, rev)
	l.mu.Unlock()
	if rev < l.first {
		return nil, nil
	}
	return l.records, nil
}

// rawFixture is an app view one rev behind the caller's repository, which
// has since written a post with an image and a new profile.
type rawFixture struct {
	oldRev, newRev string
	local          *fakeLocal
	postURI        string
	now            time.Time
}

func newRawFixture(t *testing.T) *rawFixture {
	t.Helper()
	now := time.Now().UTC()
	fx := &rawFixture{
		oldRev:  syntax.NewTIDFromTime(now.Add(-time.Hour), 0).String(),
		newRev:  syntax.NewTIDFromTime(now.Add(-time.Minute), 0).String(),
		postURI: "at://" + string(callerDID) + "/app.bsky.feed.post/3lnewpost2222",
		now:     now,
	}
	blob := `{"$type":"blob","ref":{"$link":"` + blobCID + `"},"mimeType":"image/jpeg","size":1000}`
	fx.local = &fakeLocal{rev: fx.newRev, records: &LocalRecords{
		Handle: "me.test",
		Profile: &Record{
			URI: syntax.ATURI("at://" + string(callerDID) + "/app.bsky.actor.profile/self"), CID: recordCID,
			IndexedAt: now.Add(-2 * time.Minute),
			Value:     json.RawMessage(`{"$type":"app.bsky.actor.profile","displayName":"Me <new>","description":"fresh","avatar":` + blob + `}`),
		},
		ProfileChanged: true,
		Posts: []Record{{
			URI: syntax.ATURI(fx.postURI), CID: recordCID, IndexedAt: now.Add(-time.Minute),
			Value: json.RawMessage(`{"$type":"app.bsky.feed.post","text":"just posted","createdAt":"2026-01-01T00:00:00Z",` +
				`"embed":{"$type":"app.bsky.embed.images","images":[{"alt":"a cat","image":` + blob + `,"aspectRatio":{"width":4,"height":3}}]}}`),
		}},
	}}
	return fx
}

// appView serves body with the given rev (none for ""), gzipped when the
// proxy asked for gzip.
func (fx *rawFixture) appView(t *testing.T, rev string, body func(r *http.Request) string) *upstream {
	return newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		if rev != "" {
			w.Header().Set("Atproto-Repo-Rev", rev)
		}
		b := []byte(body(r))
		if r.Header.Get("Accept-Encoding") == "gzip" {
			w.Header().Set("Content-Encoding", "gzip")
			zw := gzip.NewWriter(w)
			_, _ = zw.Write(b)
			_ = zw.Close()
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(b)))
		_, _ = w.Write(b)
	})
}

func (fx *rawFixture) front(t *testing.T, up *upstream) *front {
	return newFront(t, Config{AppViewURL: up.URL, AppViewDID: appViewDID, Local: fx.local, PublicURL: "https://pds.test/"}, authed)
}

func (fx *rawFixture) feedItem(uri, authorDID, name string, ago time.Duration) string {
	return `{"post":{"uri":"` + uri + `","cid":"` + recordCID + `","author":{"did":"` + authorDID + `","handle":"x.test","displayName":"` + name + `"},` +
		`"record":{"text":"older"},"likeCount":12345678901234567890,"indexedAt":"` + fx.now.Add(-ago).Format(time.RFC3339Nano) + `"}}`
}

func decodeJSON(t *testing.T, s string) map[string]any {
	t.Helper()
	var m map[string]any
	dec := json.NewDecoder(bytes.NewReader([]byte(s)))
	dec.UseNumber()
	require.NoError(t, dec.Decode(&m), s)
	return m
}

func TestReadAfterWriteTimeline(t *testing.T) {
	t.Parallel()
	fx := newRawFixture(t)
	timeline := `{"cursor":"c1","feed":[` + fx.feedItem("at://"+otherDID+"/app.bsky.feed.post/1", otherDID, "Other", time.Hour) + `]}`
	up := fx.appView(t, fx.oldRev, func(*http.Request) string { return timeline })
	f := fx.front(t, up)

	for _, enc := range []string{"", "gzip, deflate, br"} {
		r := f.get(t, "app.bsky.feed.getTimeline?limit=30", map[string]string{"Accept-Encoding": enc})
		require.Equal(t, 200, r.status, r.body)
		require.Empty(t, r.header.Get("Content-Encoding"), "the munged answer is plain JSON")
		lag, err := strconv.Atoi(r.header.Get(UpstreamLagHeader))
		require.NoError(t, err, "the lag header is set")
		require.GreaterOrEqual(t, lag, int(2*time.Minute/time.Millisecond)-1000, "from the oldest spliced record")
		require.Equal(t, fx.oldRev, r.header.Get("Atproto-Repo-Rev"))

		body := decodeJSON(t, r.body)
		feed := body["feed"].([]any)
		require.Len(t, feed, 2)
		post := itemPost(feed[0])
		require.Equal(t, fx.postURI, post["uri"], "the new post is on top")
		require.Equal(t, recordCID, post["cid"])
		require.Equal(t, json.Number("0"), post["likeCount"])
		require.Equal(t, "just posted", asMap(post["record"])["text"])
		author := asMap(post["author"])
		require.Equal(t, string(callerDID), author["did"])
		require.Equal(t, "me.test", author["handle"])
		require.Equal(t, "Me <new>", author["displayName"])
		require.Equal(t, "https://pds.test/xrpc/com.atproto.sync.getBlob?did="+string(callerDID)+"&cid="+blobCID, author["avatar"], "as the reference PDS forms it")
		embed := asMap(post["embed"])
		require.Equal(t, "app.bsky.embed.images#view", embed["$type"])
		img := asMap(embed["images"].([]any)[0])
		require.Equal(t, "a cat", img["alt"])
		require.NotEmpty(t, img["thumb"])
		require.Equal(t, json.Number("12345678901234567890"), itemPost(feed[1])["likeCount"], "upstream numbers survive")
		require.Equal(t, "c1", body["cursor"])
		require.Contains(t, r.body, "Me <new>", "no HTML escaping")
	}
	fx.local.mu.Lock()
	require.Equal(t, []string{fx.oldRev, fx.oldRev}, fx.local.sinceRevs, "records since the upstream's rev")
	fx.local.mu.Unlock()

	// A later page gets no new posts.
	r := f.get(t, "app.bsky.feed.getTimeline?cursor=c1", nil)
	require.Equal(t, timeline, r.body)
}

func TestReadAfterWriteOnlyWhenBehind(t *testing.T) {
	t.Parallel()
	fx := newRawFixture(t)
	timeline := `{"feed":[` + fx.feedItem("at://"+otherDID+"/app.bsky.feed.post/1", otherDID, "Other", time.Hour) + `]}`
	up := fx.appView(t, fx.newRev, func(*http.Request) string { return timeline })
	f := fx.front(t, up)

	r := f.get(t, "app.bsky.feed.getTimeline", nil)
	require.Equal(t, timeline, r.body, "an app view that is up to date is streamed as is")
	require.Empty(t, r.header.Get(UpstreamLagHeader))
	r = f.get(t, "app.bsky.feed.getTimeline", map[string]string{"Accept-Encoding": "gzip"})
	require.Equal(t, "gzip", r.header.Get("Content-Encoding"), "passed through compressed")
	zr, err := gzip.NewReader(bytes.NewReader([]byte(r.body)))
	require.NoError(t, err)
	plain, err := io.ReadAll(zr)
	require.NoError(t, err)
	require.Equal(t, timeline, string(plain))

	// Unauthenticated, or not a read-after-write method: never looked at.
	stale := fx.appView(t, fx.oldRev, func(*http.Request) string { return timeline })
	f = fx.front(t, stale)
	f.setCaller(Caller{})
	r = f.get(t, "app.bsky.feed.getTimeline", nil)
	require.Equal(t, timeline, r.body)
	f.setCaller(authed)
	r = f.get(t, "app.bsky.feed.getFeed2", nil)
	require.Equal(t, timeline, r.body)
	require.Zero(t, fx.local.sinceCalls.Load())
}

func TestReadAfterWriteAuthorFeed(t *testing.T) {
	t.Parallel()
	fx := newRawFixture(t)
	own := `{"feed":[` + fx.feedItem("at://"+string(callerDID)+"/app.bsky.feed.post/old", string(callerDID), "Me old", time.Hour) + `]}`
	up := fx.appView(t, fx.oldRev, func(*http.Request) string { return own })
	f := fx.front(t, up)

	for _, actor := range []string{string(callerDID), "ME.test"} {
		r := f.get(t, "app.bsky.feed.getAuthorFeed?actor="+actor, nil)
		feed := decodeJSON(t, r.body)["feed"].([]any)
		require.Len(t, feed, 2, actor)
		require.Equal(t, fx.postURI, itemPost(feed[0])["uri"])
		require.Equal(t, "Me <new>", asMap(itemPost(feed[1])["author"])["displayName"], "own older posts get the new profile")
	}
	r := f.get(t, "app.bsky.feed.getAuthorFeed?actor="+string(callerDID)+"&filter=posts_with_video", nil)
	feed := decodeJSON(t, r.body)["feed"].([]any)
	require.Len(t, feed, 1, "the filter applies to local posts")

	r = f.get(t, "app.bsky.feed.getAuthorFeed?actor="+otherDID, nil)
	require.Equal(t, own, r.body, "someone else's feed is left alone")

	r = f.get(t, "app.bsky.feed.getActorLikes?actor="+otherDID, nil)
	feed = decodeJSON(t, r.body)["feed"].([]any)
	require.Len(t, feed, 1, "likes get no new posts")
	require.Equal(t, "Me <new>", asMap(itemPost(feed[0])["author"])["displayName"])
}

func TestReadAfterWriteProfiles(t *testing.T) {
	t.Parallel()
	fx := newRawFixture(t)
	profile := func(did string) string {
		return `{"did":"` + did + `","handle":"x.test","displayName":"Old","description":"old","banner":"https://cdn.test/banner","followersCount":7}`
	}
	up := fx.appView(t, fx.oldRev, func(r *http.Request) string {
		if r.URL.Path == "/xrpc/app.bsky.actor.getProfiles" {
			return `{"profiles":[` + profile(otherDID) + `,` + profile(string(callerDID)) + `]}`
		}
		return profile(r.URL.Query().Get("actor"))
	})
	f := fx.front(t, up)

	r := f.get(t, "app.bsky.actor.getProfile?actor="+string(callerDID), nil)
	p := decodeJSON(t, r.body)
	require.Equal(t, "Me <new>", p["displayName"])
	require.Equal(t, "fresh", p["description"])
	require.NotContains(t, p, "banner", "the local profile has no banner any more")
	require.Contains(t, p["avatar"], blobCID)
	require.Equal(t, json.Number("7"), p["followersCount"])
	require.NotEmpty(t, r.header.Get(UpstreamLagHeader))

	r = f.get(t, "app.bsky.actor.getProfile?actor="+otherDID, nil)
	require.Equal(t, profile(otherDID), r.body)

	r = f.get(t, "app.bsky.actor.getProfiles?actors="+otherDID+"&actors="+string(callerDID), nil)
	profiles := decodeJSON(t, r.body)["profiles"].([]any)
	require.Equal(t, "Old", asMap(profiles[0])["displayName"])
	require.Equal(t, "Me <new>", asMap(profiles[1])["displayName"])
}

func TestReadAfterWriteThread(t *testing.T) {
	t.Parallel()
	fx := newRawFixture(t)
	root := "at://" + otherDID + "/app.bsky.feed.post/root"
	mid := "at://" + otherDID + "/app.bsky.feed.post/mid"
	fx.local.records.Posts[0].Value = json.RawMessage(`{"$type":"app.bsky.feed.post","text":"my reply","createdAt":"2026-01-01T00:00:00Z",` +
		`"reply":{"root":{"uri":"` + root + `","cid":"` + recordCID + `"},"parent":{"uri":"` + mid + `","cid":"` + recordCID + `"}}}`)
	thread := `{"thread":{"$type":"app.bsky.feed.defs#threadViewPost","post":{"uri":"` + root + `","record":{"text":"root"}},` +
		`"replies":[{"$type":"app.bsky.feed.defs#threadViewPost","post":{"uri":"` + mid + `","record":{"text":"mid"}},"replies":[]}]}}`
	up := fx.appView(t, fx.oldRev, func(*http.Request) string { return thread })
	f := fx.front(t, up)

	r := f.get(t, "app.bsky.feed.getPostThread?uri="+root, nil)
	th := asMap(decodeJSON(t, r.body)["thread"])
	midView := asMap(th["replies"].([]any)[0])
	replies := midView["replies"].([]any)
	require.Len(t, replies, 1, "the reply went under its parent")
	reply := asMap(replies[0])
	require.Equal(t, threadViewPostType, reply["$type"])
	require.Equal(t, fx.postURI, asMap(reply["post"])["uri"])
	require.Equal(t, "my reply", asMap(asMap(reply["post"])["record"])["text"])
}

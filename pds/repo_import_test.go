package pds

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/atdata"
	"github.com/bluesky-social/indigo/atproto/identity"
	atrepo "github.com/bluesky-social/indigo/atproto/repo"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/bluesky-social/indigo/events"
	"github.com/bluesky-social/indigo/events/schedulers/sequential"
	"github.com/gorilla/websocket"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/db/dbtest"
	"github.com/bulwark-pds/bulwark/firehose"
	"github.com/bulwark-pds/bulwark/repo/repotest"
)

// carHeader is the header of an importRepo request.
var carHeader = http.Header{"Content-Type": {carContentType}}

// importEnv is a server with blobs, the sequencer and a firehose, and a
// consumer of that firehose that passes on every #sync and #commit.
type importEnv struct {
	*accountEnv
	syncs   chan *comatproto.SyncSubscribeRepos_Sync
	commits chan *comatproto.SyncSubscribeRepos_Commit
	dir     identity.Directory
}

func newImportEnv(t *testing.T) *importEnv {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pool := dbtest.New(t)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	hub := firehose.NewHub(pool, firehose.Config{Logger: logger})
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	wg.Go(func() { _ = hub.Run(ctx) })
	e := &importEnv{
		accountEnv: newAccountEnv(t, envOptions{pool: pool, sequence: true, blobs: true, options: func(o *Options) { o.Firehose = hub }}),
		syncs:      make(chan *comatproto.SyncSubscribeRepos_Sync, 100),
		commits:    make(chan *comatproto.SyncSubscribeRepos_Commit, 100),
	}
	e.dir = &identity.BaseDirectory{PLCURL: e.plcURL, HTTPClient: *http.DefaultClient, SkipHandleVerification: true}
	cb := &events.RepoStreamCallbacks{
		RepoSync:   func(s *comatproto.SyncSubscribeRepos_Sync) error { e.syncs <- s; return nil },
		RepoCommit: func(c *comatproto.SyncSubscribeRepos_Commit) error { e.commits <- c; return nil },
	}
	conn, _, err := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(e.url, "http")+"/xrpc/com.atproto.sync.subscribeRepos", nil)
	require.NoError(t, err)
	wg.Go(func() {
		_ = events.HandleRepoStream(ctx, conn, sequential.NewScheduler("import", cb.EventHandler), logger)
	})
	require.Eventually(t, func() bool { return hub.Live() == 1 }, 10*time.Second, time.Millisecond)
	return e
}

// upload posts data as u's blob.
func (e *importEnv) upload(t *testing.T, u *user, data []byte) atdata.Blob {
	t.Helper()
	res := e.do(t, http.MethodPost, "com.atproto.repo.uploadBlob", u.access, bytes.NewReader(data), nil, http.Header{"Content-Type": {"image/png"}}).ok(t)
	var out uploadBlobOutput
	require.NoError(t, json.Unmarshal(res.body, &out))
	return out.Blob
}

// getRepo is did's repository as sync.getRepo serves it.
func (e *importEnv) getRepo(t *testing.T, did syntax.DID) []byte {
	t.Helper()
	return e.get(t, "com.atproto.sync.getRepo", "", url.Values{"did": {did.String()}}).ok(t).body
}

func (e *importEnv) importRepo(t *testing.T, token string, car []byte) xrpcResult {
	t.Helper()
	return e.do(t, http.MethodPost, "com.atproto.repo.importRepo", token, bytes.NewReader(car), nil, carHeader)
}

// records lists a collection of did's repository, as listRecords answers.
func (e *importEnv) records(t *testing.T, did syntax.DID, collection string) []any {
	t.Helper()
	res := e.get(t, "com.atproto.repo.listRecords", "", url.Values{"repo": {did.String()}, "collection": {collection}, "limit": {"100"}}).ok(t)
	recs, _ := res.json(t)["records"].([]any)
	for _, r := range recs {
		m := r.(map[string]any)
		m["uri"] = strings.Replace(m["uri"].(string), "at://"+did.String(), "at://", 1)
	}
	return recs
}

// missingBlobs lists u's missing blobs' CIDs.
func (e *importEnv) missingBlobs(t *testing.T, u *user) []string {
	t.Helper()
	res := e.get(t, "com.atproto.repo.listMissingBlobs", u.access, nil).ok(t)
	var out listMissingBlobsOutput
	require.NoError(t, json.Unmarshal(res.body, &out))
	cids := []string{}
	for _, b := range out.Blobs {
		require.Equal(t, "at://"+u.did.String()+"/app.bsky.feed.post/withpics", b.RecordURI)
		cids = append(cids, b.Cid)
	}
	return cids
}

// writeAlice gives u two image blobs, a post using them, a few posts and
// a profile, and returns the images' bytes.
func (e *importEnv) writeAlice(t *testing.T, u *user) [][]byte {
	t.Helper()
	images := [][]byte{append([]byte("\x89PNG\r\n\x1a\n"), bytes.Repeat([]byte("a"), 3000)...), append([]byte("\x89PNG\r\n\x1a\n"), bytes.Repeat([]byte("b"), 5000)...)}
	refs := []atdata.Blob{e.upload(t, u, images[0]), e.upload(t, u, images[1])}
	write := func(collection, rkey string, rec map[string]any) {
		e.post(t, "com.atproto.repo.createRecord", u.access, map[string]any{"repo": u.did, "collection": collection, "rkey": rkey, "record": rec}).ok(t)
	}
	write("app.bsky.feed.post", "withpics", postRecord("pictures", refs...))
	for _, rkey := range []string{"3lb2aaaaaaaa2", "3lb2aaaaaaaa3", "3lb2aaaaaaaa4"} {
		write("app.bsky.feed.post", rkey, post("post "+rkey))
	}
	write("app.bsky.actor.profile", "self", map[string]any{"$type": "app.bsky.actor.profile", "displayName": "Alice"})
	return images
}

// TestImportRepoMigration moves one account's repository into another,
// fresh and deactivated, account as a migration does: getRepo from the
// first (its commit re-signed for the second's DID, as the old server of
// that DID would have it), importRepo, then the missing blobs uploaded.
func TestImportRepoMigration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newImportEnv(t)
	alice, bob := e.createUser(t), e.createUser(t)
	images := e.writeAlice(t, alice)
	oldKey, err := atcrypto.GeneratePrivateKeyK256()
	require.NoError(t, err)
	car := repotest.Recommit(t, e.getRepo(t, alice.did), bob.did, oldKey, "3lb2aaaaaaaaa")
	e.post(t, "com.atproto.server.deactivateAccount", bob.access, map[string]any{}).ok(t)

	e.importRepo(t, bob.access, car).ok(t)

	// The #sync carries the new commit, signed with bob's key.
	head, err := e.engine.GetHead(ctx, bob.did)
	require.NoError(t, err)
	s := e.nextSync(t, bob.did, head.Rev)
	_, err = atrepo.VerifySyncMessage(ctx, e.dir, s)
	require.NoError(t, err)

	// The blobs are missing until uploaded; the uploads attach them.
	missing := e.missingBlobs(t, bob)
	require.Len(t, missing, 2)
	for _, img := range images {
		e.upload(t, bob, img)
	}
	require.Empty(t, e.missingBlobs(t, bob))

	e.post(t, "com.atproto.server.activateAccount", bob.access, nil).ok(t)
	for _, col := range []string{"app.bsky.feed.post", "app.bsky.actor.profile"} {
		require.Equal(t, e.records(t, alice.did, col), e.records(t, bob.did, col), col)
	}
	for _, c := range missing {
		got := e.get(t, "com.atproto.sync.getBlob", "", url.Values{"did": {bob.did.String()}, "cid": {c}}).ok(t)
		require.Contains(t, [][]byte{images[0], images[1]}, got.body)
	}

	// The repository verifies with indigo, under bob's key.
	commit, r, err := atrepo.LoadRepoFromCAR(ctx, bytes.NewReader(e.getRepo(t, bob.did)))
	require.NoError(t, err)
	require.Equal(t, bob.did.String(), commit.DID)
	ident, err := e.dir.LookupDID(ctx, bob.did)
	require.NoError(t, err)
	pub, err := ident.PublicKey()
	require.NoError(t, err)
	require.NoError(t, commit.VerifySignature(pub))
	_, _, err = r.GetRecordBytes(ctx, "app.bsky.actor.profile", "self")
	require.NoError(t, err)

	// Writes go on from the imported tree: the #commit inverts against it.
	e.post(t, "com.atproto.repo.createRecord", bob.access, map[string]any{"repo": bob.did, "collection": "app.bsky.feed.post", "record": post("moved in")}).ok(t)
	c := e.nextCommit(t, bob.did)
	require.NoError(t, verifyCommitWithPLC(ctx, e.dir, c))
	require.Equal(t, commit.Rev, *c.Since)
}

// nextSync waits for did's #sync at rev.
func (e *importEnv) nextSync(t *testing.T, did syntax.DID, rev string) *comatproto.SyncSubscribeRepos_Sync {
	t.Helper()
	for {
		select {
		case s := <-e.syncs:
			if s.Did == did.String() && s.Rev == rev {
				return s
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no #sync for %s", did)
		}
	}
}

// nextCommit waits for did's next #commit.
func (e *importEnv) nextCommit(t *testing.T, did syntax.DID) *comatproto.SyncSubscribeRepos_Commit {
	t.Helper()
	for {
		select {
		case c := <-e.commits:
			if c.Repo == did.String() {
				return c
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no #commit for %s", did)
		}
	}
}

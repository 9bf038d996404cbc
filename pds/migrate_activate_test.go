package pds

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/events"
	"github.com/bluesky-social/indigo/events/schedulers/sequential"
	"github.com/gorilla/websocket"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/db/dbtest"
	"github.com/bulwark-pds/bulwark/firehose"
)

// streamEvent is one firehose event of interest, as a consumer saw it.
type streamEvent struct {
	kind   string
	seq    int64
	active bool   // #account
	handle string // #identity
	rev    string // #sync
}

// TestActivationAfterMove: once the DID names the new server,
// activateAccount makes the account active and a firehose consumer sees
// #identity, #account (active) and #sync of the current commit, in that
// order; the repository is then served to anyone.
func TestActivationAfterMove(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	pool := dbtest.New(t)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	hub := firehose.NewHub(pool, firehose.Config{Logger: logger})
	wg.Go(func() { _ = hub.Run(ctx) })
	p := newMigrationPair(t, envOptions{pool: pool, sequence: true, options: func(o *Options) { o.Firehose = hub }})

	u := p.a.createUser(t)
	nu := p.moveIn(t, u)
	p.moveIdentity(t, u, nu)

	got := make(chan streamEvent, 16)
	send := func(e streamEvent) {
		select {
		case got <- e:
		case <-ctx.Done():
		}
	}
	cb := &events.RepoStreamCallbacks{
		RepoIdentity: func(e *comatproto.SyncSubscribeRepos_Identity) error {
			if e.Did == u.did.String() {
				send(streamEvent{kind: "identity", seq: e.Seq, handle: deref(e.Handle)})
			}
			return nil
		},
		RepoAccount: func(e *comatproto.SyncSubscribeRepos_Account) error {
			if e.Did == u.did.String() {
				send(streamEvent{kind: "account", seq: e.Seq, active: e.Active})
			}
			return nil
		},
		RepoSync: func(e *comatproto.SyncSubscribeRepos_Sync) error {
			if e.Did == u.did.String() {
				send(streamEvent{kind: "sync", seq: e.Seq, rev: e.Rev})
			}
			return nil
		},
	}
	wsURL := "ws" + strings.TrimPrefix(p.b.url, "http") + "/xrpc/com.atproto.sync.subscribeRepos"
	conn, _, err := websocket.DefaultDialer.Dial(wsURL, nil)
	require.NoError(t, err)
	wg.Go(func() {
		_ = events.HandleRepoStream(ctx, conn, sequential.NewScheduler("migrate", cb.EventHandler), logger)
	})
	require.Eventually(t, func() bool { return hub.Live() == 1 }, 10*time.Second, time.Millisecond)

	p.b.post(t, "com.atproto.server.activateAccount", nu.access, nil).ok(t)
	st := p.b.get(t, "com.atproto.server.checkAccountStatus", nu.access, nil).ok(t).json(t)
	require.Equal(t, true, st["activated"])

	// The submission's #identity may arrive first, if it was sequenced
	// after the consumer connected; the activation's three follow it.
	var seen []streamEvent
	for len(seen) == 0 || seen[len(seen)-1].kind != "sync" {
		select {
		case e := <-got:
			seen = append(seen, e)
		case <-time.After(20 * time.Second):
			t.Fatalf("no #sync on the firehose; saw %+v", seen)
		}
	}
	require.GreaterOrEqual(t, len(seen), 3)
	tail := seen[len(seen)-3:]
	require.Equal(t, []string{"identity", "account", "sync"}, []string{tail[0].kind, tail[1].kind, tail[2].kind}, "%+v", seen)
	require.Equal(t, nu.handle, tail[0].handle)
	require.True(t, tail[1].active)
	require.Equal(t, st["repoRev"], tail[2].rev, "#sync of the current commit")
	require.Less(t, tail[0].seq, tail[1].seq)
	require.Less(t, tail[1].seq, tail[2].seq)
	for _, e := range seen[:len(seen)-3] {
		require.Equal(t, "identity", e.kind, "only the submission's #identity comes before")
	}

	p.b.get(t, "com.atproto.sync.getLatestCommit", "", url.Values{"did": {u.did.String()}}).ok(t)
	p.b.post(t, "com.atproto.repo.createRecord", nu.access, map[string]any{"repo": u.did, "collection": "app.bsky.feed.post", "record": post("moved")}).ok(t)
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// TestDeactivatedRepoServedToOwner: after a move away the old server's
// deactivated account still serves its repository and blobs to itself and
// to the administrator; everyone else gets RepoDeactivated.
func TestDeactivatedRepoServedToOwner(t *testing.T) {
	t.Parallel()
	e := newAccountEnv(t, envOptions{blobs: true})
	u, other := e.createUser(t), e.createUser(t)
	up := e.do(t, http.MethodPost, "com.atproto.repo.uploadBlob", u.access, bytes.NewReader(pngData(t, 2000)), nil,
		http.Header{"Content-Type": {"image/png"}}).ok(t).json(t)
	ref := up["blob"].(map[string]any)
	cid := ref["ref"].(map[string]any)["$link"].(string)
	e.post(t, "com.atproto.repo.createRecord", u.access, map[string]any{"repo": u.did, "collection": "app.bsky.actor.profile", "rkey": "self",
		"record": map[string]any{"$type": "app.bsky.actor.profile", "avatar": ref}}).ok(t)
	st := e.get(t, "com.atproto.server.checkAccountStatus", u.access, nil).ok(t).json(t)
	require.Equal(t, map[string]any{
		"activated": true, "validDid": true, "repoCommit": st["repoCommit"], "repoRev": st["repoRev"],
		"repoBlocks": 3.0, "indexedRecords": 1.0, "privateStateValues": 0.0, "expectedBlobs": 1.0, "importedBlobs": 1.0,
	}, st, "blocks: the commit, one MST node, one record")
	e.post(t, "com.atproto.server.deactivateAccount", u.access, map[string]any{}).ok(t)

	did := u.did.String()
	reads := []struct {
		nsid string
		q    url.Values
	}{
		{"com.atproto.sync.getRepo", url.Values{"did": {did}}},
		{"com.atproto.sync.getLatestCommit", url.Values{"did": {did}}},
		{"com.atproto.sync.listBlobs", url.Values{"did": {did}}},
		{"com.atproto.sync.getBlob", url.Values{"did": {did}, "cid": {cid}}},
		{"com.atproto.sync.getRecord", url.Values{"did": {did}, "collection": {"app.bsky.actor.profile"}, "rkey": {"self"}}},
	}
	admin := http.Header{"Authorization": {"Basic " + basic("admin", testAdminPassword)}}
	for _, rd := range reads {
		e.get(t, rd.nsid, "", rd.q).fails(t, 400, "RepoDeactivated")
		e.get(t, rd.nsid, other.access, rd.q).fails(t, 400, "RepoDeactivated")
		e.get(t, rd.nsid, "garbage", rd.q).fails(t, 400, "RepoDeactivated")
		e.get(t, rd.nsid, u.access, rd.q).ok(t)
		e.do(t, http.MethodGet, rd.nsid, "", nil, rd.q, admin).ok(t)
	}
	blobs := e.get(t, "com.atproto.sync.listBlobs", u.access, url.Values{"did": {did}}).ok(t).json(t)
	require.Equal(t, []any{cid}, blobs["cids"])

	// A takedown ends the sessions; only the administrator still reads.
	e.adminProc(t, "updateSubjectStatus", map[string]any{
		"subject":  map[string]any{"$type": "com.atproto.admin.defs#repoRef", "did": did},
		"takedown": map[string]any{"applied": true, "ref": "test"},
	}).ok(t)
	for _, rd := range reads {
		e.get(t, rd.nsid, "", rd.q).fails(t, 400, "RepoTakendown")
		e.do(t, http.MethodGet, rd.nsid, "", nil, rd.q, admin).ok(t)
	}
}

package relaytest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/bluesky-social/indigo/cmd/relay/stream"
	"github.com/bluesky-social/indigo/cmd/relay/stream/schedulers/sequential"
	relaytesting "github.com/bluesky-social/indigo/cmd/relay/testing"
	"github.com/gorilla/websocket"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/db/dbtest"
	"github.com/bulwark-pds/bulwark/eventlog"
	"github.com/bulwark-pds/bulwark/firehose"
	"github.com/bulwark-pds/bulwark/repo"
	"github.com/bulwark-pds/bulwark/repo/repotest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// TestRelayIngestsEveryCommit runs indigo's relay in strict mode against a
// Bulwark firehose while several accounts are created, write at once,
// change handle, deactivate and reactivate, and one is deleted: the relay
// must re-emit every commit. Identities come from a mock directory (the
// relay's own test harness does the same), whose #atproto_pds endpoint is
// the address the relay dials.
func TestRelayIngestsEveryCommit(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pool := dbtest.New(t)

	ks := repotest.NewKeys()
	seq := eventlog.NewSequencer(pool, eventlog.SequencerConfig{Logger: quiet})
	hub := firehose.NewHub(pool, firehose.Config{Logger: quiet})
	seq.OnSequenced(hub.Notify)
	engine := repo.New(pool, ks, seq, repo.Config{Logger: quiet})
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() { _ = seq.Run(ctx) })
	wg.Go(func() { _ = hub.Run(ctx) })

	up := firehose.Upgrader()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /xrpc/com.atproto.sync.subscribeRepos", func(w http.ResponseWriter, r *http.Request) {
		var cursor *int64
		if v := r.URL.Query().Get("cursor"); v != "" {
			c, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				http.Error(w, "bad cursor", http.StatusBadRequest)
				return
			}
			cursor = &c
		}
		conn, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		_ = hub.Serve(r.Context(), conn, cursor, firehose.Client{IP: r.RemoteAddr, UserAgent: r.UserAgent()})
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	defer hub.Close()
	host := fmt.Sprintf("localhost:%d", ln.Addr().(*net.TCPAddr).Port)

	dir := identity.NewMockDirectory()
	relay := relaytesting.MustSimpleRelay(dir, t.TempDir(), false)
	require.NoError(t, relay.Relay.SubscribeToHost(ctx, host, true, true))
	require.Eventually(t, func() bool { return hub.Live() == 1 }, 30*time.Second, 5*time.Millisecond)

	// The relay's own output, read with its stream package. (The harness's
	// Consumer reads its event list without its lock: racy under -race.)
	var mu sync.Mutex
	var relayed []*stream.XRPCStreamEvent
	keep := func(ev *stream.XRPCStreamEvent) error {
		mu.Lock()
		defer mu.Unlock()
		relayed = append(relayed, ev)
		return nil
	}
	cb := &stream.RepoStreamCallbacks{
		RepoCommit: func(e *comatproto.SyncSubscribeRepos_Commit) error {
			return keep(&stream.XRPCStreamEvent{RepoCommit: e})
		},
		RepoSync: func(e *comatproto.SyncSubscribeRepos_Sync) error { return keep(&stream.XRPCStreamEvent{RepoSync: e}) },
		RepoIdentity: func(e *comatproto.SyncSubscribeRepos_Identity) error {
			return keep(&stream.XRPCStreamEvent{RepoIdentity: e})
		},
		RepoAccount: func(e *comatproto.SyncSubscribeRepos_Account) error {
			return keep(&stream.XRPCStreamEvent{RepoAccount: e})
		},
	}
	rconn, _, err := websocket.DefaultDialer.Dial(fmt.Sprintf("ws://localhost:%d/xrpc/com.atproto.sync.subscribeRepos", relay.Port), nil)
	require.NoError(t, err)
	wg.Go(func() {
		_ = stream.HandleRepoStream(ctx, rconn, sequential.NewScheduler("relaytest", cb.EventHandler), quiet)
	})

	const accounts, perAccount = 3, 10
	now := func() string { return syntax.DatetimeNow().String() }
	var dids []syntax.DID
	for i := range accounts {
		did := syntax.DID(fmt.Sprintf("did:plc:relaytest%015d", i))
		key := ks.Add(t, did)
		handle := syntax.Handle(fmt.Sprintf("user%d.test", i))
		pub, err := key.PublicKey()
		require.NoError(t, err)
		dir.Insert(identity.Identity{
			DID: did, Handle: handle, AlsoKnownAs: []string{"at://" + handle.String()},
			Keys:     map[string]identity.VerificationMethod{"atproto": {Type: "Multikey", PublicKeyMultibase: pub.Multibase()}},
			Services: map[string]identity.ServiceEndpoint{"atproto_pds": {Type: "AtprotoPersonalDataServer", URL: "http://" + host}},
		})
		// Account creation: #identity, #account, #sync, as createAccount emits them.
		require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := engine.InitRepo(ctx, tx, did, key); err != nil {
				return err
			}
			for _, ev := range []func() (*eventlog.Encoded, error){
				func() (*eventlog.Encoded, error) {
					h := handle.String()
					return eventlog.EncodeIdentity(&comatproto.SyncSubscribeRepos_Identity{Did: did.String(), Handle: &h, Time: now()})
				},
				func() (*eventlog.Encoded, error) {
					return eventlog.EncodeAccount(&comatproto.SyncSubscribeRepos_Account{Did: did.String(), Active: true, Time: now()})
				},
				func() (*eventlog.Encoded, error) { return engine.SyncEvent(ctx, tx, did) },
			} {
				enc, err := ev()
				if err != nil {
					return err
				}
				if err := eventlog.Append(ctx, tx, enc); err != nil {
					return err
				}
			}
			return nil
		}))
		seq.Wake()
		dids = append(dids, did)
	}

	var writers sync.WaitGroup
	revs := make(chan string, accounts*perAccount)
	for _, did := range dids {
		writers.Go(func() {
			for i := range perAccount {
				res, err := engine.Apply(ctx, did, []repo.Write{{
					Action: repo.ActionCreate, Collection: "app.bsky.feed.post",
					Record: map[string]any{"$type": "app.bsky.feed.post", "text": fmt.Sprint("post ", i), "createdAt": "2026-11-29T00:00:00Z"},
				}}, nil)
				if err != nil {
					t.Error(err)
					return
				}
				revs <- did.String() + " " + res.Rev
			}
		})
	}
	writers.Wait()
	close(revs)

	// Lifecycle: handle change, deactivate and reactivate, delete.
	appendEv := func(enc *eventlog.Encoded, err error) {
		require.NoError(t, err)
		require.NoError(t, eventlog.Append(ctx, pool, enc))
		seq.Wake()
	}
	newHandle := "renamed0.test"
	appendEv(eventlog.EncodeIdentity(&comatproto.SyncSubscribeRepos_Identity{Did: dids[0].String(), Handle: &newHandle, Time: now()}))
	deactivated, deleted := "deactivated", "deleted"
	appendEv(eventlog.EncodeAccount(&comatproto.SyncSubscribeRepos_Account{Did: dids[1].String(), Active: false, Status: &deactivated, Time: now()}))
	appendEv(eventlog.EncodeAccount(&comatproto.SyncSubscribeRepos_Account{Did: dids[1].String(), Active: true, Time: now()}))
	// A commit after reactivation must get through too.
	res, err := engine.Apply(ctx, dids[1], []repo.Write{{
		Action: repo.ActionCreate, Collection: "app.bsky.feed.post",
		Record: map[string]any{"$type": "app.bsky.feed.post", "text": "back", "createdAt": "2026-11-29T00:00:00Z"},
	}}, nil)
	require.NoError(t, err)
	appendEv(eventlog.EncodeAccount(&comatproto.SyncSubscribeRepos_Account{Did: dids[2].String(), Active: false, Status: &deleted, Time: now()}))

	want := map[string]bool{dids[1].String() + " " + res.Rev: true}
	for r := range revs {
		want[r] = true
	}
	seen := map[string]bool{}
	var accountsSeen, identitiesSeen, syncsSeen int
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		evs := relayed
		clear(seen)
		accountsSeen, identitiesSeen, syncsSeen = 0, 0, 0
		for _, ev := range evs {
			switch {
			case ev.RepoCommit != nil:
				seen[ev.RepoCommit.Repo+" "+ev.RepoCommit.Rev] = true
			case ev.RepoAccount != nil:
				accountsSeen++
			case ev.RepoIdentity != nil:
				identitiesSeen++
			case ev.RepoSync != nil:
				syncsSeen++
			}
		}
		// The relay processes different repos' events in parallel, so the
		// rename's #identity may come out after later #account events.
		return len(seen) == len(want) && accountsSeen >= accounts+3 && identitiesSeen >= accounts+1
	}, 60*time.Second, 20*time.Millisecond, "relay re-emitted %d of %d commits", len(seen), len(want))
	require.Equal(t, want, seen)
	require.Equal(t, accounts, syncsSeen)
	require.GreaterOrEqual(t, identitiesSeen, accounts+1)
}

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
	"github.com/jackc/pgx/v5/pgxpool"
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
	e := startRelayEnv(t, ctx)
	defer e.wg.Wait()
	defer cancel()
	out, release := e.subscribeRelay(t, ctx)
	defer release()

	const accounts, perAccount = 3, 10
	dids := make([]syntax.DID, accounts)
	for i := range dids {
		dids[i] = e.createAccount(t, ctx, i)
	}
	want := e.writeAll(t, ctx, dids, perAccount)

	// Lifecycle: handle change, deactivate and reactivate, delete.
	must := func(enc *eventlog.Encoded, err error) *eventlog.Encoded {
		require.NoError(t, err)
		return enc
	}
	newHandle := "renamed0.test"
	e.appendEvent(t, ctx, must(eventlog.EncodeIdentity(&comatproto.SyncSubscribeRepos_Identity{Did: dids[0].String(), Handle: &newHandle, Time: now()})))
	deactivated, deleted := "deactivated", "deleted"
	e.appendEvent(t, ctx, must(eventlog.EncodeAccount(&comatproto.SyncSubscribeRepos_Account{Did: dids[1].String(), Active: false, Status: &deactivated, Time: now()})))
	e.appendEvent(t, ctx, must(eventlog.EncodeAccount(&comatproto.SyncSubscribeRepos_Account{Did: dids[1].String(), Active: true, Time: now()})))
	// A commit after reactivation must get through too.
	res, err := e.engine.Apply(ctx, dids[1], []repo.Write{postWrite("back")}, nil)
	require.NoError(t, err)
	want[dids[1].String()+" "+res.Rev] = true
	e.appendEvent(t, ctx, must(eventlog.EncodeAccount(&comatproto.SyncSubscribeRepos_Account{Did: dids[2].String(), Active: false, Status: &deleted, Time: now()})))

	var got relayedCounts
	require.Eventually(t, func() bool {
		got = out.count()
		// The relay processes different repos' events in parallel, so the
		// rename's #identity may come out after later #account events.
		return len(got.commits) == len(want) && got.accounts >= accounts+3 && got.identities >= accounts+1
	}, 60*time.Second, 20*time.Millisecond, "relay re-emitted %d of %d commits", len(got.commits), len(want))
	require.Equal(t, want, got.commits)
	require.Equal(t, accounts, got.syncs)
	require.GreaterOrEqual(t, got.identities, accounts+1)
}

func now() string { return syntax.DatetimeNow().String() }

func postWrite(text string) repo.Write {
	return repo.Write{
		Action: repo.ActionCreate, Collection: "app.bsky.feed.post",
		Record: map[string]any{"$type": "app.bsky.feed.post", "text": text, "createdAt": "2026-11-29T00:00:00Z"},
	}
}

// relayEnv is a Bulwark firehose (sequencer, hub, repo engine, served on
// host) for indigo's relay to subscribe to.
type relayEnv struct {
	pool   *pgxpool.Pool
	keys   *repotest.Keys
	seq    *eventlog.Sequencer
	hub    *firehose.Hub
	engine *repo.Engine
	host   string // localhost:PORT
	dir    *identity.MockDirectory
	wg     *sync.WaitGroup
}

// startRelayEnv starts the firehose until ctx ends (the caller waits for
// e.wg after cancelling it).
func startRelayEnv(t *testing.T, ctx context.Context) *relayEnv {
	t.Helper()
	pool := dbtest.New(t)
	e := &relayEnv{pool: pool, keys: repotest.NewKeys(), dir: identity.NewMockDirectory(), wg: &sync.WaitGroup{}}
	e.seq = eventlog.NewSequencer(pool, eventlog.SequencerConfig{Logger: quiet})
	e.hub = firehose.NewHub(pool, firehose.Config{Logger: quiet})
	e.seq.OnSequenced(e.hub.Notify)
	e.engine = repo.New(pool, e.keys, e.seq, repo.Config{Logger: quiet})
	e.wg.Go(func() { _ = e.seq.Run(ctx) })
	e.wg.Go(func() { _ = e.hub.Run(ctx) })

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
		_ = e.hub.Serve(r.Context(), conn, cursor, firehose.Client{IP: r.RemoteAddr, UserAgent: r.UserAgent()})
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { e.hub.Close(); _ = srv.Close() })
	e.host = fmt.Sprintf("localhost:%d", ln.Addr().(*net.TCPAddr).Port)
	return e
}

// relayedEvents is what the relay re-emitted, read with its stream package.
// (The harness's Consumer reads its event list without its lock: racy
// under -race.)
type relayedEvents struct {
	mu  sync.Mutex
	evs []*stream.XRPCStreamEvent
}

func (o *relayedEvents) keep(ev *stream.XRPCStreamEvent) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.evs = append(o.evs, ev)
	return nil
}

// relayedCounts summarises the relay's output: the commits ("did rev")
// and how many events of each other kind.
type relayedCounts struct {
	commits                     map[string]bool
	accounts, identities, syncs int
}

func (o *relayedEvents) count() relayedCounts {
	o.mu.Lock()
	defer o.mu.Unlock()
	c := relayedCounts{commits: map[string]bool{}}
	for _, ev := range o.evs {
		switch {
		case ev.RepoCommit != nil:
			c.commits[ev.RepoCommit.Repo+" "+ev.RepoCommit.Rev] = true
		case ev.RepoAccount != nil:
			c.accounts++
		case ev.RepoIdentity != nil:
			c.identities++
		case ev.RepoSync != nil:
			c.syncs++
		}
	}
	return c
}

// subscribeRelay starts indigo's relay in strict mode, subscribed to the
// firehose, and reads its output until ctx ends. release ends the relay's
// subscription: call it before the firehose stops, else the relay redials
// and, under -race, its cursor flusher reports indigo's own data race
// (a redial replaces sub.scheduler unguarded, relay/slurper.go:468 vs
// 102).
func (e *relayEnv) subscribeRelay(t *testing.T, ctx context.Context) (out *relayedEvents, release func()) {
	t.Helper()
	relay := relaytesting.MustSimpleRelay(e.dir, t.TempDir(), false)
	require.NoError(t, relay.Relay.SubscribeToHost(ctx, e.host, true, true))
	release = func() { _ = relay.Relay.Slurper.KillUpstreamConnection(context.Background(), e.host, false) }
	require.Eventually(t, func() bool { return e.hub.Live() == 1 }, 30*time.Second, 5*time.Millisecond)

	out = &relayedEvents{}
	cb := &stream.RepoStreamCallbacks{
		RepoCommit: func(ev *comatproto.SyncSubscribeRepos_Commit) error {
			return out.keep(&stream.XRPCStreamEvent{RepoCommit: ev})
		},
		RepoSync: func(ev *comatproto.SyncSubscribeRepos_Sync) error {
			return out.keep(&stream.XRPCStreamEvent{RepoSync: ev})
		},
		RepoIdentity: func(ev *comatproto.SyncSubscribeRepos_Identity) error {
			return out.keep(&stream.XRPCStreamEvent{RepoIdentity: ev})
		},
		RepoAccount: func(ev *comatproto.SyncSubscribeRepos_Account) error {
			return out.keep(&stream.XRPCStreamEvent{RepoAccount: ev})
		},
	}
	rconn, _, err := websocket.DefaultDialer.Dial(fmt.Sprintf("ws://localhost:%d/xrpc/com.atproto.sync.subscribeRepos", relay.Port), nil)
	require.NoError(t, err)
	e.wg.Go(func() {
		_ = stream.HandleRepoStream(ctx, rconn, sequential.NewScheduler("relaytest", cb.EventHandler), quiet)
	})
	return out, release
}

// createAccount creates account i as createAccount does (#identity,
// #account, #sync), published in the mock directory with the firehose's
// host as its PDS.
func (e *relayEnv) createAccount(t *testing.T, ctx context.Context, i int) syntax.DID {
	t.Helper()
	did := syntax.DID(fmt.Sprintf("did:plc:relaytest%015d", i))
	key := e.keys.Add(t, did)
	handle := syntax.Handle(fmt.Sprintf("user%d.test", i))
	pub, err := key.PublicKey()
	require.NoError(t, err)
	e.dir.Insert(identity.Identity{
		DID: did, Handle: handle, AlsoKnownAs: []string{"at://" + handle.String()},
		Keys:     map[string]identity.VerificationMethod{"atproto": {Type: "Multikey", PublicKeyMultibase: pub.Multibase()}},
		Services: map[string]identity.ServiceEndpoint{"atproto_pds": {Type: "AtprotoPersonalDataServer", URL: "http://" + e.host}},
	})
	require.NoError(t, pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		if _, err := e.engine.InitRepo(ctx, tx, did, key); err != nil {
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
			func() (*eventlog.Encoded, error) { return e.engine.SyncEvent(ctx, tx, did) },
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
	e.seq.Wake()
	return did
}

// writeAll has every account write perAccount posts at once and returns
// the commits made ("did rev").
func (e *relayEnv) writeAll(t *testing.T, ctx context.Context, dids []syntax.DID, perAccount int) map[string]bool {
	t.Helper()
	var writers sync.WaitGroup
	revs := make(chan string, len(dids)*perAccount)
	for _, did := range dids {
		writers.Go(func() {
			for i := range perAccount {
				res, err := e.engine.Apply(ctx, did, []repo.Write{postWrite(fmt.Sprint("post ", i))}, nil)
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
	want := map[string]bool{}
	for r := range revs {
		want[r] = true
	}
	return want
}

// appendEvent stores an account event and wakes the sequencer.
func (e *relayEnv) appendEvent(t *testing.T, ctx context.Context, enc *eventlog.Encoded) {
	t.Helper()
	require.NoError(t, eventlog.Append(ctx, e.pool, enc))
	e.seq.Wake()
}

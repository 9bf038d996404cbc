package relaytest

import (
	"bytes"
	"context"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/identity"
	atrepo "github.com/bluesky-social/indigo/atproto/repo"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/bluesky-social/indigo/cmd/relay/stream"
	"github.com/bluesky-social/indigo/cmd/relay/stream/schedulers/sequential"
	relaytesting "github.com/bluesky-social/indigo/cmd/relay/testing"
	"github.com/gorilla/websocket"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/db/dbtest"
	"github.com/bulwark-pds/bulwark/eventlog"
	"github.com/bulwark-pds/bulwark/eventlog/eventlogtest"
	"github.com/bulwark-pds/bulwark/firehose"
	"github.com/bulwark-pds/bulwark/internal/syncbuf"
	"github.com/bulwark-pds/bulwark/pds"
	"github.com/bulwark-pds/bulwark/repo"
	"github.com/bulwark-pds/bulwark/repo/repotest"
)

// relayReadLimit is what indigo's relay allows one frame (5,000,000 bytes):
// above it the read fails and the relay drops the connection.
const relayReadLimit = stream.MaxMessageBytes

// repairEnv is a Bulwark (pds server, firehose, admin API) with one account
// whose latest #commit was stored oversized, as a bug or an import could.
type repairEnv struct {
	pool   *pgxpool.Pool
	hub    *firehose.Hub
	engine *repo.Engine
	seq    *eventlog.Sequencer
	keys   *repotest.Keys
	// stopSeq stops the running sequencer and waits for it; startSeq runs
	// it again. Events committed in between stay unsequenced: no consumer
	// sees them until startSeq.
	stopSeq  func()
	startSeq func()
	host     string // localhost:PORT
	url      string
	password string
	did      syntax.DID
	dir      *identity.MockDirectory
	badSeq   int64
	badRev   string
}

func newRepairEnv(t *testing.T, ctx context.Context, disableFallback bool) *repairEnv {
	t.Helper()
	e := startRepairEnv(t, ctx, disableFallback)
	e.createAccount(t)
	var last *repo.CommitResult
	for i := range 3 {
		last = e.post(t, ctx, fmt.Sprint("post ", i))
	}
	e.badRev = last.Rev
	require.Eventually(t, func() bool {
		l, err := eventlog.NewLog(e.pool).LastSeq(ctx)
		return err == nil && l >= 4
	}, 30*time.Second, 5*time.Millisecond)
	e.badSeq = e.seqOf(t, ctx, e.badRev)
	return e
}

// startRepairEnv starts the server with no account yet.
func startRepairEnv(t *testing.T, ctx context.Context, disableFallback bool) *repairEnv {
	t.Helper()
	return startRepairEnvWith(t, ctx, repairOptions{disableFallback: disableFallback})
}

// repairOptions tune startRepairEnvWith.
type repairOptions struct {
	// disableFallback serves events over the relay limits as stored.
	disableFallback bool
	// admission is the subscribeRepos admission (default: loopback
	// allowed, as a known relay would be).
	admission *firehose.AdmissionConfig
	// logger receives the server's and the firehose's logs (default:
	// none).
	logger *slog.Logger
}

// startRepairEnvWith starts the server with no account yet.
func startRepairEnvWith(t *testing.T, ctx context.Context, o repairOptions) *repairEnv {
	t.Helper()
	if o.logger == nil {
		o.logger = quiet
	}
	if o.admission == nil {
		// The test's consumers all come from loopback and redial at once.
		o.admission = &firehose.AdmissionConfig{Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}, MaxPerClient: 64}
	}
	pool := dbtest.New(t)
	ks := repotest.NewKeys()
	seq := eventlog.NewSequencer(pool, eventlog.SequencerConfig{Logger: quiet})
	evlog := eventlog.NewLog(pool)
	health := firehose.NewHealth(firehose.HealthConfig{
		Logger: o.logger,
		Inspect: func(ctx context.Context, seq int64) (*eventlog.EventInfo, error) {
			evs, err := evlog.Inspect(ctx, eventlog.EventFilter{FromSeq: seq, Limit: 1})
			if err != nil || len(evs) == 0 {
				return nil, err
			}
			return &evs[0], nil
		},
	})
	hub := firehose.NewHub(pool, firehose.Config{Logger: o.logger, Health: health, DisableOversizeSync: o.disableFallback})
	seq.OnSequenced(hub.Notify)
	engine := repo.New(pool, ks, seq, repo.Config{Logger: quiet})
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)
	runCtx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	wg.Go(func() { _ = hub.Run(runCtx) })

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	cfg := config.DefaultConfig()
	cfg.DataDir = t.TempDir()
	cfg.Hostname = fmt.Sprintf("localhost:%d", port)
	cfg.AdminPassword = "repair-test-admin"
	require.NoError(t, cfg.Finalize())
	srv, err := pds.New(pds.Options{Config: cfg, DB: pool, Logger: o.logger, Firehose: hub, FirehoseAdmission: o.admission})
	require.NoError(t, err)
	hs := &http.Server{Handler: srv.Handler()}
	go func() { _ = hs.Serve(ln) }()
	t.Cleanup(func() { hub.Close(); _ = hs.Close() })

	e := &repairEnv{pool: pool, hub: hub, engine: engine, seq: seq, keys: ks, host: cfg.Hostname, url: "http://" + cfg.Hostname, password: cfg.AdminPassword, dir: identity.NewMockDirectory()}
	var seqCancel context.CancelFunc
	var seqDone chan struct{}
	e.startSeq = func() {
		var seqCtx context.Context
		seqCtx, seqCancel = context.WithCancel(runCtx)
		seqDone = make(chan struct{})
		go func() { defer close(seqDone); _ = seq.Run(seqCtx) }()
	}
	e.stopSeq = func() { seqCancel(); <-seqDone }
	e.startSeq()
	t.Cleanup(func() { e.stopSeq() })
	return e
}

// createAccount creates the account (its repo and #sync), published in a
// mock DID directory whose #atproto_pds endpoint is the server.
func (e *repairEnv) createAccount(t *testing.T) {
	t.Helper()
	e.did = "did:plc:repairtest00000000000000"
	key := e.keys.Add(t, e.did)
	e.dir.Insert(identity.Identity{
		DID: e.did, Handle: "repair.test", AlsoKnownAs: []string{"at://repair.test"},
		Keys:     map[string]identity.VerificationMethod{"atproto": {Type: "Multikey", PublicKeyMultibase: e.keys.Public(t, e.did).Multibase()}},
		Services: map[string]identity.ServiceEndpoint{"atproto_pds": {Type: "AtprotoPersonalDataServer", URL: e.url}},
	})
	require.NoError(t, pgx.BeginFunc(context.Background(), e.pool, func(tx pgx.Tx) error {
		ctx := context.Background()
		if _, err := e.engine.InitRepo(ctx, tx, e.did, key); err != nil {
			return err
		}
		ev, err := e.engine.SyncEvent(ctx, tx, e.did)
		if err != nil {
			return err
		}
		return eventlog.Append(ctx, tx, ev)
	}))
	e.seq.Wake()
}

// post commits one post to the account.
func (e *repairEnv) post(t *testing.T, ctx context.Context, text string) *repo.CommitResult {
	t.Helper()
	res, err := e.engine.Apply(ctx, e.did, []repo.Write{{
		Action: repo.ActionCreate, Collection: "app.bsky.feed.post",
		Record: map[string]any{"$type": "app.bsky.feed.post", "text": text, "createdAt": "2026-11-29T00:00:00Z"},
	}}, nil)
	require.NoError(t, err)
	return res
}

// seqOf is the seq of the account's #commit of rev.
func (e *repairEnv) seqOf(t *testing.T, ctx context.Context, rev string) int64 {
	t.Helper()
	var seq int64
	require.NoError(t, e.pool.QueryRow(ctx, "SELECT seq FROM events WHERE did = $1 AND rev = $2 AND kind = 'commit'", e.did.String(), rev).Scan(&seq))
	return seq
}

// inflate rewrites a stored #commit so its blocks carry a filler block of n
// bytes after the real ones: its frame then exceeds what relays read.
func inflate(t *testing.T, pool *pgxpool.Pool, where string, arg int64, n int) {
	t.Helper()
	ctx := context.Background()
	var stored []byte
	require.NoError(t, pool.QueryRow(ctx, "SELECT id, body FROM events WHERE "+where, arg).Scan(&arg, &stored))
	body, seqOffset, blocksLen := eventlogtest.InflateCommit(t, stored, n)
	_, err := pool.Exec(ctx, "UPDATE events SET body = $2, seq_offset = $3, blocks_len = $4 WHERE id = $1", arg, body, seqOffset, blocksLen)
	require.NoError(t, err)
}

// naiveRelay consumes like indigo's relay at its worst: a frame over the
// read limit drops the connection, and it redials at once with the same
// cursor, forever.
type naiveRelay struct {
	cursor atomic.Int64
	dials  atomic.Int64
	syncs  atomic.Int64
}

func (n *naiveRelay) run(ctx context.Context, url string) {
	for ctx.Err() == nil {
		n.dials.Add(1)
		conn, _, err := websocket.DefaultDialer.DialContext(ctx, fmt.Sprintf("%s?cursor=%d", url, n.cursor.Load()), nil)
		if err != nil {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		conn.SetReadLimit(relayReadLimit)
		stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
		for {
			_, msg, err := conn.ReadMessage()
			if err != nil {
				break
			}
			r := bytes.NewReader(msg)
			var hdr stream.EventHeader
			if hdr.UnmarshalCBOR(r) != nil || hdr.Op != 1 {
				break
			}
			var seq int64
			switch hdr.MsgType {
			case "#commit":
				var c comatproto.SyncSubscribeRepos_Commit
				if c.UnmarshalCBOR(r) != nil {
					break
				}
				seq = c.Seq
			case "#sync":
				var s comatproto.SyncSubscribeRepos_Sync
				if s.UnmarshalCBOR(r) != nil {
					break
				}
				seq = s.Seq
				n.syncs.Add(1)
			case "#identity", "#account":
				var a comatproto.SyncSubscribeRepos_Account
				_ = a.UnmarshalCBOR(r)
				seq = a.Seq
			}
			if seq > n.cursor.Load() {
				n.cursor.Store(seq)
			}
		}
		stop()
		_ = conn.Close()
	}
}

func startNaiveRelay(t *testing.T, ctx context.Context, e *repairEnv, cursor int64) *naiveRelay {
	n := &naiveRelay{}
	n.cursor.Store(cursor)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); n.run(ctx, "ws://"+e.host+"/xrpc/com.atproto.sync.subscribeRepos") }()
	t.Cleanup(func() { cancel(); <-done })
	return n
}

// TestOversizedCommitServedAsSync: with the fallback on (the default), the
// consumer gets a #sync at the bad seq and moves on.
func TestOversizedCommitServedAsSync(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newRepairEnv(t, ctx, false)
	inflate(t, e.pool, "seq = $1", e.badSeq, 5_100_000)
	n := startNaiveRelay(t, ctx, e, e.badSeq-1)
	require.Eventually(t, func() bool { return n.cursor.Load() >= e.badSeq }, 30*time.Second, 10*time.Millisecond)
	require.Equal(t, int64(1), n.syncs.Load(), "the oversized commit arrives as #sync")
	require.Equal(t, int64(1), n.dials.Load(), "no reconnect needed")
}

// TestStuckConsumerRepairedByAdmin replays the incident: the fallback is
// off, a commit is stored oversized, a consumer that drops the connection on
// a frame over 5,000,000 bytes and redials at once with the same cursor (as
// indigo's relay does) loops on it, Bulwark flags it stuck at that seq, the
// operator runs `bulwark admin firehose rewrite-as-sync`, the consumer moves
// on, and the #sync it got verifies with indigo against the account's key.
//
// The same story with indigo's relay itself as the consumer, ingesting the
// #sync after the repair, is TestIndigoRelayResumesAfterRewriteAsSync.
func TestStuckConsumerRepairedByAdmin(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bin := buildBulwark(t)
	e := newRepairEnv(t, ctx, true)
	inflate(t, e.pool, "seq = $1", e.badSeq, 5_100_000)
	n := startNaiveRelay(t, ctx, e, e.badSeq-1)

	var stuck *firehose.StuckInfo
	require.Eventually(t, func() bool {
		for _, c := range e.hub.Health().Consumers() {
			if c.Stuck != nil && c.Stuck.Event != nil {
				stuck = c.Stuck
				return true
			}
		}
		return false
	}, 30*time.Second, 20*time.Millisecond, "Bulwark must flag the looping consumer within 30 s")
	require.Equal(t, e.badSeq, stuck.Seq)
	require.Equal(t, e.badSeq-1, stuck.Cursor)
	require.Equal(t, eventlog.KindCommit, stuck.Event.Kind)
	require.Greater(t, stuck.Event.FrameBytes, relayReadLimit)
	require.NotEmpty(t, stuck.Event.Problems)
	require.Less(t, n.cursor.Load(), e.badSeq, "still stuck before the repair")
	require.GreaterOrEqual(t, n.dials.Load(), int64(3))

	out, err := exec.CommandContext(ctx, bin, "admin", "--url", e.url, "--admin-password", e.password,
		"firehose", "rewrite-as-sync", "--seq", fmt.Sprint(e.badSeq), "--reason", "relays stuck").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), `"changed": true`)

	require.Eventually(t, func() bool { return n.cursor.Load() >= e.badSeq }, 30*time.Second, 10*time.Millisecond, "the consumer advances after the repair")
	require.Equal(t, int64(1), n.syncs.Load())

	// The #sync now at that seq is genuine: indigo verifies its commit
	// signature against the account's DID document.
	evs, err := eventlog.NewLog(e.pool).After(ctx, e.badSeq-1, 1)
	require.NoError(t, err)
	require.Equal(t, eventlog.KindSync, evs[0].Kind)
	frame := eventlog.AppendFrame(nil, evs[0].Kind, evs[0].Body, evs[0].SeqOffset, evs[0].Seq)
	r := bytes.NewReader(frame)
	var hdr stream.EventHeader
	require.NoError(t, hdr.UnmarshalCBOR(r))
	var sync comatproto.SyncSubscribeRepos_Sync
	require.NoError(t, sync.UnmarshalCBOR(r))
	commit, err := atrepo.VerifySyncMessage(ctx, e.dir, &sync)
	require.NoError(t, err)
	require.Equal(t, e.badRev, commit.Rev)
	require.Equal(t, e.badSeq, sync.Seq)
}

// TestIndigoRelayResumesAfterRewriteAsSync replays the incident with
// indigo's own relay (cmd/relay, strict validation) as the consumer, the
// fallback off: the relay follows Bulwark live, a #commit is stored over
// the relay's frame limit, the relay loops on it and emits nothing from
// that seq on, Bulwark flags it stuck at that seq, the operator runs
// `bulwark admin firehose rewrite-as-sync`, and the relay ingests the #sync
// and the commit after it with nothing done to the relay.
//
// What indigo's relay does (indigo v0.0.0-20260605210604-af2fec94f34c,
// cmd/relay):
//   - stream/consumer.go:18,150: HandleRepoStream sets the connection's
//     read limit to MaxMessageBytes = 5,000,000. gorilla/websocket v1.5.3
//     conn.go:924-926 checks it against the frame header's length as the
//     frame starts: it sends close 1009 (message too big) and NextReader
//     fails with ErrReadLimit, so HandleRepoStream returns "con err at
//     read: websocket: read limit exceeded" (consumer.go:178-180), without
//     reading the body. (Had it been read, relay/verify.go:41 would reject
//     blocks over MaxMessageBlocksBytes = 2,000,000 anyway.)
//   - relay/slurper.go:355-361: subscribeWithRedialer logs "host connection
//     failed" and loops. Backoff counts only failed dials (slurper.go:326-
//     341); this dial succeeded, so the relay redials at once, forever, with
//     cursor = sub.LastSeq (slurper.go:363-367, 320-323): a tight loop on
//     the same event. Its cursor lags one event: the callbacks call
//     sub.UpdateSeq before the scheduler counts the event done
//     (slurper.go:404, parallel/parallel.go:140-173). Only the cursor flush
//     every PersistCursorPeriod = 4 s (slurper.go:72,163-166,496) catches
//     it up, and in the loop only if it runs between the replayed event
//     before the oversized one and the next redial. Until then the relay
//     redials at the seq two before the oversized one, and Bulwark flags
//     it stuck at the (sound) event before it; in a run without this
//     test's wait it took 7 s and about 350 redials for the flag to move
//     to the oversized seq. So the test waits for the flush to store the
//     relay's cursor before the oversized commit is sequenced.
//   - Failed dials are another matter. Bulwark's admission control lets a
//     consumer outside its allow list redial 5 times, then 1 a minute, and
//     answers 429 (the relay logs "websocket: bad handshake"). Each refusal
//     is a failed dial: backoff grows, and the relay sleeps up to 1 s
//     before each redial, then 30 s once backoff reaches 10 (slurper.go:
//     328-330, 380-390): this is why it "did not redial within 30 s"
//     before. After the 16th the host is marked offline and the redialer
//     exits (slurper.go:332-337); then only a new subscription brings it
//     back: an operator's com.atproto.sync.requestCrawl
//     (cmd/relay/handlers.go:19-69) or a restart's ResubscribeAllHosts,
//     both Relay.SubscribeToHost (relay/crawl.go:11-56), which dials with
//     the host's persisted cursor. While the redialer lives,
//     SubscribeToHost does nothing (crawl.go:14). This test's server allows
//     loopback, as it would a known relay, so the relay's dials never fail
//     and it keeps redialing at once.
//
// Mechanism that resumes it: the relay's own redial loop. The first redial
// after the rewrite reads a #sync at the seq; the relay verifies it
// (relay/verify.go:177-208) and re-emits it, then the commits after it.
//
// Not parallel: the relay logs through slog.Default, which the test swaps
// for a recorder while it runs.
func TestIndigoRelayResumesAfterRewriteAsSync(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out indigo's relay redial back-off (tens of seconds)")
	}
	logs := recordDefaultLog(t)
	ctx := context.Background()
	bin := buildBulwark(t)
	e := startRepairEnv(t, ctx, true)

	relay := relaytesting.MustSimpleRelay(e.dir, t.TempDir(), false)
	require.NoError(t, relay.Relay.SubscribeToHost(ctx, e.host, true, true))
	t.Cleanup(func() { _ = relay.Relay.Slurper.KillUpstreamConnection(context.Background(), e.host, false) })
	require.Eventually(t, func() bool { return e.hub.Live() == 1 }, 30*time.Second, 5*time.Millisecond)
	out := watchRelay(t, ctx, relay.Port)

	// Live, the account's #sync and two commits go through the relay.
	e.createAccount(t)
	before := []string{e.post(t, ctx, "post 0").Rev, e.post(t, ctx, "post 1").Rev}
	require.Eventually(t, func() bool { return out.has("#commit " + before[1]) }, 30*time.Second, 10*time.Millisecond)
	// Wait for the relay's periodic flush to catch its cursor up to the
	// last commit relayed (it stores it in the host row; see above), then
	// stop the flusher: Slurper.Shutdown stops only that goroutine, the
	// subscription goes on. Under -race the flusher would report indigo's
	// own data race with every redial, which replaces sub.scheduler
	// unguarded (relay/slurper.go:468 vs 102). Nothing is lost: the cursor
	// cannot move while the relay is stuck.
	beforeSeq := e.seqOf(t, ctx, before[1])
	require.Eventually(t, func() bool {
		h, err := relay.Relay.GetHost(ctx, e.host)
		return err == nil && h.LastSeq == beforeSeq
	}, 30*time.Second, 20*time.Millisecond, "the relay flushes its cursor")
	require.NoError(t, relay.Relay.Slurper.Shutdown())

	// The next commit is stored oversized before it is sequenced, so the
	// relay's first sight of it is the oversized frame.
	e.stopSeq()
	bad := e.post(t, ctx, "post 2")
	var id int64
	require.NoError(t, e.pool.QueryRow(ctx, "SELECT id FROM events WHERE did = $1 AND rev = $2 AND seq IS NULL", e.did.String(), bad.Rev).Scan(&id))
	inflate(t, e.pool, "id = $1", id, 5_100_000)
	e.startSeq()
	e.badRev = bad.Rev
	// And the account goes on writing.
	later := e.post(t, ctx, "post 3")
	var laterSeq int64
	require.Eventually(t, func() bool {
		return e.pool.QueryRow(ctx, "SELECT seq FROM events WHERE did = $1 AND rev = $2 AND seq IS NOT NULL", e.did.String(), later.Rev).Scan(&laterSeq) == nil
	}, 30*time.Second, 5*time.Millisecond)
	e.badSeq = e.seqOf(t, ctx, bad.Rev)
	require.Greater(t, laterSeq, e.badSeq)

	var stuck *firehose.StuckInfo
	var who firehose.ConsumerReport
	t.Cleanup(func() {
		if t.Failed() {
			for _, c := range e.hub.Health().Consumers() {
				t.Logf("consumer %+v, stuck %+v, failing %+v", c, c.Stuck, c.Failing)
			}
			t.Logf("bad seq %d; the relay's log:\n%s", e.badSeq, logs.String())
		}
	})
	require.Eventually(t, func() bool {
		for _, c := range e.hub.Health().Consumers() {
			if c.Stuck != nil && c.Stuck.Event != nil && c.Stuck.Seq == e.badSeq {
				stuck, who = c.Stuck, c
				return true
			}
		}
		return false
	}, 30*time.Second, 20*time.Millisecond, "Bulwark must flag the relay stuck at the oversized seq within 30 s")
	require.Contains(t, who.UserAgent, "indigo-relay")
	require.Equal(t, e.badSeq-1, stuck.Cursor)
	require.Equal(t, eventlog.KindCommit, stuck.Event.Kind)
	require.Greater(t, stuck.Event.FrameBytes, stream.MaxMessageBytes)
	require.NotEmpty(t, stuck.Event.Problems)

	// The relay: its connection failed on its frame read limit, again and
	// again, and it is still subscribed (redialing).
	require.GreaterOrEqual(t, logs.count(`msg="host connection failed"`, "host="+e.host, "read limit exceeded"), 3)
	require.True(t, relay.Relay.Slurper.CheckIfSubscribed(e.host))
	// It relayed everything before the oversized commit, and nothing from
	// it on: not it, not the commit after it.
	got := out.snapshot()
	require.Equal(t, []string{"#sync", "#commit " + before[0], "#commit " + before[1]}, got, "relayed before the repair")

	cmd := exec.CommandContext(ctx, bin, "admin", "--url", e.url, "--admin-password", e.password,
		"firehose", "rewrite-as-sync", "--seq", fmt.Sprint(e.badSeq), "--reason", "relays stuck")
	res, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", res)
	require.Contains(t, string(res), `"changed": true`)

	// The relay's next redial reads the #sync: it ingests it and the commit
	// after it, and re-emits both, in order.
	want := append(got, "#sync "+bad.Rev, "#commit "+later.Rev)
	require.Eventually(t, func() bool { return len(out.snapshot()) >= len(want) }, 30*time.Second, 10*time.Millisecond, "the relay resumes after the repair")
	require.Equal(t, want, out.snapshot())
	relayed := out.lastSync()
	require.Equal(t, e.did.String(), relayed.Did)
	commit, err := atrepo.VerifySyncMessage(ctx, e.dir, relayed)
	require.NoError(t, err)
	require.Equal(t, bad.Rev, commit.Rev)
	// Strict checks passed without a complaint about the account.
	for _, complaint := range []string{"failed verification", "miss-matching", "failed to invert", "failed handling event"} {
		require.Zero(t, logs.count(complaint, "did="+e.did.String()), "relay logged %q", complaint)
	}
}

// relayOutput records what indigo's relay re-emits, read from its own
// subscribeRepos with its stream package, as "#kind rev" (rev left out of
// the account-creation #sync).
type relayOutput struct {
	mu    sync.Mutex
	evs   []string
	syncs []*comatproto.SyncSubscribeRepos_Sync
	n     int
}

func watchRelay(t *testing.T, ctx context.Context, port int) *relayOutput {
	t.Helper()
	o := &relayOutput{}
	cb := &stream.RepoStreamCallbacks{
		RepoCommit: func(ev *comatproto.SyncSubscribeRepos_Commit) error {
			o.add("#commit " + ev.Rev)
			return nil
		},
		RepoSync: func(ev *comatproto.SyncSubscribeRepos_Sync) error {
			o.mu.Lock()
			defer o.mu.Unlock()
			if len(o.syncs) == 0 {
				o.evs = append(o.evs, "#sync")
			} else {
				o.evs = append(o.evs, "#sync "+ev.Rev)
			}
			o.syncs = append(o.syncs, ev)
			return nil
		},
		RepoIdentity: func(*comatproto.SyncSubscribeRepos_Identity) error { o.add("#identity"); return nil },
		RepoAccount:  func(*comatproto.SyncSubscribeRepos_Account) error { o.add("#account"); return nil },
	}
	conn, _, err := websocket.DefaultDialer.Dial(fmt.Sprintf("ws://localhost:%d/xrpc/com.atproto.sync.subscribeRepos", port), nil)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = stream.HandleRepoStream(ctx, conn, sequential.NewScheduler("relaytest-repair", cb.EventHandler), quiet)
	}()
	t.Cleanup(func() { cancel(); _ = conn.Close(); <-done })
	return o
}

func (o *relayOutput) add(s string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.evs = append(o.evs, s)
}

func (o *relayOutput) snapshot() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.evs)
}

func (o *relayOutput) has(ev string) bool { return slices.Contains(o.snapshot(), ev) }

func (o *relayOutput) lastSync() *comatproto.SyncSubscribeRepos_Sync {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.syncs[len(o.syncs)-1]
}

// logRecord keeps what is logged through slog.Default (warnings and up) as
// text lines.
type logRecord struct{ syncbuf.Buffer }

// count is how many lines contain every one of subs.
func (l *logRecord) count(subs ...string) int {
	n := 0
	for line := range strings.Lines(l.String()) {
		all := true
		for _, s := range subs {
			all = all && strings.Contains(line, s)
		}
		if all {
			n++
		}
	}
	return n
}

// recordDefaultLog sends slog.Default (and the log package) to a recorder
// until the test ends. Loggers made from slog.Default meanwhile (indigo's
// relay makes its own when built, and per connection) keep writing to it
// afterwards; it is never read again.
func recordDefaultLog(t *testing.T) *logRecord {
	l := &logRecord{}
	prev, w, flags := slog.Default(), log.Writer(), log.Flags()
	slog.SetDefault(slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelWarn})))
	t.Cleanup(func() { slog.SetDefault(prev); log.SetOutput(w); log.SetFlags(flags) })
	return l
}

// buildBulwark compiles the bulwark binary once for the admin command.
func buildBulwark(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "bulwark")
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/bulwark")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", strings.TrimSpace(string(out)))
	return bin
}

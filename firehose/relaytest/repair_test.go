package relaytest

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
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
	"github.com/gorilla/websocket"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/db/dbtest"
	"github.com/bulwark-pds/bulwark/firehose"
	"github.com/bulwark-pds/bulwark/pds"
	"github.com/bulwark-pds/bulwark/repo"
	"github.com/bulwark-pds/bulwark/repo/repotest"
)

// relayReadLimit is what indigo's relay allows one frame: above it the
// read fails and the relay drops the connection.
const relayReadLimit = 5_000_000

// repairEnv is a Bulwark (pds server, firehose, admin API) with one account
// whose latest #commit was stored oversized, as a bug or an import could.
type repairEnv struct {
	pool   *pgxpool.Pool
	hub    *firehose.Hub
	engine *repo.Engine
	seq    *firehose.Sequencer
	// stopSeq stops the running sequencer and waits for it.
	stopSeq  func()
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
	pool := dbtest.New(t)
	ks := repotest.NewKeys()
	seq := firehose.NewSequencer(pool, firehose.SequencerConfig{Logger: quiet})
	log := firehose.NewLog(pool)
	health := firehose.NewHealth(firehose.HealthConfig{
		Logger: quiet,
		Inspect: func(ctx context.Context, seq int64) (*firehose.EventInfo, error) {
			evs, err := log.Inspect(ctx, firehose.EventFilter{FromSeq: seq, Limit: 1})
			if err != nil || len(evs) == 0 {
				return nil, err
			}
			return &evs[0], nil
		},
	})
	hub := firehose.NewHub(pool, firehose.Config{Logger: quiet, Health: health, DisableOversizeSync: disableFallback})
	seq.OnSequenced(hub.Notify)
	engine := repo.New(pool, ks, seq, repo.Config{Logger: quiet})
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)
	runCtx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	seqCtx, seqCancel := context.WithCancel(runCtx)
	seqDone := make(chan struct{})
	go func() { defer close(seqDone); _ = seq.Run(seqCtx) }()
	wg.Go(func() { _ = hub.Run(runCtx) })

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	cfg := config.DefaultConfig()
	cfg.DataDir = t.TempDir()
	cfg.Hostname = fmt.Sprintf("localhost:%d", port)
	cfg.AdminPassword = "repair-test-admin"
	require.NoError(t, cfg.Finalize())
	srv, err := pds.New(pds.Options{
		Config: cfg, DB: pool, Logger: quiet, Firehose: hub,
		// The test's consumers all come from loopback and redial at once.
		FirehoseAdmission: &firehose.AdmissionConfig{Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}, MaxPerClient: 64},
	})
	require.NoError(t, err)
	hs := &http.Server{Handler: srv.Handler()}
	go func() { _ = hs.Serve(ln) }()
	t.Cleanup(func() { hub.Close(); _ = hs.Close() })

	stopSeq := func() { seqCancel(); <-seqDone }
	t.Cleanup(stopSeq)
	e := &repairEnv{pool: pool, hub: hub, engine: engine, seq: seq, stopSeq: stopSeq, host: cfg.Hostname, url: "http://" + cfg.Hostname, password: cfg.AdminPassword, dir: identity.NewMockDirectory()}
	e.did = "did:plc:repairtest00000000000000"
	repotest.CreateRepo(t, pool, engine, ks, e.did)
	e.dir.Insert(identity.Identity{
		DID: e.did, Handle: "repair.test", AlsoKnownAs: []string{"at://repair.test"},
		Keys:     map[string]identity.VerificationMethod{"atproto": {Type: "Multikey", PublicKeyMultibase: ks.Public(t, e.did).Multibase()}},
		Services: map[string]identity.ServiceEndpoint{"atproto_pds": {Type: "AtprotoPersonalDataServer", URL: e.url}},
	})
	var last *repo.CommitResult
	for i := range 3 {
		last, err = engine.Apply(ctx, e.did, []repo.Write{{
			Action: repo.ActionCreate, Collection: "app.bsky.feed.post",
			Record: map[string]any{"$type": "app.bsky.feed.post", "text": fmt.Sprint("post ", i), "createdAt": "2026-11-29T00:00:00Z"},
		}}, nil)
		require.NoError(t, err)
	}
	e.badRev = last.Rev
	require.Eventually(t, func() bool {
		l, err := log.LastSeq(ctx)
		return err == nil && l >= 4
	}, 30*time.Second, 5*time.Millisecond)
	require.NoError(t, pool.QueryRow(ctx, "SELECT seq FROM events WHERE did = $1 AND rev = $2 AND kind = 'commit'", e.did.String(), e.badRev).Scan(&e.badSeq))
	return e
}

// inflate rewrites a stored #commit so its blocks carry a filler block of n
// bytes after the real ones: its frame then exceeds what relays read. (The
// signed commit stays the first root, so a #sync made from it is genuine.)
// cbor-gen will not encode byte strings over 2 MiB, so the new blocks are
// spliced into the body by hand.
func inflate(t *testing.T, pool *pgxpool.Pool, where string, arg int64, n int) {
	t.Helper()
	ctx := context.Background()
	var ev firehose.Event
	ev.Kind = firehose.KindCommit
	require.NoError(t, pool.QueryRow(ctx, "SELECT id, body, seq_offset FROM events WHERE "+where, arg).Scan(&arg, &ev.Body, &ev.SeqOffset))
	frame := firehose.AppendFrame(nil, ev.Kind, ev.Body, ev.SeqOffset, 0)
	r := bytes.NewReader(frame)
	var hdr stream.EventHeader
	require.NoError(t, hdr.UnmarshalCBOR(r))
	var c comatproto.SyncSubscribeRepos_Commit
	require.NoError(t, c.UnmarshalCBOR(r))
	blocks := append([]byte{}, c.Blocks...)
	filler := bytes.Repeat([]byte{0xa0}, n)
	blocks = binary.AppendUvarint(blocks, uint64(len(fillerCID)+len(filler)))
	blocks = append(append(blocks, fillerCID...), filler...)

	marker := []byte("BLOCKS-PLACEHOLDER:") // under 24 bytes: a one-byte head
	c.Blocks = marker
	enc, err := firehose.EncodeCommit(&c)
	require.NoError(t, err)
	at := bytes.Index(enc.Body, marker) - 1
	body := append([]byte{}, enc.Body[:at]...)
	body = append(body, 0x5a)
	body = binary.BigEndian.AppendUint32(body, uint32(len(blocks)))
	body = append(body, blocks...)
	body = append(body, enc.Body[at+1+len(marker):]...)
	_, err = pool.Exec(ctx, "UPDATE events SET body = $2, seq_offset = $3, blocks_len = $4 WHERE id = $1", arg, body, enc.SeqOffset, len(blocks))
	require.NoError(t, err)
}

// fillerCID is a raw-codec CIDv1 (sha2-256) header for the filler block;
// nothing reads the block, so its digest need not match.
var fillerCID = append([]byte{0x01, 0x55, 0x12, 0x20}, make([]byte, 32)...)

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
// indigo's in-process relay itself is not the looping consumer here: in its
// test harness, after a read-limit failure it did not redial within 30 s,
// so it cannot show the loop (see the closing note of issue 7).
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
	require.Equal(t, firehose.KindCommit, stuck.Event.Kind)
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
	evs, err := firehose.NewLog(e.pool).After(ctx, e.badSeq-1, 1)
	require.NoError(t, err)
	require.Equal(t, firehose.KindSync, evs[0].Kind)
	frame := firehose.AppendFrame(nil, evs[0].Kind, evs[0].Body, evs[0].SeqOffset, evs[0].Seq)
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

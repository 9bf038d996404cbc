package firehose_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	atrepo "github.com/bluesky-social/indigo/atproto/repo"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/bluesky-social/indigo/events"
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

// quietLogger drops routine logs so test output stays readable.
var quietLogger = slog.New(slog.NewTextHandler(io.Discard, nil))

// queryCounter is a pgx tracer recording the statements a pool runs, and
// which of them subscriptions ran (their context carries subscriptionKey),
// so that tests can tell how much database work a connection caused, apart
// from what the hub does on its own.
type queryCounter struct {
	mu   sync.Mutex
	sqls []string
	mine []bool
}

// subscriptionKey marks the context of a subscription the test server
// serves.
type subscriptionKey struct{}

func (q *queryCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	q.mu.Lock()
	q.sqls = append(q.sqls, data.SQL)
	q.mine = append(q.mine, ctx.Value(subscriptionKey{}) != nil)
	q.mu.Unlock()
	return ctx
}

func (q *queryCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// mark returns the number of statements so far.
func (q *queryCounter) mark() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.sqls)
}

// since returns the statements run after mark m.
func (q *queryCounter) since(m int) []string {
	q.mu.Lock()
	defer q.mu.Unlock()
	return append([]string(nil), q.sqls[m:]...)
}

// subscriptionsSince returns the statements subscriptions ran after mark m.
func (q *queryCounter) subscriptionsSince(m int) []string {
	q.mu.Lock()
	defer q.mu.Unlock()
	var out []string
	for i := m; i < len(q.sqls); i++ {
		if q.mine[i] {
			out = append(out, q.sqls[i])
		}
	}
	return out
}

// seqWatch follows the last seq a sequencer assigned, so tests wait for
// sequencing by event rather than by polling.
type seqWatch struct {
	mu      sync.Mutex
	last    int64
	changed chan struct{}
}

func newSeqWatch() *seqWatch { return &seqWatch{changed: make(chan struct{})} }

// set is the sequencer's OnSequenced callback.
func (w *seqWatch) set(last int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if last > w.last {
		w.last = last
		close(w.changed)
		w.changed = make(chan struct{})
	}
}

// wait returns the last seq once it is at least atLeast.
func (w *seqWatch) wait(t testing.TB, atLeast int64) int64 {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		w.mu.Lock()
		last, changed := w.last, w.changed
		w.mu.Unlock()
		if last >= atLeast {
			return last
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("the sequencer reached seq %d, not %d", last, atLeast)
		}
	}
}

// bundle is one running "process": a pool, a repo engine, a sequencer and
// a hub behind an httptest server.
type bundle struct {
	url     string // database URL
	pool    *pgxpool.Pool
	queries *queryCounter
	engine  *repo.Engine
	keys    *repotest.Keys
	seq     *eventlog.Sequencer
	hub     *firehose.Hub
	log     *eventlog.Log
	wsURL   string
	// sequenced follows seq's batches; ended receives a value each time
	// the server has finished serving a subscription.
	sequenced *seqWatch
	ended     chan struct{}
}

type options struct {
	hub         firehose.Config
	noSequencer bool // sequence by hand with SequenceBatch
	dbURL       string
	keys        *repotest.Keys
	// admission, when set, admits connections keyed by the X-Forwarded-For
	// header (standing for distinct client addresses) before the upgrade.
	admission *firehose.Admission
}

func setup(t testing.TB, o options) *bundle {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	if o.dbURL == "" {
		o.dbURL = dbtest.NewURL(t)
	}
	qc := &queryCounter{}
	pcfg, err := pgxpool.ParseConfig(o.dbURL)
	require.NoError(t, err)
	pcfg.ConnConfig.Tracer = qc
	pcfg.MaxConns = 20
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(t, err)
	if o.keys == nil {
		o.keys = repotest.NewKeys()
	}
	if o.hub.Logger == nil {
		o.hub.Logger = quietLogger
	}
	seq := eventlog.NewSequencer(pool, eventlog.SequencerConfig{Logger: quietLogger})
	hub := firehose.NewHub(pool, o.hub)
	seq.OnSequenced(hub.Notify)
	sequenced := newSeqWatch()
	seq.OnSequenced(sequenced.set)
	b := &bundle{
		url:     o.dbURL,
		pool:    pool,
		queries: qc,
		engine:  repo.New(pool, o.keys, seq, repo.Config{Logger: quietLogger}),
		keys:    o.keys,
		seq:     seq,
		hub:     hub,
		log:     eventlog.NewLog(pool),

		sequenced: sequenced,
		ended:     make(chan struct{}, 1000),
	}
	var wg sync.WaitGroup
	if !o.noSequencer {
		wg.Go(func() { _ = seq.Run(ctx) })
	}
	wg.Go(func() { _ = hub.Run(ctx) })
	srv := httptest.NewServer(b.subscribeHandler(hub, o.admission))
	b.wsURL = "ws" + strings.TrimPrefix(srv.URL, "http") + "/xrpc/com.atproto.sync.subscribeRepos"
	t.Cleanup(func() {
		cancel()
		srv.CloseClientConnections()
		srv.Close()
		wg.Wait()
		pool.Close()
	})
	return b
}

// subscribeHandler serves subscribeRepos from hub, after admission when
// one is given (keyed by the X-Forwarded-For header, standing for distinct
// client addresses).
func (b *bundle) subscribeHandler(hub *firehose.Hub, admission *firehose.Admission) http.Handler {
	up := firehose.Upgrader()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if admission != nil {
			ip, _ := netip.ParseAddr(r.Header.Get("X-Forwarded-For"))
			tk, retry, err := admission.Admit(ip, time.Now())
			if err != nil {
				w.Header().Set("Retry-After", fmt.Sprint(int(retry.Seconds())+1))
				http.Error(w, `{"error":"RateLimitExceeded"}`, http.StatusTooManyRequests)
				return
			}
			defer tk.Release()
		}
		var cursor *int64
		if v := r.URL.Query().Get("cursor"); v != "" {
			var c int64
			_, err := fmt.Sscan(v, &c)
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
		ip, _, _ := net.SplitHostPort(r.RemoteAddr)
		if f := r.Header.Get("X-Forwarded-For"); f != "" {
			ip = f
		}
		ctx := context.WithValue(r.Context(), subscriptionKey{}, true)
		_ = hub.Serve(ctx, conn, cursor, firehose.Client{IP: ip, UserAgent: r.UserAgent()})
		select {
		case b.ended <- struct{}{}:
		default:
		}
	})
}

var didSeq atomic.Int64

// newRepo creates an account's key and empty repository, with its #sync.
func (b *bundle) newRepo(t testing.TB) syntax.DID {
	t.Helper()
	did := syntax.DID(fmt.Sprintf("did:plc:fh%022d", didSeq.Add(1)))
	repotest.CreateRepo(t, b.pool, b.engine, b.keys, did)
	b.seq.Wake()
	return did
}

// appendEvent stores a non-repo event (#identity, #account) directly.
func (b *bundle) appendEvent(t testing.TB, ev *eventlog.Encoded) {
	t.Helper()
	require.NoError(t, eventlog.Append(context.Background(), b.pool, ev))
	b.seq.Wake()
}

func post(text string) map[string]any {
	return map[string]any{"$type": "app.bsky.feed.post", "text": text, "createdAt": "2026-11-29T00:00:00Z"}
}

// write commits one post to did.
func (b *bundle) write(t testing.TB, did syntax.DID, text string) *repo.CommitResult {
	t.Helper()
	res, err := b.tryWrite(did, text)
	require.NoError(t, err)
	return res
}

// tryWrite commits one post to did, for goroutines other than the test's
// (which report an error with t.Error).
func (b *bundle) tryWrite(did syntax.DID, text string) (*repo.CommitResult, error) {
	return b.engine.Apply(context.Background(), did, []repo.Write{{
		Action: repo.ActionCreate, Collection: "app.bsky.feed.post", Record: post(text),
	}}, nil)
}

// sequenceAll numbers everything pending (for bundles without a running
// sequencer) and returns the last seq.
func (b *bundle) sequenceAll(t testing.TB) int64 {
	t.Helper()
	ctx := context.Background()
	for {
		n, err := b.seq.SequenceBatch(ctx)
		require.NoError(t, err)
		if n == 0 {
			break
		}
	}
	last, err := b.log.LastSeq(ctx)
	require.NoError(t, err)
	return last
}

// waitSequenced waits until the bundle's running sequencer has numbered
// events up to seq atLeast, and returns the last seq.
func (b *bundle) waitSequenced(t testing.TB, atLeast int64) int64 {
	t.Helper()
	return b.sequenced.wait(t, atLeast)
}

// pendingCount is the number of stored events.
func (b *bundle) eventCount(t testing.TB) int64 {
	t.Helper()
	var n int64
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT count(*) FROM events").Scan(&n))
	return n
}

// allEvents returns the whole sequenced log.
func (b *bundle) allEvents(t testing.TB) []eventlog.Event {
	t.Helper()
	var all []eventlog.Event
	var after int64
	for {
		page, err := b.log.After(context.Background(), after, 500)
		require.NoError(t, err)
		if len(page) == 0 {
			return all
		}
		all = append(all, page...)
		after = page[len(page)-1].Seq
	}
}

// frame is one decoded message from the stream.
type frame struct {
	op     int64
	kind   string // "#commit", ... ; "" for error frames
	seq    int64
	raw    []byte
	commit *comatproto.SyncSubscribeRepos_Commit
	sync   *comatproto.SyncSubscribeRepos_Sync
	info   *comatproto.SyncSubscribeRepos_Info
	err    *events.ErrorFrame
}

func dial(t testing.TB, wsURL string, cursor *int64) *websocket.Conn {
	t.Helper()
	u := wsURL
	if cursor != nil {
		u += fmt.Sprintf("?cursor=%d", *cursor)
	}
	conn, resp, err := websocket.DefaultDialer.Dial(u, nil)
	require.NoError(t, err)
	resp.Body.Close()
	t.Cleanup(func() { conn.Close() })
	return conn
}

func ptr[T any](v T) *T { return &v }

// readFrame reads and decodes one message (within a generous deadline).
func readFrame(t testing.TB, conn *websocket.Conn) (*frame, error) {
	t.Helper()
	_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	mt, raw, err := conn.ReadMessage()
	if err != nil {
		return nil, err
	}
	require.Equal(t, websocket.BinaryMessage, mt)
	return decodeFrame(t, raw), nil
}

func decodeFrame(t testing.TB, raw []byte) *frame {
	t.Helper()
	r := bytes.NewReader(raw)
	var hdr events.EventHeader
	require.NoError(t, hdr.UnmarshalCBOR(r))
	f := &frame{op: hdr.Op, kind: hdr.MsgType, raw: raw}
	if hdr.Op == events.EvtKindErrorFrame {
		f.err = &events.ErrorFrame{}
		require.NoError(t, f.err.UnmarshalCBOR(r))
		return f
	}
	switch hdr.MsgType {
	case "#commit":
		f.commit = &comatproto.SyncSubscribeRepos_Commit{}
		require.NoError(t, f.commit.UnmarshalCBOR(r))
		f.seq = f.commit.Seq
	case "#sync":
		f.sync = &comatproto.SyncSubscribeRepos_Sync{}
		require.NoError(t, f.sync.UnmarshalCBOR(r))
		f.seq = f.sync.Seq
	case "#identity":
		var ev comatproto.SyncSubscribeRepos_Identity
		require.NoError(t, ev.UnmarshalCBOR(r))
		f.seq = ev.Seq
	case "#account":
		var ev comatproto.SyncSubscribeRepos_Account
		require.NoError(t, ev.UnmarshalCBOR(r))
		f.seq = ev.Seq
	case "#info":
		f.info = &comatproto.SyncSubscribeRepos_Info{}
		require.NoError(t, f.info.UnmarshalCBOR(r))
	default:
		t.Fatalf("unexpected frame type %q", hdr.MsgType)
	}
	require.Zero(t, r.Len(), "trailing bytes after %s body", hdr.MsgType)
	return f
}

// readUntil reads frames until one has seq ≥ last, returning all of them.
func readUntil(t testing.TB, conn *websocket.Conn, last int64) []*frame {
	t.Helper()
	var out []*frame
	for {
		f, err := readFrame(t, conn)
		require.NoError(t, err)
		out = append(out, f)
		require.Zero(t, f.op-1, "unexpected error frame %+v", f.err)
		if f.seq >= last {
			return out
		}
	}
}

// requireSeqs checks frames carry exactly the seqs of want, in order.
func requireSeqs(t testing.TB, want []eventlog.Event, got []*frame) {
	t.Helper()
	ws := make([]int64, len(want))
	for i, ev := range want {
		ws[i] = ev.Seq
	}
	var gs []int64
	for _, f := range got {
		if f.seq != 0 {
			gs = append(gs, f.seq)
		}
	}
	require.Equal(t, ws, gs)
}

// verifyCommit checks a received #commit with indigo: diff inversion
// against prevData and the signature.
func (b *bundle) verifyCommit(t testing.TB, c *comatproto.SyncSubscribeRepos_Commit) {
	t.Helper()
	ctx := context.Background()
	_, err := atrepo.VerifyCommitMessage(ctx, c)
	require.NoError(t, err, "indigo rejects commit seq %d", c.Seq)
	commit, _, err := atrepo.LoadCommitFromCAR(ctx, bytes.NewReader(c.Blocks))
	require.NoError(t, err)
	require.NoError(t, commit.VerifySignature(b.keys.Public(t, syntax.DID(c.Repo))))
}

package repo

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/atdata"
	atrepo "github.com/bluesky-social/indigo/atproto/repo"
	"github.com/bluesky-social/indigo/atproto/repo/mst"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/bluesky-social/indigo/events"
	"github.com/ipfs/go-cid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/db/dbtest"
	"github.com/bulwark-pds/bulwark/eventlog"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// testKeys is an in-memory KeySource: tests create accounts' keys here.
type testKeys struct {
	mu   sync.Mutex
	keys map[syntax.DID]*atcrypto.PrivateKeyK256
}

func (k *testKeys) SigningKey(_ context.Context, did syntax.DID) (atcrypto.PrivateKey, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	key, ok := k.keys[did]
	if !ok {
		return nil, fmt.Errorf("%w: no key for %s", ErrRepoNotFound, did)
	}
	return key, nil
}

type bundle struct {
	pool   *pgxpool.Pool
	engine *Engine
	keys   *testKeys
	seq    *eventlog.Sequencer
	log    *eventlog.Log
	// stopSeq stops seq where a benchmark runs it (benchSetup).
	stopSeq func()
}

// newCounters returns counters of an engine's own, registered nowhere, so
// that a test reads what its engine did and nothing else.
func newCounters() *counters {
	c := func() prometheus.Counter { return prometheus.NewCounter(prometheus.CounterOpts{Name: "test"}) }
	hints := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "test_hints"}, []string{"outcome"})
	return &counters{staleRoots: c(), refreshes: c(), commitGroups: c(), groupedCommits: c(), groupRetries: c(), plans: c(), checks: c(), hints: hints}
}

func setup(t testing.TB, cfg Config) *bundle {
	t.Helper()
	if cfg.counters == nil {
		cfg.counters = newCounters()
	}
	pool := dbtest.New(t)
	keys := &testKeys{keys: map[syntax.DID]*atcrypto.PrivateKeyK256{}}
	seq := eventlog.NewSequencer(pool, eventlog.SequencerConfig{})
	return &bundle{
		pool:   pool,
		engine: New(pool, keys, nil, cfg),
		keys:   keys,
		seq:    seq,
		log:    eventlog.NewLog(pool),
	}
}

// newRepo creates an account's key and empty repository.
func (b *bundle) newRepo(t testing.TB, n int) syntax.DID {
	t.Helper()
	ctx := context.Background()
	did := syntax.DID(fmt.Sprintf("did:plc:test%020d", n))
	key, err := atcrypto.GeneratePrivateKeyK256()
	require.NoError(t, err)
	b.keys.mu.Lock()
	b.keys.keys[did] = key
	b.keys.mu.Unlock()
	err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		if _, err := b.engine.InitRepo(ctx, tx, did, key); err != nil {
			return err
		}
		ev, err := b.engine.SyncEvent(ctx, tx, did)
		if err != nil {
			return err
		}
		return eventlog.Append(ctx, tx, ev)
	})
	require.NoError(t, err)
	return did
}

var sizedSeq atomic.Int64

func post(text string) map[string]any {
	return map[string]any{"$type": "app.bsky.feed.post", "text": text, "createdAt": "2026-11-29T00:00:00Z"}
}

func create(collection, rkey string, rec map[string]any) Write {
	return Write{Action: ActionCreate, Collection: syntax.NSID(collection), RKey: syntax.RecordKey(rkey), Record: rec}
}

// sizedRecord returns a record whose DAG-CBOR encoding is exactly size
// bytes. Records of the same size differ (so they are distinct blocks).
func sizedRecord(t testing.TB, collection string, size int) map[string]any {
	t.Helper()
	seed := fmt.Sprint(sizedSeq.Add(1), "-")
	mk := func(n int) map[string]any {
		return map[string]any{"$type": collection, "text": seed + strings.Repeat("a", n-len(seed))}
	}
	b, err := atdata.MarshalCBOR(mk(size))
	require.NoError(t, err)
	rec := mk(size - (len(b) - size))
	b, err = atdata.MarshalCBOR(rec)
	require.NoError(t, err)
	require.Equal(t, size, len(b), "could not size the record exactly")
	return rec
}

// counts returns rows in every table a write touches.
func (b *bundle) counts(t testing.TB) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, table := range []string{"repo_roots", "repo_nodes", "records", "events"} {
		var n int
		require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n))
		out[table] = n
	}
	var rev string
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT coalesce(string_agg(rev, ',' ORDER BY did), '') FROM repo_roots").Scan(&rev))
	out["revs:"+rev] = 1
	return out
}

// sequencedEvents sequences everything pending and returns the whole log.
func (b *bundle) sequencedEvents(t testing.TB) []eventlog.Event {
	t.Helper()
	ctx := context.Background()
	for {
		n, err := b.seq.SequenceBatch(ctx)
		require.NoError(t, err)
		if n == 0 {
			break
		}
	}
	var all []eventlog.Event
	var after int64
	for {
		page, err := b.log.After(ctx, after, 500)
		require.NoError(t, err)
		if len(page) == 0 {
			return all
		}
		all = append(all, page...)
		after = page[len(page)-1].Seq
	}
}

// decodeCommit turns a stored #commit back into the lexicon type, through
// the frame bytes a subscriber would receive.
func decodeCommit(t testing.TB, ev eventlog.Event) *comatproto.SyncSubscribeRepos_Commit {
	t.Helper()
	frame := eventlog.AppendFrame(nil, ev.Kind, ev.Body, ev.SeqOffset, ev.Seq)
	r := bytes.NewReader(frame)
	var hdr events.EventHeader
	require.NoError(t, hdr.UnmarshalCBOR(r))
	require.Equal(t, int64(1), hdr.Op)
	require.Equal(t, "#commit", hdr.MsgType)
	var c comatproto.SyncSubscribeRepos_Commit
	require.NoError(t, c.UnmarshalCBOR(r))
	require.Equal(t, ev.Seq, c.Seq)
	return &c
}

// verifyChain checks every #commit with indigo (inversion against prevData,
// signature) and that since/prevData chain per repo.
func (b *bundle) verifyChain(t testing.TB, events []eventlog.Event) map[syntax.DID]int {
	t.Helper()
	ctx := context.Background()
	type last struct {
		rev  string
		data cid.Cid
	}
	heads := map[string]last{}
	commits := map[syntax.DID]int{}
	var prevSeq int64
	for _, ev := range events {
		require.Greater(t, ev.Seq, prevSeq, "seq must increase")
		prevSeq = ev.Seq
		switch ev.Kind {
		case eventlog.KindSync:
			heads[ev.DID] = last{rev: ev.Rev}
		case eventlog.KindCommit:
			c := decodeCommit(t, ev)
			r, err := atrepo.VerifyCommitMessage(ctx, c)
			require.NoError(t, err, "indigo rejects commit seq %d", ev.Seq)
			commit, _, err := atrepo.LoadCommitFromCAR(ctx, bytes.NewReader(c.Blocks))
			require.NoError(t, err)
			pub, err := b.keys.keys[syntax.DID(c.Repo)].PublicKey()
			require.NoError(t, err)
			require.NoError(t, commit.VerifySignature(pub))
			prev := heads[c.Repo]
			require.NotNil(t, c.Since)
			require.Equal(t, prev.rev, *c.Since, "since must be the previous rev")
			if prev.data.Defined() {
				require.Equal(t, prev.data.String(), cid.Cid(*c.PrevData).String(), "prevData must be the previous data root")
			}
			require.Greater(t, c.Rev, prev.rev)
			root, err := r.MST.RootCID()
			require.NoError(t, err)
			heads[c.Repo] = last{rev: c.Rev, data: *root}
			commits[syntax.DID(c.Repo)]++
		}
	}
	return commits
}

// exportMatchesIndex loads a full export with indigo and checks its MST
// holds exactly the record index, and that repo_nodes holds exactly the
// tree's nodes (no leaked or missing node).
func (b *bundle) exportMatchesIndex(t testing.TB, did syntax.DID) {
	t.Helper()
	ctx := context.Background()
	var buf bytes.Buffer
	require.NoError(t, b.engine.ExportCAR(ctx, did, "", &buf))
	_, r, err := atrepo.LoadRepoFromCAR(ctx, &buf)
	require.NoError(t, err)
	require.False(t, r.MST.IsPartial(), "export must hold every MST node")
	inTree := map[string]string{}
	require.NoError(t, r.MST.Walk(func(k []byte, v cid.Cid) error {
		inTree[string(k)] = v.String()
		return nil
	}))
	rows, err := b.pool.Query(ctx, "SELECT collection || '/' || rkey, cid FROM records WHERE did = $1", did.String())
	require.NoError(t, err)
	inIndex := map[string]string{}
	var path string
	var raw []byte
	_, err = pgx.ForEachRow(rows, []any{&path, &raw}, func() error {
		c, err := cid.Cast(raw)
		inIndex[path] = c.String()
		return err
	})
	require.NoError(t, err)
	require.Equal(t, inIndex, inTree)

	nodes := countNodes(r.MST.Root)
	var stored int
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM repo_nodes WHERE did = $1", did.String()).Scan(&stored))
	require.Equal(t, nodes, stored, "repo_nodes must hold exactly the current tree's nodes")
}

func countNodes(n *mst.Node) int {
	if n == nil {
		return 0
	}
	total := 1
	for _, e := range n.Entries {
		total += countNodes(e.Child)
	}
	return total
}

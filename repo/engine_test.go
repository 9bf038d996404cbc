package repo

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/bluesky-social/indigo/atproto/atdata"
	atrepo "github.com/bluesky-social/indigo/atproto/repo"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/ipfs/go-cid"
	"github.com/ipld/go-car"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/limits"
)

func TestApplyCreateUpdateDelete(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, Config{})
	did := b.newRepo(t, 1)

	res, err := b.engine.Apply(ctx, did, []Write{create("app.bsky.feed.post", "", post("hello"))}, nil)
	require.NoError(t, err)
	require.Len(t, res.Results, 1)
	rkey := res.Results[0].RKey
	_, err = syntax.ParseTID(rkey.String())
	require.NoError(t, err, "create without rkey gets a TID")

	rec, err := b.engine.GetRecord(ctx, did, "app.bsky.feed.post", rkey)
	require.NoError(t, err)
	require.Equal(t, res.Results[0].CID, rec.CID)

	upd := Write{Action: ActionUpdate, Collection: "app.bsky.feed.post", RKey: rkey, Record: post("edited")}
	res2, err := b.engine.Apply(ctx, did, []Write{upd}, &res.Commit)
	require.NoError(t, err)
	require.Greater(t, res2.Rev, res.Rev)

	// An identical update stores nothing.
	same, err := b.engine.Apply(ctx, did, []Write{upd}, nil)
	require.NoError(t, err)
	require.Equal(t, res2.Commit, same.Commit)

	_, err = b.engine.Apply(ctx, did, []Write{{Action: ActionDelete, Collection: "app.bsky.feed.post", RKey: rkey}}, nil)
	require.NoError(t, err)
	_, err = b.engine.GetRecord(ctx, did, "app.bsky.feed.post", rkey)
	require.ErrorIs(t, err, ErrRecordNotFound)

	_, err = b.engine.Apply(ctx, did, []Write{{Action: ActionDelete, Collection: "app.bsky.feed.post", RKey: rkey}}, nil)
	require.ErrorIs(t, err, ErrRecordNotFound)

	evs := b.sequencedEvents(t)
	require.Len(t, evs, 4, "#sync at creation, then three commits")
	require.Equal(t, 3, b.verifyChain(t, evs)[did])
	b.exportMatchesIndex(t, did)
}

func TestSwaps(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, Config{})
	did := b.newRepo(t, 1)
	res, err := b.engine.Apply(ctx, did, []Write{create("app.bsky.feed.post", "a", post("a"))}, nil)
	require.NoError(t, err)
	before := b.counts(t)

	stale := res.Results[0].CID
	_, err = b.engine.Apply(ctx, did, []Write{create("app.bsky.feed.post", "b", post("b"))}, &stale)
	require.ErrorIs(t, err, ErrInvalidSwap, "swapCommit with a non-head CID")

	_, other, err := encodeRecord("x", "app.bsky.feed.post", post("other"))
	require.NoError(t, err)
	upd := Write{Action: ActionUpdate, Collection: "app.bsky.feed.post", RKey: "a", Record: post("a2"), SwapRecord: &Swap{CID: &other}}
	_, err = b.engine.Apply(ctx, did, []Write{upd}, nil)
	require.ErrorIs(t, err, ErrInvalidSwap, "swapRecord mismatch")

	mustNotExist := Write{Action: ActionUpdate, Collection: "app.bsky.feed.post", RKey: "a", Record: post("a3"), SwapRecord: &Swap{}}
	_, err = b.engine.Apply(ctx, did, []Write{mustNotExist}, nil)
	require.ErrorIs(t, err, ErrInvalidSwap, "swapRecord null on an existing record")

	_, err = b.engine.Apply(ctx, did, []Write{create("app.bsky.feed.post", "a", post("dup"))}, nil)
	require.ErrorIs(t, err, ErrRecordExists)
	require.Equal(t, before, b.counts(t), "refused writes leave nothing behind")

	good := Write{Action: ActionUpdate, Collection: "app.bsky.feed.post", RKey: "a", Record: post("a4"), SwapRecord: &Swap{CID: &stale}}
	_, err = b.engine.Apply(ctx, did, []Write{good}, &res.Commit)
	require.NoError(t, err)
}

func TestInvalidWrites(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, Config{})
	did := b.newRepo(t, 1)
	before := b.counts(t)
	cases := map[string]Write{
		"type mismatch": create("app.bsky.feed.post", "x", map[string]any{"$type": "app.bsky.feed.like"}),
		"no type":       create("app.bsky.feed.post", "x", map[string]any{"text": "x"}),
		"bad rkey":      create("app.bsky.feed.post", "..", post("x")),
		"bad nsid":      create("not an nsid", "x", post("x")),
		"update no key": {Action: ActionUpdate, Collection: "app.bsky.feed.post", Record: post("x")},
	}
	for name, w := range cases {
		_, err := b.engine.Apply(ctx, did, []Write{w}, nil)
		require.ErrorIs(t, err, ErrInvalidWrite, name)
	}
	_, err := b.engine.Apply(ctx, did, []Write{create("app.bsky.feed.post", "x", post("1")), create("app.bsky.feed.post", "x", post("2"))}, nil)
	require.ErrorIs(t, err, ErrInvalidWrite, "same path twice")
	_, err = b.engine.Apply(ctx, "did:plc:nobody", []Write{create("app.bsky.feed.post", "x", post("1"))}, nil)
	require.ErrorIs(t, err, ErrRepoNotFound)
	require.Equal(t, before, b.counts(t))
}

func TestLimits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, Config{})
	did := b.newRepo(t, 1)
	const coll = "com.example.blob"

	refused := func(name string, limit Limit, writes []Write) {
		t.Helper()
		before := b.counts(t)
		_, err := b.engine.Apply(ctx, did, writes, nil)
		var le *LimitError
		require.ErrorAs(t, err, &le, name)
		require.Equal(t, limit, le.Limit, name)
		require.ErrorIs(t, err, ErrLimitExceeded)
		require.Equal(t, before, b.counts(t), "%s: nothing stored", name)
		t.Logf("%s: %v", name, err)
	}

	// One record block: 1,000,000 accepted, 1,000,001 refused; a record over
	// the data model's 1 MiB is refused under that name.
	_, err := b.engine.Apply(ctx, did, []Write{create(coll, "max", sizedRecord(t, coll, limits.MaxRecordBlockBytes))}, nil)
	require.NoError(t, err)
	refused("record block +1", LimitRecordBlock, []Write{create(coll, "over", sizedRecord(t, coll, limits.MaxRecordBlockBytes+1))})
	refused("record cbor +1", LimitRecordCBOR, []Write{create(coll, "huge", sizedRecord(t, coll, limits.MaxRecordCBORBytes+1))})

	// Ops: 200 accepted, 201 and 0 refused.
	ops := func(n int, prefix string) []Write {
		w := make([]Write, n)
		for i := range w {
			w[i] = create("app.bsky.feed.post", fmt.Sprintf("%s%03d", prefix, i), post(fmt.Sprint(i)))
		}
		return w
	}
	_, err = b.engine.Apply(ctx, did, ops(limits.MaxCommitOps, "ok"), nil)
	require.NoError(t, err)
	refused("201 ops", LimitCommitOps, ops(limits.MaxCommitOps+1, "no"))
	refused("0 ops", LimitCommitOps, nil)

	// 50 × 60 KB is 3 MB of blocks: refused for the commit total.
	big := make([]Write, 50)
	for i := range big {
		big[i] = create(coll, fmt.Sprintf("big%02d", i), sizedRecord(t, coll, 60_000))
	}
	refused("50 x 60KB", LimitCommitBlocks, big)

	// The commit total at the limit: fill with records until the CAR is
	// exactly 2,000,000 bytes, then one byte more.
	atTotal := commitOfSize(t, b, did, coll, limits.MaxCommitBlocksBytes)
	refused("blocks +1", LimitCommitBlocks, commitOfSizeWrites(t, coll, atTotal, 1))
	_, err = b.engine.Apply(ctx, did, commitOfSizeWrites(t, coll, atTotal, 0), nil)
	require.NoError(t, err, "a commit of exactly %d bytes of blocks is accepted", limits.MaxCommitBlocksBytes)

	// Refused commits were rolled back on their connection (the engine
	// drives BEGIN/COMMIT itself), so the pool kept reusing one connection
	// instead of discarding one per refusal.
	var open int
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state LIKE 'idle in transaction%'").Scan(&open))
	require.Zero(t, open)
	require.LessOrEqual(t, b.pool.Stat().NewConnsCount(), int64(2), "a connection was dropped after a refused commit")

	evs := b.sequencedEvents(t)
	b.verifyChain(t, evs)
	for _, ev := range evs {
		require.LessOrEqual(t, ev.BlocksLen, limits.MaxCommitBlocksBytes)
		require.LessOrEqual(t, ev.FrameSize(), limits.MaxFrameBytes)
	}
}

// commitOfSize finds record sizes for a three-record commit whose CAR is
// exactly target bytes. A CAR's size is linear in its records' sizes (CIDs,
// revs and signatures have fixed lengths), so one refused probe, whose error
// reports the exact size, gives the answer.
func commitOfSize(t *testing.T, b *bundle, did syntax.DID, coll string, target int) [3]int {
	t.Helper()
	probe := [3]int{993_000, 993_000, 15_000}
	_, err := b.engine.Apply(context.Background(), did, commitOfSizeWrites(t, coll, probe, 0), nil)
	var le *LimitError
	require.ErrorAs(t, err, &le)
	probe[2] -= le.Size - target
	require.Greater(t, probe[2], 1_000, "probe too small to adjust")
	return probe
}

func commitOfSizeWrites(t *testing.T, coll string, sizes [3]int, extra int) []Write {
	return []Write{
		create(coll, "fill-a", sizedRecord(t, coll, sizes[0])),
		create(coll, "fill-b", sizedRecord(t, coll, sizes[1])),
		create(coll, "fill-c", sizedRecord(t, coll, sizes[2]+extra)),
	}
}

func TestConcurrentWritersOneRepo(t *testing.T) {
	t.Parallel()
	writers, each := 8, 500
	if testing.Short() {
		each = 50
	}
	b := setup(t, Config{})
	did := b.newRepo(t, 1)
	acked := runWriters(t, b, []syntax.DID{did}, writers, each)
	require.Len(t, acked[did], writers*each)
	checkFinalState(t, b, acked)
}

func TestConcurrentWritersManyRepos(t *testing.T) {
	t.Parallel()
	repos, each := 16, 100
	if testing.Short() {
		each = 20
	}
	b := setup(t, Config{CacheBytes: 1 << 20})
	dids := make([]syntax.DID, repos)
	for i := range dids {
		dids[i] = b.newRepo(t, i)
	}
	acked := runWriters(t, b, dids, repos, each)
	checkFinalState(t, b, acked)
}

// runWriters runs writers goroutines creating each records (writer i on
// dids[i%len(dids)]), with the sequencer running and a reader polling the
// log the whole time; it checks the reader saw strictly increasing seqs and,
// at the end, every event. It returns the acknowledged paths per repo.
func runWriters(t *testing.T, b *bundle, dids []syntax.DID, writers, each int) map[syntax.DID]map[string]bool {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b.engine.waker = b.seq
	go b.seq.Run(ctx)

	var mu sync.Mutex
	acked := map[syntax.DID]map[string]bool{}
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			did := dids[w%len(dids)]
			for i := range each {
				res, err := b.engine.Apply(ctx, did, []Write{create("app.bsky.feed.post", "", post(fmt.Sprintf("w%d-%d", w, i)))}, nil)
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				if acked[did] == nil {
					acked[did] = map[string]bool{}
				}
				acked[did]["app.bsky.feed.post/"+res.Results[0].RKey.String()] = true
				mu.Unlock()
			}
		}()
	}
	done := make(chan struct{})
	var seen []int64
	go func() {
		defer close(done)
		var after int64
		for {
			page, err := b.log.After(context.Background(), after, 200)
			if err != nil {
				return
			}
			for _, ev := range page {
				seen = append(seen, ev.Seq)
				after = ev.Seq
			}
			if len(page) == 0 && ctx.Err() != nil {
				return
			}
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	// Let the sequencer drain, then stop the reader.
	all := b.sequencedEvents(t)
	cancel()
	<-done
	for i := 1; i < len(seen); i++ {
		require.Greater(t, seen[i], seen[i-1], "the polling reader saw seqs out of order")
	}
	// The poller stopped at some point; everything it saw must be a prefix
	// of the full log, with nothing skipped.
	for i, s := range seen {
		require.Equal(t, all[i].Seq, s, "the polling reader skipped an event")
	}
	total := 0
	for _, d := range dids {
		total += len(acked[d])
	}
	commits := b.verifyChain(t, all)
	n := 0
	for _, c := range commits {
		n += c
	}
	require.Equal(t, total, n, "one event per acknowledged write")
	return acked
}

func checkFinalState(t *testing.T, b *bundle, acked map[syntax.DID]map[string]bool) {
	ctx := context.Background()
	for did, paths := range acked {
		var buf bytes.Buffer
		require.NoError(t, b.engine.ExportCAR(ctx, did, "", &buf))
		_, r, err := atrepo.LoadRepoFromCAR(ctx, &buf)
		require.NoError(t, err)
		inTree := map[string]bool{}
		require.NoError(t, r.MST.Walk(func(k []byte, _ cid.Cid) error { inTree[string(k)] = true; return nil }))
		require.Equal(t, paths, inTree, "every acknowledged write is in the final MST")
		b.exportMatchesIndex(t, did)
	}
}

// TestRandomOpsKeepStoreExact mixes creates, updates and deletes (so MST
// nodes split and merge) and checks after each batch that the stored nodes
// are exactly the tree's, through the cache and without it.
func TestRandomOpsKeepStoreExact(t *testing.T) {
	t.Parallel()
	for _, cacheBytes := range []int64{1, 64 << 20} {
		t.Run(fmt.Sprint("cache=", cacheBytes), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := setup(t, Config{CacheBytes: cacheBytes})
			did := b.newRepo(t, 1)
			rng := rand.New(rand.NewPCG(1, uint64(cacheBytes)))
			live := map[string]bool{}
			for round := range 30 {
				var writes []Write
				used := map[string]bool{}
				for range 1 + rng.IntN(20) {
					k := fmt.Sprintf("k%04d", rng.IntN(300))
					if used[k] {
						continue
					}
					used[k] = true
					switch {
					case !live[k]:
						writes = append(writes, create("app.bsky.feed.post", k, post(fmt.Sprint(round))))
						live[k] = true
					case rng.IntN(2) == 0:
						writes = append(writes, Write{Action: ActionDelete, Collection: "app.bsky.feed.post", RKey: syntax.RecordKey(k)})
						delete(live, k)
					default:
						writes = append(writes, Write{Action: ActionUpdate, Collection: "app.bsky.feed.post", RKey: syntax.RecordKey(k), Record: post(fmt.Sprint("u", round))})
					}
				}
				_, err := b.engine.Apply(ctx, did, writes, nil)
				require.NoError(t, err)
				b.exportMatchesIndex(t, did)
			}
			b.verifyChain(t, b.sequencedEvents(t))
		})
	}
}

func TestProofCAR(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, Config{})
	did := b.newRepo(t, 1)
	var writes []Write
	for i := range 150 {
		writes = append(writes, create("app.bsky.feed.post", fmt.Sprintf("p%03d", i), post(fmt.Sprint(i))))
	}
	res, err := b.engine.Apply(ctx, did, writes, nil)
	require.NoError(t, err)
	pub, err := b.keys.keys[did].PublicKey()
	require.NoError(t, err)

	for _, r := range res.Results[:10] {
		proof, err := b.engine.ProofCAR(ctx, did, r.Collection, r.RKey)
		require.NoError(t, err)
		commit, repo, err := atrepo.LoadRepoFromCAR(ctx, bytes.NewReader(proof))
		require.NoError(t, err)
		require.NoError(t, commit.VerifySignature(pub))
		require.True(t, repo.MST.IsPartial(), "a proof holds a path, not the whole tree")
		got, err := repo.GetRecordCID(ctx, r.Collection, r.RKey)
		require.NoError(t, err)
		require.Equal(t, r.CID, *got)
		_, _, err = repo.GetRecordBytes(ctx, r.Collection, r.RKey)
		require.NoError(t, err, "the record block is in the proof")
	}
	// Absence: the path proves the key is not there.
	proof, err := b.engine.ProofCAR(ctx, did, "app.bsky.feed.post", "p999")
	require.NoError(t, err)
	_, repo, err := atrepo.LoadRepoFromCAR(ctx, bytes.NewReader(proof))
	require.NoError(t, err)
	got, err := repo.GetRecordCID(ctx, "app.bsky.feed.post", "p999")
	require.ErrorIs(t, err, atrepo.ErrNotFound, "the proof shows the key is absent")
	require.Nil(t, got)
}

func TestExportSince(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, Config{})
	did := b.newRepo(t, 1)
	first, err := b.engine.Apply(ctx, did, []Write{create("app.bsky.feed.post", "a", post("a"))}, nil)
	require.NoError(t, err)
	_, err = b.engine.Apply(ctx, did, []Write{create("app.bsky.feed.post", "b", post("b"))}, nil)
	require.NoError(t, err)
	var buf bytes.Buffer
	require.NoError(t, b.engine.ExportCAR(ctx, did, first.Rev, &buf))
	blocks := carBlocks(t, buf.Bytes())
	rec, err := b.engine.GetRecord(ctx, did, "app.bsky.feed.post", "b")
	require.NoError(t, err)
	old, err := b.engine.GetRecord(ctx, did, "app.bsky.feed.post", "a")
	require.NoError(t, err)
	require.Contains(t, blocks, rec.CID.String())
	require.NotContains(t, blocks, old.CID.String(), "blocks from before since are left out")
}

func carBlocks(t *testing.T, data []byte) map[string]bool {
	t.Helper()
	cr, err := car.NewCarReader(bytes.NewReader(data))
	require.NoError(t, err)
	out := map[string]bool{}
	for {
		blk, err := cr.Next()
		if err == io.EOF {
			return out
		}
		require.NoError(t, err)
		out[blk.Cid().String()] = true
	}
}

// TestRecordDataModel checks records parsed from JSON with blobs and links
// are accepted, and data outside the data model (floats) refused.
func TestRecordDataModel(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, Config{})
	did := b.newRepo(t, 1)
	rec, err := atdata.UnmarshalJSON([]byte(`{"$type":"app.bsky.feed.post","text":"img","createdAt":"2026-11-29T00:00:00Z",
		"embed":{"$type":"app.bsky.embed.images","images":[{"alt":"","image":{"$type":"blob","ref":{"$link":"bafkreibme22gw2h7y2h7tg2fhqotaqjucnbc24deqo72b6mkl2egezxhvy"},"mimeType":"image/png","size":1234}}]},
		"link":{"$link":"bafyreihrc63342qcxx3ecernuq7pyngzrmhjv23svuxgh6ieimy5zepjkq"}}`))
	require.NoError(t, err)
	_, err = b.engine.Apply(ctx, did, []Write{create("app.bsky.feed.post", "withblob", rec)}, nil)
	require.NoError(t, err)

	before := b.counts(t)
	_, err = b.engine.Apply(ctx, did, []Write{create("app.bsky.feed.post", "float", map[string]any{"$type": "app.bsky.feed.post", "n": 1.5})}, nil)
	require.ErrorIs(t, err, ErrInvalidWrite)
	require.Equal(t, before, b.counts(t))
}

// TestTwoEnginesOneRepo alternates writes to one repo between two engines
// (two processes, each with its own tree cache): each engine's cached tree
// is stale after the other wrote, so its one-round-trip commit must be
// refused by the database and redone from the stored root.
func TestTwoEnginesOneRepo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, Config{})
	did := b.newRepo(t, 1)
	engines := []*Engine{b.engine, New(b.pool, b.keys, nil, Config{counters: newCounters()})}
	want := map[string]bool{}
	for i := range 20 {
		// Two writes in a row per engine: the second takes the fast path.
		e := engines[(i/2)%2]
		res, err := e.Apply(ctx, did, []Write{create("app.bsky.feed.post", "", post(fmt.Sprint(i)))}, nil)
		require.NoError(t, err)
		want["app.bsky.feed.post/"+res.Results[0].RKey.String()] = true
	}
	checkFinalState(t, b, map[syntax.DID]map[string]bool{did: want})
	require.Equal(t, 20, b.verifyChain(t, b.sequencedEvents(t))[did])
	for i, e := range engines {
		require.Positive(t, e.fastCommits.Load(), "engine %d never took the one-round-trip path", i)
		require.Positive(t, counterValue(t, e.counters.staleRoots), "engine %d never had a stale root refused", i)
	}
}

// A commit built on the cached tree inserts its MST nodes without ON
// CONFLICT; if one is stored after all (a row the cache does not know
// of), the insert fails, nothing is stored, and the commit is redone on
// the locked path.
func TestStrayNodeSendsCommitToLockedPath(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, Config{})
	did := b.newRepo(t, 1)
	rec := post("same record, same CID")
	_, err := b.engine.Apply(ctx, did, []Write{create("app.bsky.feed.post", "a", post("first"))}, nil)
	require.NoError(t, err)

	// The nodes a create of "b" writes, seen once, then taken away again.
	res, err := b.engine.Apply(ctx, did, []Write{create("app.bsky.feed.post", "b", rec)}, nil)
	require.NoError(t, err)
	var cids, data [][]byte
	rows, err := b.pool.Query(ctx, "SELECT cid, data FROM repo_nodes WHERE did = $1 AND rev = $2", did.String(), res.Rev)
	require.NoError(t, err)
	for rows.Next() {
		var c, d []byte
		require.NoError(t, rows.Scan(&c, &d))
		cids, data = append(cids, c), append(data, d)
	}
	require.NoError(t, rows.Err())
	require.NotEmpty(t, cids)
	_, err = b.engine.Apply(ctx, did, []Write{{Action: ActionDelete, Collection: "app.bsky.feed.post", RKey: "b"}}, nil)
	require.NoError(t, err)

	// One of them comes back behind the engine's back.
	_, err = b.pool.Exec(ctx, "INSERT INTO repo_nodes (did, cid, rev, data) VALUES ($1, $2, 'stray', $3)", did.String(), cids[0], data[0])
	require.NoError(t, err)
	stale := counterValue(t, b.engine.counters.staleRoots)
	_, err = b.engine.Apply(ctx, did, []Write{create("app.bsky.feed.post", "b", rec)}, nil)
	require.NoError(t, err)
	require.Equal(t, stale+1, counterValue(t, b.engine.counters.staleRoots), "the one-round-trip commit was not refused")
	checkFinalState(t, b, map[syntax.DID]map[string]bool{did: {"app.bsky.feed.post/a": true, "app.bsky.feed.post/b": true}})
	require.Equal(t, 4, b.verifyChain(t, b.sequencedEvents(t))[did])
}

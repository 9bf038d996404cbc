package repo

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"testing"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/atcrypto"
	atrepo "github.com/bluesky-social/indigo/atproto/repo"
	"github.com/bluesky-social/indigo/atproto/syntax"
	lexutil "github.com/bluesky-social/indigo/lex/util"
	"github.com/ipfs/go-cid"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/cluster"
)

// hintMesh delivers each engine's hints to the others at once, in
// process, as a LAN delivers them before the client's next request
// arrives; keep, when set, decides which hints arrive and may alter them.
type hintMesh struct {
	mu      sync.Mutex
	engines []*Engine
	sent    int
	keep    func(n int, payload []byte) []byte
}

type meshSender struct {
	m    *hintMesh
	from *Engine
}

func (meshSender) Poll() {}

func (s meshSender) Send(payload []byte) bool {
	if len(payload) > cluster.MaxHintPayload {
		return false
	}
	s.m.mu.Lock()
	s.m.sent++
	n := s.m.sent
	s.m.mu.Unlock()
	if s.m.keep != nil {
		if payload = s.m.keep(n, append([]byte(nil), payload...)); payload == nil {
			return true // lost
		}
	}
	for _, e := range s.m.engines {
		if e != s.from {
			e.ReceiveHint(payload)
		}
	}
	return true
}

func newHintMesh(b *bundle, n int, keep func(int, []byte) []byte) *hintMesh {
	m := &hintMesh{keep: keep, engines: []*Engine{b.engine}}
	for len(m.engines) < n {
		m.engines = append(m.engines, New(b.pool, b.keys, nil, Config{counters: newCounters()}))
	}
	for _, e := range m.engines {
		e.SetHintSender(meshSender{m: m, from: e})
	}
	return m
}

func hintsApplied(t *testing.T, engines []*Engine) float64 {
	var n float64
	for _, e := range engines {
		n += counterValue(t, e.counters.hints.WithLabelValues("applied"))
	}
	return n
}

// mixedWrite is the i-th write of a round: creates, updates of the
// records created and deletes of some, so hints carry every action.
func mixedWrite(i int) []Write {
	rkey := func(j int) syntax.RecordKey { return syntax.RecordKey(fmt.Sprintf("r%04d", j)) }
	switch {
	case i%5 == 3:
		return []Write{{Action: ActionUpdate, Collection: "app.bsky.feed.post", RKey: rkey(i - 1), Record: post(fmt.Sprint("updated ", i))}}
	case i%5 == 4:
		return []Write{{Action: ActionDelete, Collection: "app.bsky.feed.post", RKey: rkey(i - 2)},
			create("app.bsky.feed.post", string(rkey(i)), post(fmt.Sprint(i)))}
	default:
		return []Write{create("app.bsky.feed.post", string(rkey(i)), post(fmt.Sprint(i)))}
	}
}

// TestRoundRobinWithHintsReadsNothing: with every commit hinted to the
// other engines, writes to one repository spread over three engines in
// turn find each engine's cached tree already current: no commit asks
// the database whether the repository moved, none is refused, each is
// worked out once, and every cached tree is exactly the stored one.
// Creates, updates and deletes are all hinted.
func TestRoundRobinWithHintsReadsNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, Config{})
	m := newHintMesh(b, 3, nil)
	did := b.newRepo(t, 1)
	write := func(i int) {
		e := m.engines[i%len(m.engines)]
		_, err := e.Apply(ctx, did, mixedWrite(i), nil)
		require.NoError(t, err, "write %d", i)
		requireCacheExact(t, b, e, did)
	}
	// Each engine loads the tree, then finds another wrote to it: from
	// then on each hints its commits.
	warm := 2 * len(m.engines)
	for i := range warm {
		write(i)
	}
	before, applied := sumCounts(t, m.engines), hintsApplied(t, m.engines)
	const commits = 40
	for i := warm; i < warm+commits; i++ {
		write(i)
	}
	d := sumCounts(t, m.engines)
	require.Zero(t, d.checks-before.checks, "roots read before a commit")
	require.Zero(t, d.stale-before.stale, "commits refused for a moved root")
	require.Equal(t, float64(commits), d.plans-before.plans, "commits worked out more than once")
	require.Equal(t, float64(commits), hintsApplied(t, m.engines)-applied, "cached trees caught up from hints")
	b.exportMatchesIndex(t, did)
	require.Equal(t, commits+warm, b.verifyChain(t, b.sequencedEvents(t))[did])
}

// TestHintsLostOrWrong: hints are only hints. With some lost, some
// carrying a wrong record CID and some a wrong root, every write still
// succeeds and stores exactly what it would have without hints: a wrong
// hint never makes a tree the database does not have, a lost one costs a
// read or a refused commit.
func TestHintsLostOrWrong(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, Config{})
	bogus := cid.MustParse("bafyreie5737gdxlw5i64vzichcalba3z2v5n6icifvx5xytvske7mr3hpm")
	m := newHintMesh(b, 3, func(n int, payload []byte) []byte {
		switch n % 4 {
		case 0:
			return nil // lost
		case 1:
			return rewriteHintOps(t, payload, func(ops []sinceRecord) []sinceRecord {
				if ops[0].cid.Defined() {
					ops[0].cid = bogus // a wrong record
				}
				return ops
			})
		case 2:
			return rewriteHintOps(t, payload, func(ops []sinceRecord) []sinceRecord {
				return append(ops, sinceRecord{path: "app.bsky.feed.post/zzzz", cid: bogus}) // one op too many
			})
		}
		return payload
	})
	did := b.newRepo(t, 1)
	const commits = 60
	for i := range commits {
		e := m.engines[i%len(m.engines)]
		_, err := e.Apply(ctx, did, mixedWrite(i), nil)
		require.NoError(t, err, "write %d", i)
		requireCacheExact(t, b, e, did)
	}
	d := sumCounts(t, m.engines)
	require.Positive(t, d.checks+d.stale, "lost and wrong hints cost reads or refusals")
	require.Positive(t, hintsApplied(t, m.engines), "the good hints were used")
	b.exportMatchesIndex(t, did)
	require.Equal(t, commits, b.verifyChain(t, b.sequencedEvents(t))[did])
}

// TestDecodeHintRefusesMalformed: every truncation and every single-byte
// change of a hint's payload is either refused or decodes to a hint whose
// fields are well formed; none panics.
func TestDecodeHintRefusesMalformed(t *testing.T) {
	t.Parallel()
	key, err := atcrypto.GeneratePrivateKeyK256()
	require.NoError(t, err)
	c1 := cid.MustParse("bafyreie5737gdxlw5i64vzichcalba3z2v5n6icifvx5xytvske7mr3hpm")
	commit, block, err := signCommit("did:plc:abc", c1, "3kabcdefghij2", key)
	require.NoError(t, err)
	res := &CommitResult{moved: &movedFrom{prev: c1, commitBlock: block}}
	res.moved.ops = opsOf(t, []sinceRecord{{path: "app.bsky.feed.post/a", cid: c1}, {path: "app.bsky.feed.post/b"}})
	payload := encodeHint("did:plc:abc", res, false)
	did, h, err := decodeHint(payload)
	require.NoError(t, err)
	require.Equal(t, "did:plc:abc", did)
	require.Equal(t, commit, h.commit)
	require.Equal(t, c1, h.data)
	require.Equal(t, "3kabcdefghij2", h.rev)
	require.Equal(t, []sinceRecord{{path: "app.bsky.feed.post/a", cid: c1}, {path: "app.bsky.feed.post/b"}}, h.ops)
	for n := range len(payload) {
		_, _, err := decodeHint(payload[:n])
		require.Error(t, err, "truncated to %d bytes", n)
	}
	for i := range payload {
		for _, x := range []byte{0x01, 0x80, 0xff} {
			bad := append([]byte(nil), payload...)
			bad[i] ^= x
			if did, h, err := decodeHint(bad); err == nil {
				require.NotEmpty(t, did)
				require.NotEmpty(t, h.rev)
			}
		}
	}
	_, _, err = decodeHint(encodeHint("did:plc:other", res, false))
	require.Error(t, err, "a commit of another DID")
	_, h, err = decodeHint(encodeHint("did:plc:abc", res, true))
	require.NoError(t, err)
	require.True(t, h.noOps)
	many := make([]sinceRecord, maxHintOps+1)
	for i := range many {
		many[i] = sinceRecord{path: fmt.Sprintf("app.bsky.feed.post/%d", i), cid: c1}
	}
	res.moved.ops = opsOf(t, many)
	_, h, err = decodeHint(encodeHint("did:plc:abc", res, false))
	require.NoError(t, err)
	require.True(t, h.noOps, "a hint of more than maxHintOps operations goes without them")
}

func appendUvarint(b []byte, n int) []byte { return binary.AppendUvarint(b, uint64(n)) }

// opsOf are a commit's operations for rs (an undefined CID: a delete).
func opsOf(t *testing.T, rs []sinceRecord) []*comatproto.SyncSubscribeRepos_RepoOp {
	t.Helper()
	out := make([]*comatproto.SyncSubscribeRepos_RepoOp, len(rs))
	for i, r := range rs {
		op := &comatproto.SyncSubscribeRepos_RepoOp{Path: r.path, Action: "delete"}
		if r.cid.Defined() {
			l := lexutil.LexLink(r.cid)
			op.Cid, op.Action = &l, "create"
		}
		out[i] = op
	}
	return out
}

// TestHintsLetGoOfTreesWrittenElsewhere: a repository other engines keep
// committing to while this one does not write to it is let go (its cached
// tree and hints dropped) once it has more than maxHintsPerRepo hints, so
// hints cost a node memory only for the repositories it writes.
func TestHintsLetGoOfTreesWrittenElsewhere(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, Config{})
	m := newHintMesh(b, 3, nil)
	did := b.newRepo(t, 1)
	idle, busy := m.engines[0], m.engines[1:]
	apply := func(e *Engine, i int) {
		_, err := e.Apply(ctx, did, mixedWrite(i), nil)
		require.NoError(t, err)
	}
	i := 0
	for ; i < 2*len(m.engines); i++ {
		apply(m.engines[i%len(m.engines)], i)
	}
	apply(idle, i)
	i++
	// The other two go on writing, in turn, hinting each other and idle.
	for range maxHintsPerRepo {
		apply(busy[i%2], i)
		i++
	}
	require.True(t, idle.cache.has(did.String()), "let go too early")
	apply(busy[i%2], i)
	i++
	require.False(t, idle.cache.has(did.String()), "a tree written elsewhere is kept")
	require.Empty(t, idle.takeHints(did.String()))
	require.Equal(t, float64(1), counterValue(t, idle.counters.hints.WithLabelValues("dropped")))
	// Writing to it again loads it and works.
	apply(idle, i)
	requireCacheExact(t, b, idle, did)
}

// rewriteHintOps re-encodes a hint's payload with its operations changed
// by change.
func rewriteHintOps(t *testing.T, payload []byte, change func([]sinceRecord) []sinceRecord) []byte {
	t.Helper()
	_, h, err := decodeHint(payload)
	require.NoError(t, err)
	if h.noOps {
		return payload
	}
	r := &hintReader{b: payload[2:]}
	r.field()
	r.field()
	r.field()
	require.NoError(t, r.err)
	out := append([]byte(nil), payload[:len(payload)-len(r.b)]...)
	ops := change(h.ops)
	out = appendUvarint(out, len(ops))
	for _, op := range ops {
		out = appendField(out, []byte(op.path))
		var c []byte
		if op.cid.Defined() {
			c = op.cid.Bytes()
		}
		out = appendField(out, c)
	}
	return out
}

// TestLyingHintIsNeverStored: a hint with a valid encoding that lies (a
// commit block of its own, signed by another key, whose tree adds a
// record never stored, with a rev far in the future) is followed by the
// cached tree, but the commit built on it names a commit the database
// does not have: it is refused, and the write goes through on the real
// tree. Nothing of the lie is stored or sent on the firehose; a hint
// whose commit is its own predecessor is refused as malformed.
func TestLyingHintIsNeverStored(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, Config{})
	m := newHintMesh(b, 2, nil)
	did := b.newRepo(t, 1)
	writer, victim := m.engines[0], m.engines[1]
	for i := range 4 {
		_, err := []*Engine{writer, victim}[i%2].Apply(ctx, did, mixedWrite(i), nil)
		require.NoError(t, err)
	}
	head, err := victim.GetHead(ctx, did)
	require.NoError(t, err)

	// The lie: the victim's tree plus a record, under a commit of its own.
	st := victim.cache.takeAny(did.String())
	require.NotNil(t, st)
	evil := cid.MustParse("bafyreie5737gdxlw5i64vzichcalba3z2v5n6icifvx5xytvske7mr3hpm")
	_, err = atrepo.ApplyOp(st.tree, "app.bsky.feed.post/evil", &evil)
	require.NoError(t, err)
	root, err := st.tree.RootCID()
	require.NoError(t, err)
	_, err = atrepo.ApplyOp(st.tree, "app.bsky.feed.post/evil", nil)
	require.NoError(t, err)
	_, err = st.tree.RootCID()
	require.NoError(t, err)
	victim.cache.put(st)
	key, err := atcrypto.GeneratePrivateKeyK256()
	require.NoError(t, err)
	_, block, err := signCommit(did, *root, "7zzzzzzzzzzzz", key)
	require.NoError(t, err)
	lie := &CommitResult{moved: &movedFrom{prev: head.Commit, commitBlock: block,
		ops: opsOf(t, []sinceRecord{{path: "app.bsky.feed.post/evil", cid: evil}})}}
	kept, applied := counterValue(t, victim.counters.hints.WithLabelValues("kept")), counterValue(t, victim.counters.hints.WithLabelValues("applied"))
	victim.ReceiveHint(encodeHint(did.String(), lie, false))
	require.Equal(t, kept+1, counterValue(t, victim.counters.hints.WithLabelValues("kept")))

	_, err = victim.Apply(ctx, did, mixedWrite(4), nil)
	require.NoError(t, err)
	require.Equal(t, applied+1, counterValue(t, victim.counters.hints.WithLabelValues("applied")), "the lie was followed")
	requireCacheExact(t, b, victim, did)
	got, err := victim.GetHead(ctx, did)
	require.NoError(t, err)
	require.Less(t, got.Rev, "7zzzzzzzzzzzz", "the lie's rev was stored")
	_, err = victim.GetRecord(ctx, did, "app.bsky.feed.post", "evil")
	require.ErrorIs(t, err, ErrRecordNotFound)
	b.exportMatchesIndex(t, did)
	require.Equal(t, 5, b.verifyChain(t, b.sequencedEvents(t))[did])

	// Its own predecessor: malformed.
	c, _ := cidBuilder.Sum(block)
	self := &CommitResult{moved: &movedFrom{prev: c, commitBlock: block}}
	_, _, err = decodeHint(encodeHint(did.String(), self, true))
	require.Error(t, err)
}

// TestHintsSentAgainAreIgnored: a hint received again (a datagram
// replayed) is not kept twice while it waits, and not kept at all once
// the cached tree has its commit, so replays cannot make a node let go
// of a tree.
func TestHintsSentAgainAreIgnored(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, Config{})
	var last []byte
	m := newHintMesh(b, 2, func(_ int, payload []byte) []byte { last = payload; return payload })
	did := b.newRepo(t, 1)
	a, v := m.engines[0], m.engines[1]
	for i := range 2 {
		_, err := []*Engine{a, v}[i%2].Apply(ctx, did, mixedWrite(i), nil)
		require.NoError(t, err)
	}
	_, err := a.Apply(ctx, did, mixedWrite(2), nil)
	require.NoError(t, err)
	for range 2 * maxHintsPerRepo {
		v.ReceiveHint(last)
	}
	require.Equal(t, float64(2*maxHintsPerRepo), counterValue(t, v.counters.hints.WithLabelValues("duplicate")))
	require.Zero(t, counterValue(t, v.counters.hints.WithLabelValues("dropped")))
	require.True(t, v.cache.has(did.String()))
	_, err = v.Apply(ctx, did, mixedWrite(3), nil)
	require.NoError(t, err)
	v.ReceiveHint(last)
	require.Equal(t, float64(1), counterValue(t, v.counters.hints.WithLabelValues("old")))
	requireCacheExact(t, b, v, did)
}

// TestHintsOnlyOfSharedRepos: a repository written by one engine alone is
// never hinted; once another engine writes to it too, both hint their
// commits, and once the writes stay on one engine again, its hints stop
// after hintsAfterMove commits.
func TestHintsOnlyOfSharedRepos(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, Config{})
	m := newHintMesh(b, 2, nil)
	did := b.newRepo(t, 1)
	a, other := m.engines[0], m.engines[1]
	sent := func() int { m.mu.Lock(); defer m.mu.Unlock(); return m.sent }
	i := 0
	apply := func(e *Engine) {
		_, err := e.Apply(ctx, did, mixedWrite(i), nil)
		require.NoError(t, err)
		i++
	}
	for range 20 {
		apply(a)
	}
	require.Zero(t, sent(), "a repository written by one engine was hinted")
	apply(other) // loads the tree: nothing tells it another engine wrote
	apply(a)     // refused, caught up: from now on a hints
	apply(other) // follows a's hint, hints its own
	apply(a)     // follows other's
	require.Equal(t, 3, sent())
	for range 3 * hintsAfterMove {
		apply(a)
	}
	require.Equal(t, 3+hintsAfterMove-1, sent(), "hints go on where writes stay on one engine")
	requireCacheExact(t, b, a, did)
}

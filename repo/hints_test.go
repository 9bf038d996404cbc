package repo

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"testing"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/syntax"
	lexutil "github.com/bluesky-social/indigo/lex/util"
	"github.com/ipfs/go-cid"
	"github.com/stretchr/testify/require"
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

func (s meshSender) Send(payload []byte) {
	s.m.mu.Lock()
	s.m.sent++
	n := s.m.sent
	s.m.mu.Unlock()
	if s.m.keep != nil {
		if payload = s.m.keep(n, append([]byte(nil), payload...)); payload == nil {
			return
		}
	}
	for _, e := range s.m.engines {
		if e != s.from {
			e.ReceiveHint(payload)
		}
	}
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
	// Each engine loads the tree once.
	for i := range len(m.engines) {
		write(i)
	}
	before, applied := sumCounts(t, m.engines), hintsApplied(t, m.engines)
	const commits = 40
	for i := len(m.engines); i < len(m.engines)+commits; i++ {
		write(i)
	}
	d := sumCounts(t, m.engines)
	require.Zero(t, d.checks-before.checks, "roots read before a commit")
	require.Zero(t, d.stale-before.stale, "commits refused for a moved root")
	require.Equal(t, float64(commits), d.plans-before.plans, "commits worked out more than once")
	require.Equal(t, float64(commits), hintsApplied(t, m.engines)-applied, "cached trees caught up from hints")
	b.exportMatchesIndex(t, did)
	require.Equal(t, commits+len(m.engines), b.verifyChain(t, b.sequencedEvents(t))[did])
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
		did, h, err := decodeHint(payload)
		require.NoError(t, err)
		switch n % 4 {
		case 0:
			return nil // lost
		case 1:
			if len(h.ops) > 0 && h.ops[0].cid.Defined() {
				h.ops[0].cid = bogus // a wrong record
			}
		case 2:
			h.data = bogus // a wrong root
		}
		res := &CommitResult{Commit: h.commit, Rev: h.rev, moved: &movedFrom{prev: h.prev, data: h.data}}
		out := encodeHint(did, res, true)
		if len(h.ops) == 0 {
			return out
		}
		// Re-encode with the (altered) operations.
		out[1] = 0
		out = appendUvarint(out, len(h.ops))
		for _, op := range h.ops {
			out = appendField(out, []byte(op.path))
			var c []byte
			if op.cid.Defined() {
				c = op.cid.Bytes()
			}
			out = appendField(out, c)
		}
		return out
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
	c1 := cid.MustParse("bafyreie5737gdxlw5i64vzichcalba3z2v5n6icifvx5xytvske7mr3hpm")
	rc := c1
	res := &CommitResult{Commit: c1, Rev: "3kabcdefghij2", moved: &movedFrom{prev: c1, data: c1}}
	res.moved.ops = opsOf(t, []sinceRecord{{path: "app.bsky.feed.post/a", cid: rc}, {path: "app.bsky.feed.post/b"}})
	payload := encodeHint("did:plc:abc", res, false)
	did, h, err := decodeHint(payload)
	require.NoError(t, err)
	require.Equal(t, "did:plc:abc", did)
	require.Equal(t, []sinceRecord{{path: "app.bsky.feed.post/a", cid: rc}, {path: "app.bsky.feed.post/b"}}, h.ops)
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
	_, h, err = decodeHint(encodeHint("did:plc:abc", res, true))
	require.NoError(t, err)
	require.True(t, h.noOps)
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
	m := newHintMesh(b, 2, nil)
	did := b.newRepo(t, 1)
	idle, busy := m.engines[0], m.engines[1]
	_, err := idle.Apply(ctx, did, mixedWrite(0), nil)
	require.NoError(t, err)
	for i := 1; i <= maxHintsPerRepo; i++ {
		_, err := busy.Apply(ctx, did, mixedWrite(i), nil)
		require.NoError(t, err)
	}
	require.True(t, idle.cache.has(did.String()), "let go too early")
	_, err = busy.Apply(ctx, did, mixedWrite(maxHintsPerRepo+1), nil)
	require.NoError(t, err)
	require.False(t, idle.cache.has(did.String()), "a tree written elsewhere is kept")
	require.Empty(t, idle.takeHints(did.String()))
	require.Equal(t, float64(1), counterValue(t, idle.counters.hints.WithLabelValues("dropped")))
	// Writing to it again loads it and works.
	_, err = idle.Apply(ctx, did, mixedWrite(maxHintsPerRepo+2), nil)
	require.NoError(t, err)
	requireCacheExact(t, b, idle, did)
}

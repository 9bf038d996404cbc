package repo

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/eventlog"
)

// groupMember plans one create on did from the engine's cached tree and
// returns it as a commit waiting to be stored, with the finish that brings
// the cache up to date once it is.
func groupMember(t *testing.T, b *bundle, did syntax.DID, guard *Guard) (*pendingCommit, *commitPlan, *repoState) {
	t.Helper()
	ctx := context.Background()
	st := b.engine.cache.takeAny(did.String())
	require.NotNil(t, st, "tree of %s not cached", did)
	prepared, err := b.engine.prepare([]Write{create("app.bsky.feed.post", "", post("grouped"))})
	require.NoError(t, err)
	key, err := b.keys.SigningKey(ctx, did)
	require.NoError(t, err)
	p, err := b.engine.plan(ctx, st, did, key, prepared)
	require.NoError(t, err)
	p.params.oldRev = st.rev
	return &pendingCommit{guard: guard, params: p.params, done: make(chan struct{}), lead: make(chan struct{}, 1)}, p, st
}

// A group whose member is refused (a guard that raises) is rolled back
// whole and stored commit by commit: the refused one gets its own error,
// a member whose root another engine moved stores nothing and gets what
// its cache lacks, the others are stored.
func TestGroupWithRefusedMembers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, Config{})
	other := New(b.pool, b.keys, nil, Config{})
	dids := make([]syntax.DID, 5)
	for i := range dids {
		dids[i] = b.newRepo(t, i)
		_, err := b.engine.Apply(ctx, dids[i], []Write{create("app.bsky.feed.post", "", post("warm"))}, nil)
		require.NoError(t, err)
	}
	// dids[1] moves on behind the engine's back; dids[3]'s guard refuses.
	_, err := other.Apply(ctx, dids[1], []Write{create("app.bsky.feed.post", "", post("elsewhere"))}, nil)
	require.NoError(t, err)
	refuse := &Guard{SQL: `DO $$BEGIN RAISE EXCEPTION 'session refused' USING ERRCODE = 'BW002'; END$$`}

	var batch []*pendingCommit
	var plans []*commitPlan
	for i, did := range dids {
		var g *Guard
		if i == 3 {
			g = refuse
		}
		c, p, _ := groupMember(t, b, did, g)
		batch, plans = append(batch, c), append(plans, p)
	}
	before := b.counts(t)
	conn, err := b.pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	b.engine.storeGroup(ctx, conn, batch)

	require.Equal(t, float64(1), counterValue(t, b.engine.counters.groupRetries), "the group was not refused whole, or its retry not counted")
	outcomes := map[string]string{}
	for _, c := range batch {
		<-c.done
		var pe *pgconn.PgError
		switch {
		case c.err == nil && c.moved != nil:
			outcomes[c.params.did] = "root moved"
		case errors.As(c.err, &pe):
			outcomes[c.params.did] = pe.Code
		default:
			require.NoError(t, c.err, c.params.did)
		}
	}
	require.Equal(t, map[string]string{dids[1].String(): "root moved", dids[3].String(): "BW002"}, outcomes)
	after := b.counts(t)
	require.Equal(t, before["events"]+3, after["events"], "exactly the three sound commits were stored")
	for i, p := range plans {
		head, err := b.engine.GetHead(ctx, dids[i])
		require.NoError(t, err)
		if i == 1 || i == 3 {
			require.NotEqual(t, p.res.Commit, head.Commit, "refused commit of repo %d stored", i)
		} else {
			require.Equal(t, p.res.Commit, head.Commit, "commit of repo %d not stored", i)
		}
	}
}

// A member whose root another engine moved does not roll its group back:
// it stores nothing and gets the stored root and the nodes written since
// its cached rev, while the others are stored in the one transaction.
func TestGroupWithMovedMember(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, Config{})
	other := New(b.pool, b.keys, nil, Config{counters: newCounters()})
	dids := make([]syntax.DID, 3)
	for i := range dids {
		dids[i] = b.newRepo(t, i)
		_, err := b.engine.Apply(ctx, dids[i], []Write{create("app.bsky.feed.post", "", post("warm"))}, nil)
		require.NoError(t, err)
	}
	moved, err := other.Apply(ctx, dids[1], []Write{create("app.bsky.feed.post", "", post("elsewhere"))}, nil)
	require.NoError(t, err)
	var batch []*pendingCommit
	var plans []*commitPlan
	for _, did := range dids {
		c, p, _ := groupMember(t, b, did, nil)
		batch, plans = append(batch, c), append(plans, p)
	}
	conn, err := b.pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	b.engine.storeGroup(ctx, conn, batch)
	require.Zero(t, counterValue(t, b.engine.counters.groupRetries), "the group was rolled back")
	require.Equal(t, float64(1), counterValue(t, b.engine.counters.commitGroups))
	for i, c := range batch {
		<-c.done
		require.NoError(t, c.err)
		head, err := b.engine.GetHead(ctx, dids[i])
		require.NoError(t, err)
		if i != 1 {
			require.Nil(t, c.moved)
			require.Equal(t, plans[i].res.Commit, head.Commit)
			continue
		}
		m, err := parseMoved(c.moved, false)
		require.NoError(t, err)
		require.Equal(t, moved.Commit, m.commit)
		require.Equal(t, moved.Rev, m.rev)
		require.Equal(t, head.Data, m.data)
		w := moved.Results[0]
		require.Equal(t, []sinceRecord{{path: string(w.Collection) + "/" + string(w.RKey), cid: w.CID}}, m.records,
			"the record written since did not come back")
	}
}

// Many writers of different repos through the group committer, one group
// in flight at a time: every commit is stored and acknowledged, the lead
// passes on until the queue is empty, and none is left held.
func TestGroupCommitLeadership(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, Config{groupLeaders: 1})
	const repos, perRepo = 12, 15
	acked := map[syntax.DID]map[string]bool{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	dids := make([]syntax.DID, repos)
	for i := range dids {
		dids[i] = b.newRepo(t, i)
		acked[dids[i]] = map[string]bool{}
	}
	for _, did := range dids {
		paths := acked[did]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range perRepo {
				res, err := b.engine.Apply(ctx, did, []Write{create("app.bsky.feed.post", "", post(fmt.Sprint(j)))}, nil)
				if !assertNoError(t, err) {
					return
				}
				mu.Lock()
				paths["app.bsky.feed.post/"+res.Results[0].RKey.String()] = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	checkFinalState(t, b, acked)
	require.Equal(t, repos*perRepo, sum(b.verifyChain(t, b.sequencedEvents(t))))
	require.Positive(t, counterValue(t, b.engine.counters.groupedCommits), "no commit was stored in a group")
	b.engine.group.mu.Lock()
	defer b.engine.group.mu.Unlock()
	require.Zero(t, b.engine.group.leaders)
	require.Empty(t, b.engine.group.queue)
}

func assertNoError(t *testing.T, err error) bool {
	t.Helper()
	if err != nil {
		t.Error(err)
		return false
	}
	return true
}

func sum(m map[syntax.DID]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

func counterValue(t testing.TB, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	require.NoError(t, c.Write(&m))
	return m.GetCounter().GetValue()
}

// A group stops at maxGroup commits and at maxGroupBytes, and a commit
// larger than that still goes, alone.
func TestGroupLen(t *testing.T) {
	queue := func(sizes ...int) []*pendingCommit {
		q := make([]*pendingCommit, len(sizes))
		for i, n := range sizes {
			q[i] = &pendingCommit{params: &commitParams{event: &eventlog.Encoded{Body: make([]byte, n)}}}
		}
		return q
	}
	const mb = 1 << 20
	require.Equal(t, 0, groupLen(nil))
	require.Equal(t, 2, groupLen(queue(5*mb, 3*mb, 1, 1)), "8 MiB fits, one byte more does not")
	require.Equal(t, 1, groupLen(queue(9*mb, 1)), "an oversized commit goes alone")
	small := make([]int, 100)
	for i := range small {
		small[i] = 1000
	}
	require.Equal(t, maxGroup, groupLen(queue(small...)))
}

package repo

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/bluesky-social/indigo/atproto/repo/mst"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/stretchr/testify/require"
)

// requireCacheExact checks e's cached tree of did against a tree loaded
// whole from the database: same root, and exactly the stored nodes.
func requireCacheExact(t *testing.T, b *bundle, e *Engine, did syntax.DID) {
	t.Helper()
	ctx := context.Background()
	e.cache.mu.Lock()
	el, ok := e.cache.byDID[did.String()]
	e.cache.mu.Unlock()
	require.True(t, ok, "the commit left no cached tree")
	st := el.Value.(*repoState)
	head, err := e.GetHead(ctx, did)
	require.NoError(t, err)
	require.Equal(t, head.Commit, st.commit)
	require.Equal(t, head.Rev, st.rev)
	root, err := st.tree.RootCID()
	require.NoError(t, err)
	require.Equal(t, head.Data, *root, "cached tree's root")
	fresh := New(b.pool, b.keys, nil, Config{counters: newCounters()})
	full, err := fresh.loadState(ctx, b.pool, did.String(), head.Data)
	require.NoError(t, err)
	require.Equal(t, len(full.nodes), len(st.nodes), "cached node count")
	for c, data := range full.nodes {
		require.Equal(t, data, st.nodes[c], "node %s", c)
	}
	require.Equal(t, full.size, st.size)
}

// TestRefreshMatchesReload: engines writing one repository in turn (a
// round-robin balancer over nodes) catch their cached trees up with the
// others' commits instead of reloading them, and every caught-up tree is
// exactly the stored one: creates, updates and deletes, trees of several
// levels, commits several behind.
func TestRefreshMatchesReload(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, Config{})
	engines := []*Engine{b.engine, New(b.pool, b.keys, nil, Config{counters: newCounters()}), New(b.pool, b.keys, nil, Config{counters: newCounters()})}
	did := b.newRepo(t, 1)
	rng := rand.New(rand.NewPCG(1, 2))
	var live []syntax.RecordKey
	rounds := 150
	if testing.Short() {
		rounds = 40
	}
	for i := range rounds {
		e := engines[rng.IntN(len(engines))]
		var writes []Write
		for range 1 + rng.IntN(4) {
			switch r := rng.IntN(10); {
			case r < 6 || len(live) < 5:
				writes = append(writes, Write{Action: ActionCreate, Collection: "app.bsky.feed.post", Record: post(fmt.Sprint(i, r))})
			case r < 8:
				writes = append(writes, Write{Action: ActionUpdate, Collection: "app.bsky.feed.post", RKey: live[rng.IntN(len(live))], Record: post(fmt.Sprint("upd", i))})
			default:
				k := rng.IntN(len(live))
				writes = append(writes, Write{Action: ActionDelete, Collection: "app.bsky.feed.post", RKey: live[k]})
				live = append(live[:k], live[k+1:]...)
			}
		}
		// One commit's writes name each record at most once.
		seen := map[syntax.RecordKey]bool{}
		kept := writes[:0]
		for _, w := range writes {
			if w.RKey != "" && seen[w.RKey] {
				continue
			}
			seen[w.RKey] = w.RKey != ""
			kept = append(kept, w)
		}
		res, err := e.Apply(ctx, did, kept, nil)
		require.NoError(t, err, "round %d", i)
		for _, r := range res.Results {
			if r.Action == ActionCreate {
				live = append(live, r.RKey)
			}
		}
		requireCacheExact(t, b, e, did)
	}
	var refreshes float64
	for _, e := range engines {
		refreshes += counterValue(t, e.counters.refreshes)
	}
	require.Positive(t, refreshes, "no cached tree was caught up")
	b.exportMatchesIndex(t, did)
	require.Equal(t, rounds, b.verifyChain(t, b.sequencedEvents(t))[did])
}

// counts is what an engine counted.
type counts struct{ plans, stale, refreshes, checks float64 }

func (e *Engine) countsNow(t testing.TB) counts {
	return counts{counterValue(t, e.counters.plans), counterValue(t, e.counters.staleRoots),
		counterValue(t, e.counters.refreshes), counterValue(t, e.counters.checks)}
}

func sumCounts(t *testing.T, engines []*Engine) counts {
	var c counts
	for _, e := range engines {
		n := e.countsNow(t)
		c.plans += n.plans
		c.stale += n.stale
		c.refreshes += n.refreshes
		c.checks += n.checks
	}
	return c
}

// TestRoundRobinPlansEachCommitOnce: writes to one repository spread over
// three engines in turn (a round-robin balancer over three nodes) find
// each engine's cached tree two commits behind. Once an engine has seen
// the repository moved, it asks before working a commit out and catches
// its tree up first: every commit is worked out and signed once, none is
// refused, and every cached tree is exactly the stored one.
func TestRoundRobinPlansEachCommitOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, Config{})
	engines := []*Engine{b.engine, New(b.pool, b.keys, nil, Config{counters: newCounters()}), New(b.pool, b.keys, nil, Config{counters: newCounters()})}
	did := b.newRepo(t, 1)
	write := func(i int) {
		e := engines[i%len(engines)]
		_, err := e.Apply(ctx, did, []Write{create("app.bsky.feed.post", "", post(fmt.Sprint(i)))}, nil)
		require.NoError(t, err)
		requireCacheExact(t, b, e, did)
	}
	// Each engine loads the tree, then finds it moved once.
	for i := range 2 * len(engines) {
		write(i)
	}
	before := sumCounts(t, engines)
	const commits = 30
	for i := range commits {
		write(i)
	}
	d := sumCounts(t, engines)
	require.Equal(t, float64(commits), d.plans-before.plans, "commits worked out more than once")
	require.Zero(t, d.stale-before.stale, "commits refused for a moved root")
	require.Equal(t, float64(commits), d.refreshes-before.refreshes, "cached trees caught up")
	require.Equal(t, float64(commits), d.checks-before.checks, "roots checked before the commit")
	b.exportMatchesIndex(t, did)
	require.Equal(t, commits+2*len(engines), b.verifyChain(t, b.sequencedEvents(t))[did])
}

// TestChecksStopWhenWritesStay: once a repository's writes stay on one
// engine (affinity, or the other nodes gone), its commits stop asking
// whether the repository moved after checksAfterMove of them; an engine
// that never saw it moved never asks.
func TestChecksStopWhenWritesStay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, Config{})
	other := New(b.pool, b.keys, nil, Config{counters: newCounters()})
	did := b.newRepo(t, 1)
	apply := func(e *Engine, i int) {
		_, err := e.Apply(ctx, did, []Write{create("app.bsky.feed.post", "", post(fmt.Sprint(i)))}, nil)
		require.NoError(t, err)
	}
	for i := range 10 {
		apply(b.engine, i)
	}
	require.Zero(t, b.engine.countsNow(t).checks, "a lone writer asked")
	apply(other, 10)
	apply(b.engine, 11) // refused, caught up, rebuilt
	require.Equal(t, float64(1), b.engine.countsNow(t).stale)
	for i := range 3 * checksAfterMove {
		apply(b.engine, 12+i)
	}
	c := b.engine.countsNow(t)
	require.Equal(t, float64(checksAfterMove), c.checks)
	require.Equal(t, float64(1), c.stale)
	require.Equal(t, float64(10+2+3*checksAfterMove), c.plans, "the refused commit is worked out twice, every other once")
	requireCacheExact(t, b, b.engine, did)
}

// TestCatchUpPaths: a cached tree another engine moved on is caught up
// from the records written since when every change was a create or an
// update; from the MST nodes written since when one was a delete (no
// record is left to read); and loaded whole when neither makes the stored
// tree (here a new node carries an old rev, as in a repository replaced
// by an import). After each, the commit goes through and the cached tree
// is exactly the stored one.
func TestCatchUpPaths(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, Config{})
	other := New(b.pool, b.keys, nil, Config{counters: newCounters()})
	did := b.newRepo(t, 1)
	n := 0
	write := func(e *Engine, w Write) *CommitResult {
		n++
		if w.Action != ActionDelete {
			w.Record = post(fmt.Sprint(n))
		}
		res, err := e.Apply(ctx, did, []Write{w}, nil)
		require.NoError(t, err)
		return res
	}
	rkey := func(i int) syntax.RecordKey { return syntax.RecordKey(fmt.Sprintf("k%03d", i)) }
	for i := range 40 {
		write(b.engine, create("app.bsky.feed.post", string(rkey(i)), nil))
	}
	step := func(name string, moveOn func(), refreshes, walks int) {
		t.Helper()
		before, walksBefore := b.engine.countsNow(t), b.engine.nodeWalks.Load()
		moveOn()
		write(b.engine, create("app.bsky.feed.post", "", nil))
		after := b.engine.countsNow(t)
		require.Equal(t, before.refreshes+float64(refreshes), after.refreshes, "%s: refreshes", name)
		require.Equal(t, walksBefore+int64(walks), b.engine.nodeWalks.Load(), "%s: node walks", name)
		requireCacheExact(t, b, b.engine, did)
	}
	step("created and updated elsewhere", func() {
		write(other, create("app.bsky.feed.post", "", nil))
		write(other, Write{Action: ActionUpdate, Collection: "app.bsky.feed.post", RKey: rkey(3)})
	}, 1, 0)
	step("deleted elsewhere", func() {
		write(other, Write{Action: ActionDelete, Collection: "app.bsky.feed.post", RKey: rkey(5)})
	}, 1, 1)
	step("a new node stored with an old rev", func() {
		moved := write(other, Write{Action: ActionDelete, Collection: "app.bsky.feed.post", RKey: rkey(7)})
		head, err := b.engine.GetHead(ctx, did)
		require.NoError(t, err)
		tag, err := b.pool.Exec(ctx, "UPDATE repo_nodes SET rev = '2222222222222' WHERE did = $1 AND cid = $2 AND rev = $3",
			did.String(), head.Data.Bytes(), moved.Rev)
		require.NoError(t, err)
		require.Equal(t, int64(1), tag.RowsAffected())
	}, 0, 1)
	step("created elsewhere after a reload", func() {
		write(other, create("app.bsky.feed.post", "", nil))
	}, 1, 0)
	b.exportMatchesIndex(t, did)
	require.Equal(t, n, b.verifyChain(t, b.sequencedEvents(t))[did])
}

// TestRefusedPlanIsUndone: a plan is undone on the cached tree, whether
// it is refused by a write (a create of a record that exists, after other
// writes of the commit were applied) or not stored; the tree is then at
// its root again, and the next commit takes the one-round-trip path.
func TestRefusedPlanIsUndone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, Config{})
	did := b.newRepo(t, 1)
	for i := range 40 {
		_, err := b.engine.Apply(ctx, did, []Write{create("app.bsky.feed.post", fmt.Sprintf("k%03d", i), post(fmt.Sprint(i)))}, nil)
		require.NoError(t, err)
	}
	st := b.engine.cache.takeAny(did.String())
	require.NotNil(t, st)
	key, err := b.keys.SigningKey(ctx, did)
	require.NoError(t, err)
	writes, err := b.engine.prepare([]Write{
		create("app.bsky.feed.post", "a-new", post("x")),
		{Action: ActionDelete, Collection: "app.bsky.feed.post", RKey: "k010"},
		create("app.bsky.feed.post", "k020", post("exists")),
	})
	require.NoError(t, err)
	_, err = b.engine.plan(ctx, st, did, key, writes)
	require.ErrorIs(t, err, ErrRecordExists)
	root, err := st.tree.RootCID()
	require.NoError(t, err)
	require.Equal(t, st.data, *root, "a refused write left the tree changed")

	writes, err = b.engine.prepare([]Write{create("app.bsky.feed.post", "z-new", post("y")),
		{Action: ActionDelete, Collection: "app.bsky.feed.post", RKey: "k030"}})
	require.NoError(t, err)
	p, err := b.engine.plan(ctx, st, did, key, writes)
	require.NoError(t, err)
	require.NoError(t, p.undo())
	root, err = st.tree.RootCID()
	require.NoError(t, err)
	require.Equal(t, st.data, *root, "an undone plan left the tree changed")
	require.False(t, st.torn)
	b.engine.cache.put(st)

	fast := b.engine.fastCommits.Load()
	_, err = b.engine.Apply(ctx, did, []Write{create("app.bsky.feed.post", "z-new", post("y"))}, nil)
	require.NoError(t, err)
	require.Equal(t, fast+1, b.engine.fastCommits.Load())
	requireCacheExact(t, b, b.engine, did)
}

// TestLockedPathCatchesUp: a commit that takes the two-round-trip path
// with a cached tree another engine moved (here a swapCommit naming the
// stored commit, which the stale cache cannot check) reads what the tree
// lacks under the row lock, in the same round trip as the lock, and
// catches the tree up instead of loading it whole; with the tree
// unmoved, it reads nothing more.
func TestLockedPathCatchesUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, Config{})
	other := New(b.pool, b.keys, nil, Config{counters: newCounters()})
	did := b.newRepo(t, 1)
	for i := range 30 {
		_, err := b.engine.Apply(ctx, did, []Write{create("app.bsky.feed.post", "", post(fmt.Sprint(i)))}, nil)
		require.NoError(t, err)
	}
	moved, err := other.Apply(ctx, did, []Write{create("app.bsky.feed.post", "", post("elsewhere"))}, nil)
	require.NoError(t, err)
	before := b.engine.countsNow(t)
	res, err := b.engine.Apply(ctx, did, []Write{create("app.bsky.feed.post", "", post("swapped"))}, &moved.Commit)
	require.NoError(t, err)
	after := b.engine.countsNow(t)
	require.Equal(t, before.refreshes+1, after.refreshes, "the locked path did not catch the tree up")
	require.Equal(t, before.plans+1, after.plans)
	requireCacheExact(t, b, b.engine, did)

	// Unmoved: the swap is checked against the cached tree, which is the
	// stored one.
	_, err = b.engine.Apply(ctx, did, []Write{create("app.bsky.feed.post", "", post("again"))}, &res.Commit)
	require.NoError(t, err)
	require.Equal(t, after.refreshes, b.engine.countsNow(t).refreshes)
	requireCacheExact(t, b, b.engine, did)
	b.exportMatchesIndex(t, did)
}

// TestCatchUpAcrossReshape: another engine deletes every record outside
// the first subtree of the root, so that the tree loses levels and its
// new root holds what was a subtree of the cached tree; then it grows the
// tree past its old height, then updates and deletes at once.
// Each time the cached tree is caught up from the new nodes alone, without
// a reload, and is exactly the stored one.
func TestCatchUpAcrossReshape(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, Config{})
	other := New(b.pool, b.keys, nil, Config{counters: newCounters()})
	did := b.newRepo(t, 1)
	apply := func(e *Engine, action Action, rkeys []int) {
		for len(rkeys) > 0 {
			n := min(50, len(rkeys))
			var writes []Write
			for _, k := range rkeys[:n] {
				w := Write{Action: action, Collection: "app.bsky.feed.post", RKey: syntax.RecordKey(fmt.Sprintf("k%04d", k))}
				if action != ActionDelete {
					w.Record = post(fmt.Sprint(action, k))
				}
				writes = append(writes, w)
			}
			_, err := e.Apply(ctx, did, writes, nil)
			require.NoError(t, err)
			rkeys = rkeys[n:]
		}
	}
	span := func(from, to int) (out []int) {
		for k := from; k < to; k++ {
			out = append(out, k)
		}
		return out
	}
	apply(other, ActionCreate, span(0, 400))
	apply(b.engine, ActionCreate, span(400, 401)) // b.engine loads the tree
	requireCacheExact(t, b, b.engine, did)

	// The records outside the root's first subtree.
	head, err := b.engine.GetHead(ctx, did)
	require.NoError(t, err)
	full, err := other.loadState(ctx, b.pool, did.String(), head.Data)
	require.NoError(t, err)
	first := full.tree.Root.Entries[0].Child
	require.NotNil(t, first, "the root starts with a record")
	inFirst := map[string]bool{}
	var collect func(n *mst.Node)
	collect = func(n *mst.Node) {
		for _, e := range n.Entries {
			if e.Child != nil {
				collect(e.Child)
			} else {
				inFirst[string(e.Key)] = true
			}
		}
	}
	collect(first)
	var outside []int
	for k := range 401 {
		if !inFirst[fmt.Sprintf("app.bsky.feed.post/k%04d", k)] {
			outside = append(outside, k)
		}
	}

	steps := []struct {
		name  string
		other func()
	}{
		{"reduced to the root's first subtree", func() { apply(other, ActionDelete, outside) }},
		{"grown past the old height", func() { apply(other, ActionCreate, span(2000, 3000)) }},
		{"updated and deleted at once", func() {
			apply(other, ActionUpdate, span(2000, 2100))
			apply(other, ActionDelete, span(2100, 2900))
		}},
	}
	for i, s := range steps {
		s.other()
		before, walks := b.engine.countsNow(t), b.engine.nodeWalks.Load()
		apply(b.engine, ActionCreate, []int{1000 + i})
		require.Equal(t, before.refreshes+1, b.engine.countsNow(t).refreshes, "%s: reloaded, not caught up", s.name)
		// Deletes, or more records than are sent: the nodes written since.
		require.Equal(t, walks+1, b.engine.nodeWalks.Load(), "%s: not caught up from the nodes", s.name)
		requireCacheExact(t, b, b.engine, did)
	}
	b.exportMatchesIndex(t, did)
}

// TestRefreshAfterUpdateAndRevert: another engine updates a record and
// then puts it back, so the records written since leave the cached tree
// as it was; catching up keeps every node of the tree, and the next
// commit goes through on it, with every node of the tree at hand.
func TestRefreshAfterUpdateAndRevert(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, Config{})
	other := New(b.pool, b.keys, nil, Config{counters: newCounters()})
	did := b.newRepo(t, 1)
	for i := range 5 {
		_, err := b.engine.Apply(ctx, did, []Write{create("app.bsky.feed.post", fmt.Sprintf("r%d", i), post(fmt.Sprint(i)))}, nil)
		require.NoError(t, err)
	}
	update := func(e *Engine, text string) {
		_, err := e.Apply(ctx, did, []Write{{Action: ActionUpdate, Collection: "app.bsky.feed.post", RKey: "r2", Record: post(text)}}, nil)
		require.NoError(t, err)
	}
	update(other, "changed")
	update(other, "2") // back to what it was
	refreshes := counterValue(t, b.engine.counters.refreshes)
	_, err := b.engine.Apply(ctx, did, []Write{create("app.bsky.feed.post", "r9", post("after"))}, nil)
	require.NoError(t, err)
	require.Equal(t, refreshes+1, counterValue(t, b.engine.counters.refreshes), "caught up from the records since")
	requireCacheExact(t, b, b.engine, did)
	b.exportMatchesIndex(t, did)
}

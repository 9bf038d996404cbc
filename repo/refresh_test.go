package repo

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

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

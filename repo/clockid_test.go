package repo

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// TestClockIDInKeysAndRevs: the record keys an engine picks and the revs
// it gives commits carry its clock id, so two processes writing to one
// database never pick the same key at the same microsecond; SetClockID
// changes it from the next write on.
func TestClockIDInKeysAndRevs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, Config{ClockID: 17})
	did := b.newRepo(t, 1)
	other := New(b.pool, b.keys, nil, Config{ClockID: 801, counters: newCounters()})
	for i, e := range []*Engine{b.engine, other, b.engine, other} {
		want := []uint{17, 801}[i%2]
		res, err := e.Apply(ctx, did, []Write{{Action: ActionCreate, Collection: "app.bsky.feed.post", Record: post("x")}}, nil)
		require.NoError(t, err)
		key, err := syntax.ParseTID(string(res.Results[0].RKey))
		require.NoError(t, err)
		require.Equal(t, want, key.ClockID(), "record key %s", res.Results[0].RKey)
		rev, err := syntax.ParseTID(res.Rev)
		require.NoError(t, err)
		require.Equal(t, want, rev.ClockID(), "rev %s", res.Rev)
	}
	b.engine.SetClockID(5)
	res, err := b.engine.Apply(ctx, did, []Write{{Action: ActionCreate, Collection: "app.bsky.feed.post", Record: post("y")}}, nil)
	require.NoError(t, err)
	key, err := syntax.ParseTID(string(res.Results[0].RKey))
	require.NoError(t, err)
	require.Equal(t, uint(5), key.ClockID())
}

// TestExportSameBytesWhateverThePlan: a repository exports to the same
// bytes whichever plan Postgres picks (nodes of a cluster, each with its
// own cached plans, must serve byte-identical getRepo answers): here one
// engine's connections may not use index scans, so Postgres reads the
// blocks in heap order.
func TestExportSameBytesWhateverThePlan(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, Config{})
	did := b.newRepo(t, 1)
	for i := range 30 {
		_, err := b.engine.Apply(ctx, did, []Write{{Action: ActionCreate, Collection: "app.bsky.feed.post", Record: post(fmt.Sprint(i))}}, nil)
		require.NoError(t, err)
	}
	// One engine reads through the indexes only, the other never.
	export := func(settings string) []byte {
		pool, err := pgxpool.New(ctx, b.pool.Config().ConnString()+settings)
		require.NoError(t, err)
		defer pool.Close()
		var buf bytes.Buffer
		require.NoError(t, New(pool, b.keys, nil, Config{counters: newCounters()}).ExportCAR(ctx, did, "", &buf))
		return buf.Bytes()
	}
	indexed := export("&enable_seqscan=off&enable_bitmapscan=off")
	heap := export("&enable_indexscan=off&enable_indexonlyscan=off")
	require.Equal(t, indexed, heap)
}

package repo

import (
	"context"
	"testing"

	"github.com/bluesky-social/indigo/atproto/syntax"
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

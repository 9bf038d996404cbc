package repo

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/ipfs/go-cid"
	"github.com/stretchr/testify/require"
)

// TestListRecordsByteBound: a page ends where its records would pass
// maxBytes, with a cursor from which the next page goes on, in either
// order; a record larger than the bound still comes, alone; the count
// limit works as before.
func TestListRecordsByteBound(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, Config{})
	did := b.newRepo(t, 1)
	var writes []Write
	for i := range 10 {
		writes = append(writes, create("app.bsky.feed.post", fmt.Sprintf("3kpost%06d", i), post(strings.Repeat("x", 1000))))
	}
	_, err := b.engine.Apply(ctx, did, writes, nil)
	require.NoError(t, err)
	one, err := b.engine.GetRecord(ctx, did, "app.bsky.feed.post", "3kpost000000")
	require.NoError(t, err)
	size := int64(len(one.Data))

	for _, ascending := range []bool{true, false} {
		var seen []syntax.RecordKey
		cursor := ""
		for {
			recs, next, err := b.engine.ListRecords(ctx, did, "app.bsky.feed.post", cursor, 100, ascending, 3*size+size/2)
			require.NoError(t, err)
			require.LessOrEqual(t, len(recs), 3, "three records fit")
			for _, r := range recs {
				seen = append(seen, r.RKey)
			}
			if next == "" {
				break
			}
			require.Equal(t, recs[len(recs)-1].RKey.String(), next)
			cursor = next
		}
		require.Len(t, seen, 10, "ascending=%v", ascending)
		for i := 1; i < len(seen); i++ {
			require.Equal(t, ascending, seen[i-1] < seen[i])
		}
	}

	recs, next, err := b.engine.ListRecords(ctx, did, "app.bsky.feed.post", "", 100, true, 1)
	require.NoError(t, err)
	require.Len(t, recs, 1, "the first record comes whatever the bound")
	require.Equal(t, "3kpost000000", next)

	recs, next, err = b.engine.ListRecords(ctx, did, "app.bsky.feed.post", "", 4, true, 1<<30)
	require.NoError(t, err)
	require.Len(t, recs, 4)
	require.Equal(t, "3kpost000003", next)
	recs, next, err = b.engine.ListRecords(ctx, did, "app.bsky.feed.post", "3kpost000007", 4, true, 1<<30)
	require.NoError(t, err)
	require.Len(t, recs, 2)
	require.Empty(t, next, "the end")
}

// TestBlockSizes: the sizes of the blocks a repository holds, records and
// MST nodes alike; anything else is absent.
func TestBlockSizes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, Config{})
	did := b.newRepo(t, 1)
	res, err := b.engine.Apply(ctx, did, []Write{create("app.bsky.feed.post", "3kpost000001", post("hello"))}, nil)
	require.NoError(t, err)
	head, err := b.engine.GetHead(ctx, did)
	require.NoError(t, err)
	rec := res.Results[0].CID
	other, err := cid.Decode("bafyreie5737gdxlw5i64vzichcalba3z2v5n6icifvx5xytvske7mr3hpm")
	require.NoError(t, err)
	sizes, err := b.engine.BlockSizes(ctx, did, []cid.Cid{rec, head.Data, other})
	require.NoError(t, err)
	recData, err := b.engine.GetBlock(ctx, did, rec)
	require.NoError(t, err)
	nodeData, err := b.engine.GetBlock(ctx, did, head.Data)
	require.NoError(t, err)
	require.Equal(t, map[cid.Cid]int{rec: len(recData), head.Data: len(nodeData)}, sizes)

	n, err := b.engine.RecordSize(ctx, did, "app.bsky.feed.post", "3kpost000001")
	require.NoError(t, err)
	require.Equal(t, len(recData), n)
	n, err = b.engine.RecordSize(ctx, did, "app.bsky.feed.post", "3kabsent")
	require.NoError(t, err)
	require.Zero(t, n)
}

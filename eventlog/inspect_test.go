package eventlog

import (
	"context"
	"fmt"
	"testing"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/syntax"
	lexutil "github.com/bluesky-social/indigo/lex/util"
	"github.com/ipfs/go-cid"
	"github.com/multiformats/go-multihash"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/db/dbtest"
)

// Newest lists from the top down, also when filtering by limits broken;
// Ops reads a commit's operations with their CIDs, even from an oversized
// body cbor-gen would refuse.
func TestInspectNewestAndOps(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.New(t)
	log := NewLog(pool)
	big, _ := oversizedCommit(t, pool, "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa", 5_100_000)
	pref := cid.NewPrefixV1(cid.DagCBOR, multihash.SHA2_256)
	recCID, err := pref.Sum([]byte("a record"))
	require.NoError(t, err)
	prevCID, err := pref.Sum([]byte("the record before"))
	require.NoError(t, err)
	link := lexutil.LexLink(recCID)
	prev := lexutil.LexLink(prevCID)
	for i := range 3 {
		enc, err := EncodeCommit(&comatproto.SyncSubscribeRepos_Commit{
			Repo: "did:plc:bbbbbbbbbbbbbbbbbbbbbbbb", Commit: link, Rev: syntax.NewTIDNow(0).String(), Blocks: []byte{},
			Ops: []*comatproto.SyncSubscribeRepos_RepoOp{
				{Action: "create", Path: fmt.Sprintf("app.bsky.feed.post/%d", i), Cid: &link},
				{Action: "update", Path: "app.bsky.actor.profile/self", Cid: &link, Prev: &prev},
				{Action: "delete", Path: "app.bsky.feed.like/x", Prev: &prev},
			},
			Blobs: []lexutil.LexLink{}, Time: syntax.DatetimeNow().String(),
		})
		require.NoError(t, err)
		require.NoError(t, Append(ctx, pool, enc))
	}
	_, err = NewSequencer(pool, SequencerConfig{}).SequenceBatch(ctx)
	require.NoError(t, err)
	head, err := log.LastSeq(ctx)
	require.NoError(t, err)
	require.Equal(t, big+3, head)

	evs, err := log.Inspect(ctx, EventFilter{Newest: true, Limit: 2})
	require.NoError(t, err)
	require.Equal(t, []int64{head, head - 1}, seqsOf(evs))
	evs, err = log.Inspect(ctx, EventFilter{Newest: true, ToSeq: head - 1, Limit: 10})
	require.NoError(t, err)
	require.Equal(t, []int64{head - 1, head - 2, big}, seqsOf(evs))
	evs, err = log.Inspect(ctx, EventFilter{Newest: true, OverLimits: true, Limit: 1})
	require.NoError(t, err)
	require.Equal(t, []int64{big}, seqsOf(evs), "past a full page of compliant events")
	evs, err = log.Inspect(ctx, EventFilter{Newest: true, FromSeq: head, Limit: 10})
	require.NoError(t, err)
	require.Equal(t, []int64{head}, seqsOf(evs))

	ops, err := log.Ops(ctx, head)
	require.NoError(t, err)
	require.Equal(t, []Op{
		{Action: "create", Path: "app.bsky.feed.post/2", CID: recCID.String()},
		{Action: "update", Path: "app.bsky.actor.profile/self", CID: recCID.String(), Prev: prevCID.String()},
		{Action: "delete", Path: "app.bsky.feed.like/x", Prev: prevCID.String()},
	}, ops)
	ops, err = log.Ops(ctx, big)
	require.NoError(t, err, "an oversized body is read too")
	require.Empty(t, ops)
	_, err = log.Ops(ctx, head+100)
	require.ErrorIs(t, err, ErrNoEvent)
}

func seqsOf(evs []EventInfo) []int64 {
	var out []int64
	for _, e := range evs {
		out = append(out, e.Seq)
	}
	return out
}

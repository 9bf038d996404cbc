package eventlog

import (
	"context"
	"fmt"
	"testing"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/db/dbtest"
	"github.com/bulwark-pds/bulwark/metrics"
)

// TestSequencerMetrics: a batch that leaves events behind reports them as
// pending, one that takes the rest reports none, and a batch answering a
// writer's wake-up reports how long it waited. Not parallel: the series
// are the process's.
func TestSequencerMetrics(t *testing.T) {
	ctx := context.Background()
	pool := dbtest.New(t)
	for i := range 5 {
		enc, err := EncodeIdentity(&comatproto.SyncSubscribeRepos_Identity{
			Did: fmt.Sprintf("did:plc:seqmetrics%015d", i), Time: syntax.DatetimeNow().String(),
		})
		require.NoError(t, err)
		require.NoError(t, Append(ctx, pool, enc))
	}
	seq := NewSequencer(pool, SequencerConfig{BatchSize: 2})
	metrics.SequencerLag.Set(-1)
	seq.Wake()

	n, err := seq.SequenceBatch(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.Equal(t, 3.0, testutil.ToFloat64(metrics.SequencerPending), "five committed, two numbered")
	lag := testutil.ToFloat64(metrics.SequencerLag)
	require.GreaterOrEqual(t, lag, 0.0, "the batch answered the wake-up")

	// The wake-up is unanswered while events wait: the next batches still
	// measure from it.
	metrics.SequencerLag.Set(-1)
	n, err = seq.SequenceBatch(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.GreaterOrEqual(t, testutil.ToFloat64(metrics.SequencerLag), lag)
	n, err = seq.SequenceBatch(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Zero(t, testutil.ToFloat64(metrics.SequencerPending), "the last batch took the rest")

	// With nothing woken since, a batch found by polling leaves the lag.
	metrics.SequencerLag.Set(-1)
	enc, err := EncodeIdentity(&comatproto.SyncSubscribeRepos_Identity{Did: "did:plc:seqmetricsother0000000", Time: syntax.DatetimeNow().String()})
	require.NoError(t, err)
	require.NoError(t, Append(ctx, pool, enc))
	n, err = seq.SequenceBatch(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, -1.0, testutil.ToFloat64(metrics.SequencerLag))
}

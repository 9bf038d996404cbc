package cluster

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/db/dbtest"
)

func secretFacts(jwt, blobs string) []Fact {
	key := []byte("rotation key bytes, the same for every node here")
	return []Fact{
		{Name: "plc-rotation-key", Value: Fingerprint(key, "plc-rotation-key", nil), Permanent: true, What: "the rotation key", Hint: "use the first one."},
		{Name: "jwt-secret", Value: Fingerprint(key, "jwt-secret", []byte(jwt)), What: "the JWT secret", Hint: "use the same."},
		{Name: "blob-store", Value: blobs, Public: true, What: "the blob store", Hint: "use S3."},
	}
}

// TestJoinClockIDsDiffer: nodes joining at once each get their own TID
// clock id.
func TestJoinClockIDsDiffer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.New(t)
	const n = 8
	ids := make([]uint, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			node, err := Join(ctx, pool, NodeConfig{ID: fmt.Sprintf("node-%d", i), Facts: secretFacts("jwt", "s3")})
			errs[i] = err
			if err == nil {
				ids[i] = node.ClockID()
			}
		})
	}
	wg.Wait()
	seen := map[uint]bool{}
	for i := range n {
		require.NoError(t, errs[i])
		require.False(t, seen[ids[i]], "clock id %d given twice", ids[i])
		require.Less(t, ids[i], uint(1024))
		seen[ids[i]] = true
	}
}

// TestJoinRefusesDisagreement: a node whose secret or blob store differs
// from a running node's is refused with both named; once the other has
// stopped, it may start (a secret is changed by restarting every node).
func TestJoinRefusesDisagreement(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	pool := dbtest.New(t)
	first, err := Join(ctx, pool, NodeConfig{ID: "first", Version: "v1", Facts: secretFacts("jwt-a", "S3 bucket b")})
	require.NoError(t, err)

	_, err = Join(ctx, pool, NodeConfig{ID: "second", Facts: secretFacts("jwt-b", "directory /blobs on host h (not shared)")})
	var mismatch *MismatchError
	require.ErrorAs(t, err, &mismatch)
	require.Len(t, mismatch.Problems, 2, err.Error())
	require.Contains(t, err.Error(), "the JWT secret differs from what node first")
	require.Contains(t, err.Error(), "here: directory /blobs on host h (not shared); there: S3 bucket b")
	require.NotContains(t, err.Error(), "jwt-a")

	// Agreeing, it joins beside the first.
	_, err = Join(ctx, pool, NodeConfig{ID: "third", Facts: secretFacts("jwt-a", "S3 bucket b")})
	require.NoError(t, err)

	// The first stops (Run marks it so); the third is still running, so
	// the second is still refused; a fourth with the third's facts is not.
	done := make(chan struct{})
	go func() { defer close(done); _ = first.Run(ctx) }()
	cancel()
	<-done
	_, err = Join(context.Background(), pool, NodeConfig{ID: "second", Facts: secretFacts("jwt-b", "S3 bucket b")})
	require.ErrorAs(t, err, &mismatch)
	require.Contains(t, err.Error(), "node third")
}

// TestJoinPermanentFact: a permanent fact (the rotation key) must match
// what the database recorded, even with no other node running.
func TestJoinPermanentFact(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.New(t)
	_, err := Join(ctx, pool, NodeConfig{ID: "first", Facts: secretFacts("jwt", "s3")})
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE cluster_nodes SET stopped_at = now()`)
	require.NoError(t, err)

	other := secretFacts("jwt", "s3")
	other[0].Value = Fingerprint([]byte("another rotation key"), "plc-rotation-key", nil)
	_, err = Join(ctx, pool, NodeConfig{ID: "second", Facts: other})
	require.ErrorContains(t, err, "the rotation key is not the one this database was first served with (by node first")
	_, err = Join(ctx, pool, NodeConfig{ID: "third", Facts: secretFacts("jwt", "s3")})
	require.NoError(t, err)
}

// TestClockIDKeptWhileAway: a joining node claims the id seen longest
// ago; the id of a node that stopped comes back only when no other is
// free, and that of a node unseen for less than a minute (frozen, cut
// off) never does.
func TestClockIDKeptWhileAway(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.New(t)
	a, err := Join(ctx, pool, NodeConfig{ID: "a", Facts: secretFacts("jwt", "s3")})
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE cluster_nodes SET stopped_at = now() WHERE node = 'a'`)
	require.NoError(t, err)
	b, err := Join(ctx, pool, NodeConfig{ID: "b", Facts: secretFacts("jwt", "s3")})
	require.NoError(t, err)
	require.NotEqual(t, a.ClockID(), b.ClockID(), "b took the id a stopped with although others were never used")

	// Every other id is in use: a's, stopped, is the one left.
	_, err = pool.Exec(ctx, `UPDATE cluster_nodes SET node = 'other' || clock_id, seen_at = now(), stopped_at = NULL WHERE node <> 'a'`)
	require.NoError(t, err)
	c, err := Join(ctx, pool, NodeConfig{ID: "c", Facts: secretFacts("jwt", "s3")})
	require.NoError(t, err)
	require.Equal(t, a.ClockID(), c.ClockID())

	// A node frozen for 30 s keeps its id: none is left.
	_, err = pool.Exec(ctx, `UPDATE cluster_nodes SET seen_at = now() - interval '30 seconds' WHERE node = 'c'`)
	require.NoError(t, err)
	_, err = Join(ctx, pool, NodeConfig{ID: "d", Facts: secretFacts("jwt", "s3")})
	require.ErrorIs(t, err, ErrNoClockID)
}

// TestNodeReclaimsLostClockID: a node whose id was given to another after
// it went unseen claims a new one at its next heartbeat and reports it.
func TestNodeReclaimsLostClockID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.New(t)
	got := make(chan uint, 1)
	a, err := Join(ctx, pool, NodeConfig{ID: "a", Facts: secretFacts("jwt", "s3"), OnClockID: func(id uint) { got <- id }})
	require.NoError(t, err)
	old := a.ClockID()
	_, err = pool.Exec(ctx, `UPDATE cluster_nodes SET node = 'intruder' WHERE clock_id = $1`, int(old))
	require.NoError(t, err)
	require.NoError(t, a.beat(ctx))
	newID := <-got
	require.NotEqual(t, old, newID)
	require.Equal(t, newID, a.ClockID())
}

package replay

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/db/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// TestSpendOnce: a token is accepted once; another issuer's token with
// the same id is another token; a forgotten one may be spent again.
func TestSpendOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := New(dbtest.New(t))
	exp := time.Now().Add(time.Minute)
	require.NoError(t, s.Spend(ctx, "did:plc:alice", "abc", exp))
	require.ErrorIs(t, s.Spend(ctx, "did:plc:alice", "abc", exp), ErrReplayed)
	require.NoError(t, s.Spend(ctx, "did:plc:bob", "abc", exp))
	require.NoError(t, s.Unspend(ctx, "did:plc:alice", "abc"))
	require.NoError(t, s.Spend(ctx, "did:plc:alice", "abc", exp))
	require.Error(t, s.Spend(ctx, "did:plc:alice", "", exp))
	require.Error(t, s.Spend(ctx, "did:plc:alice", string(make([]byte, MaxIDLen+1)), exp))
}

// TestSpendConcurrently: of many concurrent spends of one token, exactly
// one succeeds.
func TestSpendConcurrently(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := New(dbtest.New(t))
	exp := time.Now().Add(time.Minute)
	const n = 16
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() { errs <- s.Spend(ctx, "did:plc:alice", "same", exp) })
	}
	wg.Wait()
	close(errs)
	ok := 0
	for err := range errs {
		if err == nil {
			ok++
			continue
		}
		require.ErrorIs(t, err, ErrReplayed)
	}
	require.Equal(t, 1, ok)
}

// TestSpendPrunesExpired: expired rows go as new tokens are spent, so the
// table holds only tokens that could still be presented.
func TestSpendPrunesExpired(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.New(t)
	s := New(pool)
	_, err := pool.Exec(ctx, `INSERT INTO spent_service_tokens (issuer, token_id, expires_at)
		SELECT 'did:plc:alice', 'old' || i, now() - interval '1 minute' FROM generate_series(1, 40) i`)
	require.NoError(t, err)
	for i := range 3 {
		require.NoError(t, s.Spend(ctx, "did:plc:alice", fmt.Sprintf("new%d", i), time.Now().Add(time.Minute)))
	}
	var expired, live int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FILTER (WHERE expires_at < now()), count(*) FILTER (WHERE expires_at >= now()) FROM spent_service_tokens").Scan(&expired, &live))
	require.Equal(t, 3, live)
	require.Zero(t, expired, "16 expired rows go with each spend")
}

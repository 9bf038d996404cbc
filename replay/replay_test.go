package replay

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/db/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

func use(purpose, iss, id string) Use {
	return Use{Purpose: purpose, Issuer: iss, ID: id, Expires: time.Now().Add(time.Minute)}
}

// TestSpendOnce: a token is accepted once per purpose; another issuer's
// token with the same id is another token, and so is the same token for
// another method; a forgotten one may be spent again.
func TestSpendOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := New(dbtest.New(t))
	const up = "com.atproto.repo.uploadBlob"
	require.NoError(t, s.Spend(ctx, use(up, "did:plc:alice", "abc")))
	require.ErrorIs(t, s.Spend(ctx, use(up, "did:plc:alice", "abc")), ErrReplayed)
	require.NoError(t, s.Spend(ctx, use(up, "did:plc:bob", "abc")))
	require.NoError(t, s.Spend(ctx, use("com.atproto.server.createAccount", "did:plc:alice", "abc")))
	require.NoError(t, s.Unspend(ctx, use(up, "did:plc:alice", "abc")))
	require.NoError(t, s.Spend(ctx, use(up, "did:plc:alice", "abc")))
}

// TestIDsBounded: an id that is empty, too long or not printable ASCII is
// refused before anything is stored.
func TestIDsBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := New(dbtest.New(t))
	for _, id := range []string{"", strings.Repeat("a", MaxIDLen+1), "has space", "nul\x00", "é"} {
		require.False(t, ValidID(id), "%q", id)
		require.Error(t, s.Spend(ctx, use("m", "did:plc:alice", id)), "%q", id)
	}
	require.True(t, ValidID(strings.Repeat("a", MaxIDLen)))
}

// TestSpendConcurrently: of many concurrent spends of one token, exactly
// one succeeds.
func TestSpendConcurrently(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := New(dbtest.New(t))
	const n = 16
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() { errs <- s.Spend(ctx, use("m", "did:plc:alice", "same")) })
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
	_, err := pool.Exec(ctx, `INSERT INTO service_auth_used (purpose, iss, jti, expires_at)
		SELECT 'm', 'did:plc:alice', 'old' || i, now() - interval '1 minute' FROM generate_series(1, 40) i`)
	require.NoError(t, err)
	for i := range 3 {
		require.NoError(t, s.Spend(ctx, use("m", "did:plc:alice", fmt.Sprintf("new%d", i))))
	}
	var expired, live int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FILTER (WHERE expires_at < now()), count(*) FILTER (WHERE expires_at >= now()) FROM service_auth_used").Scan(&expired, &live))
	require.Equal(t, 3, live)
	require.Zero(t, expired, "16 expired rows go with each spend")
}

// TestRecordInTransaction: a use recorded in a transaction that rolls
// back is not remembered (a refused request records nothing), and
// records whose token has expired go as new ones arrive.
func TestRecordInTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.New(t)
	now := time.Now()
	u := use("com.atproto.server.createAccount", "did:plc:alice", "tx")
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, Record(ctx, tx, u, now))
	require.NoError(t, tx.Rollback(ctx))
	require.NoError(t, Record(ctx, pool, u, now))
	require.ErrorIs(t, Record(ctx, pool, u, now), ErrReplayed)

	later := use("com.atproto.server.createAccount", "did:plc:alice", "later")
	later.Expires = u.Expires.Add(time.Hour)
	require.NoError(t, Record(ctx, pool, later, u.Expires.Add(time.Minute)))
	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM service_auth_used").Scan(&n))
	require.Equal(t, 1, n, "only the live use is left")
}

package dbtest_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/db/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// Each clone is migrated and private: a row written in one test is not
// seen by the others running at the same time.
func TestParallelClones(t *testing.T) {
	t.Parallel()
	for i := range 8 {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := dbtest.New(t)
			var n int
			require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM repo_roots`).Scan(&n))
			require.Zero(t, n)
			_, err := pool.Exec(ctx, `INSERT INTO repo_roots (did, commit_cid, commit_data, data_cid, rev) VALUES ($1, '\x01', '\x02', '\x03', 'r')`, fmt.Sprintf("did:example:%d", i))
			require.NoError(t, err)
			require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM repo_roots`).Scan(&n))
			require.Equal(t, 1, n)
		})
	}
}

func TestNewURL(t *testing.T) {
	t.Parallel()
	u := dbtest.NewURL(t)
	require.Contains(t, u, "test_")
}

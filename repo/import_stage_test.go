package repo_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/repo"
	"github.com/bulwark-pds/bulwark/repo/repotest"
)

// stagingTables counts import staging tables in every session.
func (e *importEnv) stagingTables(t testing.TB) int {
	t.Helper()
	var n int
	require.NoError(t, e.pool.QueryRow(context.Background(),
		"SELECT count(*) FROM pg_class WHERE relpersistence = 't' AND relname = 'import_blocks'").Scan(&n))
	return n
}

// openTransactions counts the transactions open in the test's database
// other than the asking one.
func (e *importEnv) openTransactions(t testing.TB) int {
	t.Helper()
	var n int
	require.NoError(t, e.pool.QueryRow(context.Background(),
		"SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND xact_start IS NOT NULL AND pid <> pg_backend_pid()").Scan(&n))
	return n
}

// TestImportStagesWithoutTransaction: while a CAR trickles in, its blocks
// are staged in Postgres chunk by chunk with no transaction left open
// waiting on the client; when the stream breaks, the staging goes and
// nothing is stored.
func TestImportStagesWithoutTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newImportEnv(t)
	records := map[string]map[string]any{}
	for i := range 600 {
		records[fmt.Sprintf("app.bsky.feed.post/3lb2aaaa%05d", i)] = postRecord(strings.Repeat(fmt.Sprint(i%10), 10_000))
	}
	car := repotest.RepoCAR(t, e.did, e.oldKey, oldRev, records)
	require.Greater(t, len(car), 5<<20, "more than one staging chunk")
	before := e.snapshot(t)

	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		_, err := e.engine.Import(ctx, e.did, pr, repo.ImportOptions{})
		done <- err
	}()
	// A pipe write returns once the reader has taken every byte: after
	// the second write the importer has copied its first chunk and is
	// waiting for the rest of a block's length.
	_, err := pw.Write(car)
	require.NoError(t, err)
	_, err = pw.Write([]byte{0x80})
	require.NoError(t, err)
	require.Equal(t, 1, e.stagingTables(t), "the blocks are staged in the import's session")
	require.Zero(t, e.openTransactions(t), "no transaction waits on the client")

	pw.CloseWithError(errors.New("client went away"))
	require.ErrorIs(t, <-done, repo.ErrImportRead)
	require.Zero(t, e.stagingTables(t), "the staging is dropped")
	require.Equal(t, before, e.snapshot(t))

	// The connection goes back to the pool clean: the next import works.
	_, err = e.engine.Import(ctx, e.did, bytes.NewReader(car), repo.ImportOptions{})
	require.NoError(t, err)
	require.Zero(t, e.stagingTables(t))
}

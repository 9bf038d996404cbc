package db_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/db"
	"github.com/bulwark-pds/bulwark/db/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// unmigratedPool is a pool on a new managed cluster's empty database.
func unmigratedPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	m := startManaged(t, testConfig(clusterDir(t)))
	pool, err := db.Open(context.Background(), m.URL(db.ManagedDatabase), quiet)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

func TestMigrate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := unmigratedPool(t)

	var status bytes.Buffer
	require.NoError(t, db.MigrationStatus(ctx, pool, &status))
	require.Contains(t, status.String(), "00001_repo_and_events.sql")
	require.Contains(t, status.String(), "pending")

	// Several nodes starting at once: the advisory lock lets one migrate
	// and the others find nothing left to do.
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() { errs[i] = db.Migrate(ctx, pool, quiet) })
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	require.NoError(t, db.Migrate(ctx, pool, quiet), "migrating again is a no-op")

	status.Reset()
	require.NoError(t, db.MigrationStatus(ctx, pool, &status))
	lines := strings.Split(strings.TrimSpace(status.String()), "\n")
	require.NotEmpty(t, lines)
	for _, line := range lines {
		require.NotContains(t, line, "pending")
	}
	require.True(t, strings.HasPrefix(lines[0], "00001  00001_repo_and_events.sql"), lines[0])

	var seq int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT last_seq FROM sequencer_state`).Scan(&seq))
}

func TestMigrationStatusWriteError(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	err := db.MigrationStatus(context.Background(), pool, failingWriter{})
	require.ErrorIs(t, err, io.ErrClosedPipe)
}

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, io.ErrClosedPipe }

func TestTranslate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.New(t)

	insert := `INSERT INTO repo_roots (did, commit_cid, commit_data, data_cid, rev) VALUES ('did:example:a', '\x01', '\x02', '\x03', 'r')`
	_, err := pool.Exec(ctx, insert)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, insert)
	err = db.Translate(err)
	require.ErrorIs(t, err, db.ErrConflict)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr, "the driver error stays reachable")
	require.Equal(t, "repo_roots_pkey", pgErr.ConstraintName)

	var rev string
	err = db.Translate(pool.QueryRow(ctx, `SELECT rev FROM repo_roots WHERE did = 'did:example:none'`).Scan(&rev))
	require.ErrorIs(t, err, db.ErrNotFound)
	require.ErrorIs(t, err, pgx.ErrNoRows)
	require.ErrorIs(t, db.Translate(err), db.ErrNotFound, "translating twice changes nothing")
	require.Equal(t, err, db.Translate(err))

	for _, code := range []string{"40001", "40P01"} {
		err := db.Translate(fmt.Errorf("commit: %w", &pgconn.PgError{Code: code}))
		require.ErrorIs(t, err, db.ErrSerialization, code)
		require.NotErrorIs(t, err, db.ErrConflict, code)
	}

	moved := db.Translate(fmt.Errorf("commit: %w", &pgconn.PgError{Code: "BW001"}))
	require.ErrorIs(t, moved, db.ErrRootMoved)
	require.True(t, db.FromServer(moved), "a refused statement is the server's answer")
	require.False(t, db.FromServer(fmt.Errorf("send: %w", io.ErrUnexpectedEOF)), "a broken connection is not")

	require.NoError(t, db.Translate(nil))
	other := errors.New("something else")
	require.Same(t, other, db.Translate(other))
	syntax := &pgconn.PgError{Code: "42601"}
	require.Equal(t, error(syntax), db.Translate(syntax))
}

// A serialization failure produced by Postgres itself.
func TestTranslateSerializationFailure(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.New(t)
	_, err := pool.Exec(ctx, `INSERT INTO repo_roots (did, commit_cid, commit_data, data_cid, rev) VALUES ('did:example:a', '\x01', '\x02', '\x03', 'r1')`)
	require.NoError(t, err)

	serializable := pgx.TxOptions{IsoLevel: pgx.Serializable}
	tx1, err := pool.BeginTx(ctx, serializable)
	require.NoError(t, err)
	defer tx1.Rollback(ctx)
	tx2, err := pool.BeginTx(ctx, serializable)
	require.NoError(t, err)
	defer tx2.Rollback(ctx)

	var rev string
	require.NoError(t, tx1.QueryRow(ctx, `SELECT rev FROM repo_roots WHERE did = 'did:example:a'`).Scan(&rev))
	require.NoError(t, tx2.QueryRow(ctx, `SELECT rev FROM repo_roots WHERE did = 'did:example:a'`).Scan(&rev))
	_, err = tx1.Exec(ctx, `UPDATE repo_roots SET rev = 'r2' WHERE did = 'did:example:a'`)
	require.NoError(t, err)
	require.NoError(t, tx1.Commit(ctx))
	_, err = tx2.Exec(ctx, `UPDATE repo_roots SET rev = 'r3' WHERE did = 'did:example:a'`)
	require.ErrorIs(t, db.Translate(err), db.ErrSerialization)
}

func TestRedactURL(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"postgres://bulwark:s3cret@db.example:5432/pds?sslmode=require", "postgres://bulwark:xxxxx@db.example:5432/pds?sslmode=require"},
		{"postgresql://bulwark@db.example/pds", "postgresql://bulwark@db.example/pds"},
		{"postgres://db.example/pds?password=s3cret&user=u", "postgres://db.example/pds?password=xxxxx&user=u"},
		{"postgres://u:p%40ss@h/d", "postgres://u:xxxxx@h/d"},
		{"host=db.example user=u password=s3cret dbname=pds", "host=db.example user=u password=xxxxx dbname=pds"},
		{"host=h password='s3 cret' dbname=d", "host=h password=xxxxx dbname=d"},
		{"postgres://u:bad%zz@h/d", "postgres://u:xxxxx@h/d"},
		{"postgres://postgres@/bulwark?host=%2Ftmp%2Fx", "postgres://postgres@/bulwark?host=%2Ftmp%2Fx"},
	} {
		got := db.RedactURL(tc.in)
		require.Equal(t, tc.want, got, tc.in)
		require.NotContains(t, got, "s3cret")
	}
}

func TestOpen(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := dbtest.NewURL(t)

	pool, err := db.Open(ctx, u, quiet)
	require.NoError(t, err)
	defer pool.Close()
	require.Equal(t, db.DefaultMaxConns(), pool.Config().MaxConns)
	require.GreaterOrEqual(t, pool.Config().MaxConns, int32(8))

	small, err := db.Open(ctx, u+"&pool_max_conns=3", quiet)
	require.NoError(t, err)
	defer small.Close()
	require.Equal(t, int32(3), small.Config().MaxConns)
}

func TestOpenErrorsHidePassword(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, err := db.Open(ctx, "postgres://u:s3cret@127.0.0.1:1/d?connect_timeout=2", quiet)
	require.Error(t, err)
	require.NotContains(t, err.Error(), "s3cret")
	_, err = db.Open(ctx, "postgres://u:s3cret@127.0.0.1:notaport/d", quiet)
	require.Error(t, err)
	require.NotContains(t, err.Error(), "s3cret")
}

// TestMigrationsGoDown: every migration's Down section runs, newest
// first, back to an empty schema, and the migrations apply again after.
func TestMigrationsGoDown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := unmigratedPool(t)
	require.NoError(t, db.Migrate(ctx, pool, quiet))
	require.NoError(t, db.MigrateDownTo(ctx, pool, 0))
	var tables []string
	rows, err := pool.Query(ctx, `SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename <> 'goose_db_version' ORDER BY 1`)
	require.NoError(t, err)
	for rows.Next() {
		var name string
		require.NoError(t, rows.Scan(&name))
		tables = append(tables, name)
	}
	require.NoError(t, rows.Err())
	require.Empty(t, tables, "tables left after every Down")
	require.NoError(t, db.Migrate(ctx, pool, quiet), "migrating up again")
}

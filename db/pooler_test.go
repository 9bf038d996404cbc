package db_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/db"
	"github.com/bulwark-pds/bulwark/db/dbtest"
)

// TestPgBouncerTransactionMode: behind PgBouncer in transaction mode the
// server refuses to start without a direct URL, saying why; with one, the
// pooled pool works (statements described and sent unnamed, batches,
// transactions) and sessions go to the direct URL; a direct URL that goes
// through the pooler too is refused.
func TestPgBouncerTransactionMode(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	direct := dbtest.NewURL(t)
	pooled := dbtest.PgBouncer(t, direct, false)

	_, err := db.OpenPools(ctx, pooled, "", quiet)
	var pe *db.PoolerError
	require.ErrorAs(t, err, &pe)
	require.False(t, pe.Direct)

	_, err = db.OpenPools(ctx, pooled, pooled, quiet)
	require.ErrorAs(t, err, &pe)
	require.True(t, pe.Direct)

	pools, err := db.OpenPools(ctx, pooled, direct, quiet)
	require.NoError(t, err)
	defer pools.Close()
	require.True(t, pools.Pooled)
	require.NotSame(t, pools.Main, pools.Sessions)
	require.NoError(t, db.Migrate(ctx, pools.Sessions, quiet))

	// Many statements with arguments, over more client connections than
	// the pooler has server connections: each may land on any of them.
	errs := make(chan error, 16)
	for i := range 16 {
		go func() {
			var err error
			for j := range 20 {
				var got int
				if err = pools.Main.QueryRow(ctx, "SELECT $1::int + $2::int", i, j).Scan(&got); err != nil {
					break
				}
				if got != i+j {
					err = fmt.Errorf("%d+%d = %d", i, j, got)
					break
				}
				b := &pgx.Batch{}
				b.Queue("SELECT $1::text", "a")
				b.Queue("SELECT $1::bigint", int64(j))
				if err = pools.Main.SendBatch(ctx, b).Close(); err != nil {
					break
				}
				if err = pgx.BeginFunc(ctx, pools.Main, func(tx pgx.Tx) error {
					_, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", int64(i))
					return err
				}); err != nil {
					break
				}
			}
			errs <- err
		}()
	}
	for range 16 {
		require.NoError(t, <-errs)
	}

	// Sessions reach Postgres itself.
	isPooled, err := db.DetectPooler(ctx, pools.Sessions)
	require.NoError(t, err)
	require.False(t, isPooled)
}

// TestPgBouncerIgnoringSettings: a PgBouncer that passes over the
// session settings instead of refusing them is still found out, by the
// server connections its client connections share.
func TestPgBouncerIgnoringSettings(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pooled := dbtest.PgBouncer(t, dbtest.NewURL(t), true)
	pool, err := db.Open(ctx, pooled, quiet)
	require.NoError(t, err)
	defer pool.Close()
	isPooled, err := db.DetectPooler(ctx, pool)
	require.NoError(t, err)
	require.True(t, isPooled)
	_, err = db.OpenPools(ctx, pooled, "", quiet)
	var pe *db.PoolerError
	require.ErrorAs(t, err, &pe)
}

// TestDetectPoolerDirect: a direct pool is never taken for a pooler.
func TestDetectPoolerDirect(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.New(t)
	for range 3 {
		isPooled, err := db.DetectPooler(ctx, pool)
		require.NoError(t, err)
		require.False(t, isPooled)
	}
	pools, err := db.OpenPools(ctx, pool.Config().ConnString(), "", quiet)
	require.NoError(t, err)
	defer pools.Close()
	require.False(t, pools.Pooled)
	require.Same(t, pools.Main, pools.Sessions)
}

// TestTranslateUnavailable: a server that goes away (its backend ended,
// as when Postgres stops for a failover) is db.ErrUnavailable, as is a
// connection that cannot be made; a caller's cancellation is not.
func TestTranslateUnavailable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.New(t)
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	var pid int32
	require.NoError(t, conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid))
	_, err = pool.Exec(ctx, "SELECT pg_terminate_backend($1)", pid)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "SELECT 1")
	require.ErrorIs(t, db.Translate(err), db.ErrUnavailable, "%v", err)
	_, err = conn.Exec(ctx, "SELECT 1")
	require.ErrorIs(t, db.Translate(err), db.ErrUnavailable, "%v", err)

	// A pipeline (a group of commits) whose connection is cut without a
	// word from the server (a host gone, a network cut): the bare read
	// error comes back.
	proxied, cut := cuttableProxy(t, pool.Config().ConnString())
	ppool, err := db.Open(ctx, proxied, quiet)
	require.NoError(t, err)
	defer ppool.Close()
	bconn, err := ppool.Acquire(ctx)
	require.NoError(t, err)
	defer bconn.Release()
	cut()
	b := &pgx.Batch{}
	b.Queue("SELECT 1")
	b.Queue("SELECT 2")
	err = bconn.SendBatch(ctx, b).Close()
	require.ErrorIs(t, db.TranslateCall(err), db.ErrUnavailable, "%v", err)
	// The same bare error from anywhere else (a handler's own read) is
	// not taken for the database's.
	require.False(t, errors.Is(db.Translate(io.ErrUnexpectedEOF), db.ErrUnavailable))

	_, err = db.Open(ctx, "postgres://u@127.0.0.1:1/d?connect_timeout=2", quiet)
	require.ErrorIs(t, db.Translate(err), db.ErrUnavailable, "%v", err)

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = pool.Exec(cctx, "SELECT 1")
	require.False(t, errors.Is(db.Translate(err), db.ErrUnavailable), "%v", err)
}

// cuttableProxy forwards TCP connections to the Unix socket of the
// database at dsn, and returns a URL through it and a function that cuts
// every connection (closing the sockets, as a vanished host would).
func cuttableProxy(t *testing.T, dsn string) (string, func()) {
	t.Helper()
	cfg, err := pgconn.ParseConfig(dsn)
	require.NoError(t, err)
	sock := fmt.Sprintf("%s/.s.PGSQL.%d", cfg.Host, cfg.Port)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("unix", sock)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, s)
			mu.Unlock()
			go func() { _, _ = io.Copy(s, c); s.Close() }()
			go func() { _, _ = io.Copy(c, s); c.Close() }()
		}
	}()
	url := fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable", cfg.User, ln.Addr(), cfg.Database)
	return url, func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	}
}

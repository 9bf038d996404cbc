// Package dbtest gives each test its own freshly migrated Postgres
// database.
//
// A test binary starts one throwaway cluster (with db.StartManaged, the
// code the server uses) the first time a test asks for a database, migrates
// a template database once, and clones it for every test: a clone is a file
// copy inside Postgres, so tests stay independent at little cost and can run
// in parallel. With BULWARK_TEST_DATABASE_URL set, that server is used
// instead of a throwaway cluster.
//
//	func TestMain(m *testing.M) { dbtest.Main(m) }
//
//	func TestThing(t *testing.T) {
//		t.Parallel()
//		pool := dbtest.New(t)
//		...
//	}
package dbtest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	_ "embed"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/db"
	"github.com/bulwark-pds/bulwark/migrations"
)

// EnvURL names the environment variable that points tests at an existing
// server (any database on it; the role must be allowed to create
// databases) instead of a throwaway cluster.
const EnvURL = "BULWARK_TEST_DATABASE_URL"

//go:embed dbtest.sql
var querySQL string

var queries = db.MustParseQueries(querySQL)

// Directory names under os.TempDir(). A cluster directory carries the pid
// of the test binary that owns it, so later runs can tell leftovers of
// killed binaries from clusters in use.
const (
	clusterPrefix = "bulwark-pg-"
	cachePrefix   = "bulwark-pg-cache-"
)

var (
	setupOnce sync.Once
	shared    *server
	setupErr  error
	cloneSeq  atomic.Int64
)

// server is the per-process test server.
type server struct {
	managed  *db.Managed // nil when using BULWARK_TEST_DATABASE_URL
	dir      string      // cluster directory, removed at the end
	external *url.URL    // BULWARK_TEST_DATABASE_URL
	admin    *pgxpool.Pool
	template string
	runID    string // prefixes database names: unique per process
	// cloneQuery is the fastest CREATE DATABASE form the server knows.
	cloneQuery string
}

// logger drops the cluster's routine messages but shows warnings, such as
// an orphaned server being stopped.
var logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

// Main runs the package's tests and stops the throwaway cluster afterwards.
// Use it from TestMain:
//
//	func TestMain(m *testing.M) { dbtest.Main(m) }
//
// Without it the cluster still goes away when the test binary exits (the
// kernel signals it), but its directory is only removed by a later run.
func Main(m *testing.M) {
	code := m.Run()
	shutdown()
	for _, f := range atExit {
		f()
	}
	os.Exit(code)
}

// atExit holds what Main runs once the tests are over (Durable's cleanup).
var atExit []func()

// Durable returns a pool on a fresh, migrated database in a cluster on
// disk with fsync and synchronous_commit on (the shared test cluster runs
// with them off), for benchmarks whose figures must include a real WAL
// flush, and the cluster itself (for ServerCPU). The cluster starts once
// per test binary, in /var/tmp (a tmpfs /tmp would flush nothing), with
// extra settings from BENCH_PG_SETTINGS (comma-separated name=value, e.g.
// shared_preload_libraries=pg_stat_statements); Main stops and deletes it.
func Durable(tb testing.TB) (*pgxpool.Pool, *db.Managed) {
	tb.Helper()
	ctx := context.Background()
	durableOnce.Do(func() {
		dir, err := os.MkdirTemp("/var/tmp", "bulwark-bench-")
		if err != nil {
			durableErr = err
			return
		}
		_ = os.Chmod(dir, 0o711)
		var settings []string
		if v := os.Getenv("BENCH_PG_SETTINGS"); v != "" {
			settings = strings.Split(v, ",")
		}
		m, err := db.StartManaged(ctx, db.ManagedConfig{Dir: dir, StopWithParent: true, Settings: settings})
		if err != nil {
			_ = os.RemoveAll(dir)
			durableErr = err
			return
		}
		durable = m
		atExit = append(atExit, func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := m.Stop(ctx); err != nil {
				fmt.Fprintf(os.Stderr, "dbtest: stop benchmark cluster: %v\n", err)
			}
			_ = os.RemoveAll(dir)
		})
	})
	require.NoError(tb, durableErr)
	admin, err := db.Open(ctx, durable.URL(db.ManagedDatabase), logger)
	require.NoError(tb, err)
	defer admin.Close()
	name := fmt.Sprintf("bench_%d_%d", os.Getpid(), durableDBs.Add(1))
	_, err = admin.Exec(ctx, "CREATE DATABASE "+name)
	require.NoError(tb, err)
	pool, err := db.Open(ctx, durable.URL(name), logger)
	require.NoError(tb, err)
	require.NoError(tb, db.Migrate(ctx, pool, logger))
	tb.Cleanup(pool.Close)
	return pool, durable
}

var (
	durableOnce sync.Once
	durable     *db.Managed
	durableErr  error
	durableDBs  atomic.Int64
)

// New returns a pool on a fresh database cloned from the migrated template.
// The pool is closed and the database dropped when the test ends. Safe to
// call from parallel tests.
func New(t testing.TB) *pgxpool.Pool {
	t.Helper()
	u := NewURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := db.Open(ctx, u, logger)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// NewURL is New returning the connection URL of the fresh database instead
// of a pool, for tests that start a server or a subprocess against it. The
// database is dropped when the test ends, disconnecting any sessions left.
func NewURL(t testing.TB) string {
	t.Helper()
	setupOnce.Do(func() { shared, setupErr = setup() })
	if setupErr != nil {
		t.Fatalf("dbtest: %v", setupErr)
	}
	s := shared
	name := fmt.Sprintf("test_%s_%d", s.runID, cloneSeq.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, s.clone(ctx, name))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := s.exec(ctx, "DropDatabase", name); err != nil {
			t.Errorf("dbtest: drop database %s: %v", name, err)
		}
	})
	return s.urlFor(name)
}

func setup() (*server, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	s := &server{runID: randomHex(4)}
	var err error
	if raw := os.Getenv(EnvURL); raw != "" {
		if s.external, err = url.Parse(raw); err != nil || s.external.Scheme == "" {
			return nil, fmt.Errorf("%s must be a postgres:// URL", EnvURL)
		}
		if s.admin, err = db.Open(ctx, raw, logger); err != nil {
			return nil, err
		}
	} else {
		if err := s.startCluster(ctx); err != nil {
			return nil, err
		}
	}
	if s.template, err = templateName(); err != nil {
		shutdownServer(s)
		return nil, err
	}
	var version int
	if err := s.admin.QueryRow(ctx, queries.MustGet("ServerVersion")).Scan(&version); err != nil {
		shutdownServer(s)
		return nil, err
	}
	s.cloneQuery = "CloneDatabase"
	if version >= 150000 {
		s.cloneQuery = "CloneDatabaseFileCopy"
	}
	if err := s.ensureTemplate(ctx); err != nil {
		shutdownServer(s)
		return nil, err
	}
	return s, nil
}

// startCluster starts this process's throwaway cluster in a new directory
// under scratchDir(), which (unlike t.TempDir) is traversable by the
// postgres user when running as root; StartManaged hands the cluster
// directory itself to that user.
func (s *server) startCluster(ctx context.Context) error {
	tmp := scratchDir()
	removeLeftovers(os.TempDir())
	removeLeftovers(shmDir)
	dir, err := os.MkdirTemp(tmp, fmt.Sprintf("%s%d-", clusterPrefix, os.Getpid()))
	if err != nil {
		return err
	}
	s.dir = dir
	s.managed, err = db.StartManaged(ctx, db.ManagedConfig{
		Dir:            dir,
		Logger:         logger,
		Fast:           true,
		InitCache:      filepath.Join(tmp, fmt.Sprintf("%s%d", cachePrefix, os.Geteuid())),
		StopWithParent: true,
	})
	if err != nil {
		_ = os.RemoveAll(dir)
		return err
	}
	s.admin, err = db.Open(ctx, s.managed.URL("postgres"), logger)
	if err != nil {
		shutdownServer(s)
		return err
	}
	return nil
}

// shmDir is a memory-backed file system on Linux.
const shmDir = "/dev/shm"

// minShmFree is the free space /dev/shm needs before clusters go there:
// container runtimes often mount a 64MB one, which a cluster would fill.
const minShmFree = 2 << 30

// scratchDir picks where throwaway clusters live. Creating a database on
// this machine's disk took ~350ms even with fsync off, against ~35ms on
// tmpfs, and every test creates one; so /dev/shm when it is large enough,
// else os.TempDir().
func scratchDir() string {
	var st syscall.Statfs_t
	if err := syscall.Statfs(shmDir, &st); err == nil && uint64(st.Bavail)*uint64(st.Bsize) >= minShmFree {
		if syscall.Access(shmDir, 0x2 /* W_OK */) == nil {
			return shmDir
		}
	}
	return os.TempDir()
}

// removeLeftovers deletes cluster directories of test binaries that no
// longer run (killed by a timeout, say). Their servers went down with them
// (StopWithParent); one still running is left alone.
func removeLeftovers(tmp string) {
	matches, _ := filepath.Glob(filepath.Join(tmp, clusterPrefix+"*"))
	for _, dir := range matches {
		rest := strings.TrimPrefix(filepath.Base(dir), clusterPrefix)
		pidStr, _, ok := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidStr)
		if !ok || err != nil || pid <= 0 || alive(pid) {
			continue
		}
		if b, err := os.ReadFile(filepath.Join(dir, "data", "postmaster.pid")); err == nil {
			line, _, _ := strings.Cut(string(b), "\n")
			if pm, err := strconv.Atoi(strings.TrimSpace(line)); err == nil && alive(pm) {
				continue
			}
		}
		_ = os.RemoveAll(dir)
	}
}

// alive reports whether a process with this pid exists.
func alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// shutdown stops the process's cluster, if one was started.
func shutdown() {
	if shared != nil {
		shutdownServer(shared)
	}
}

func shutdownServer(s *server) {
	if s.admin != nil {
		s.admin.Close()
	}
	if s.managed != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := s.managed.Stop(ctx); err != nil {
			fmt.Fprintf(os.Stderr, "dbtest: stop cluster: %v\n", err)
		}
	}
	if s.dir != "" {
		_ = os.RemoveAll(s.dir)
	}
}

// templateName names the template after the migrations it holds, so test
// runs of different branches sharing one external server do not clash, and
// a changed migration gets a new template rather than a stale one.
func templateName() (string, error) {
	h := sha256.New()
	err := fs.WalkDir(migrations.FS, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(migrations.FS, path)
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s\x00%d\x00", path, len(b))
		h.Write(b)
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("hash migrations: %w", err)
	}
	return "bulwark_template_" + hex.EncodeToString(h.Sum(nil)[:6]), nil
}

// ensureTemplate creates and migrates the template unless a finished one
// exists. Test processes sharing a server take turns on an advisory lock;
// a template is marked finished by being sealed (IS_TEMPLATE, no
// connections), so one left half-migrated by a killed process is rebuilt.
func (s *server) ensureTemplate(ctx context.Context) error {
	conn, err := s.admin.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	sum := sha256.Sum256([]byte(s.template))
	key := int64(binary.BigEndian.Uint64(sum[:8]))
	if _, err := conn.Exec(ctx, queries.MustGet("LockTemplate"), key); err != nil {
		return fmt.Errorf("lock template: %w", err)
	}
	defer func() { _, _ = conn.Exec(context.Background(), queries.MustGet("UnlockTemplate"), key) }()

	var sealed bool
	err = conn.QueryRow(ctx, queries.MustGet("TemplateState"), s.template).Scan(&sealed)
	switch {
	case err == nil && sealed:
		return nil
	case err == nil:
		if err := s.exec(ctx, "DropDatabase", s.template); err != nil {
			return fmt.Errorf("drop unfinished template: %w", err)
		}
	case !errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("template state: %w", err)
	}
	if err := s.exec(ctx, "CreateDatabase", s.template); err != nil {
		return fmt.Errorf("create template: %w", err)
	}
	pool, err := db.Open(ctx, s.urlFor(s.template), logger)
	if err != nil {
		return err
	}
	err = db.Migrate(ctx, pool, logger)
	// Cloning needs the template free of sessions: close before sealing.
	pool.Close()
	if err != nil {
		return fmt.Errorf("migrate template: %w", err)
	}
	if err := s.exec(ctx, "SealTemplate", s.template); err != nil {
		return fmt.Errorf("seal template: %w", err)
	}
	return nil
}

// clone creates database name from the template. Postgres refuses while
// any session is on the template; it waits a few seconds on its own, and
// a lingering backend of the pool that migrated it can outlast that on a
// loaded machine, so retry.
func (s *server) clone(ctx context.Context, name string) error {
	for attempt := 0; ; attempt++ {
		err := s.exec(ctx, s.cloneQuery, name, s.template)
		var pgErr *pgconn.PgError
		if err == nil || attempt >= 20 || !errors.As(err, &pgErr) || pgErr.Code != "55006" {
			if err != nil {
				return fmt.Errorf("clone template: %w", err)
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// exec runs a named statement whose %s placeholders are database names.
func (s *server) exec(ctx context.Context, query string, names ...string) error {
	args := make([]any, len(names))
	for i, n := range names {
		args[i] = pgx.Identifier{n}.Sanitize()
	}
	_, err := s.admin.Exec(ctx, fmt.Sprintf(queries.MustGet(query), args...))
	return err
}

// urlFor returns the URL of database name on the test server.
func (s *server) urlFor(name string) string {
	if s.managed != nil {
		return s.managed.URL(name)
	}
	u := *s.external
	u.Path = "/" + name
	u.RawPath = ""
	return u.String()
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

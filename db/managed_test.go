package db_test

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/db"
)

// scratch returns the directory managed-cluster tests work under: tmpfs
// when there is a roomy one (as dbtest does), since cluster file
// operations on this disk are slow.
func scratch() string {
	var st syscall.Statfs_t
	if err := syscall.Statfs("/dev/shm", &st); err == nil && uint64(st.Bavail)*uint64(st.Bsize) >= 2<<30 {
		return "/dev/shm"
	}
	return os.TempDir()
}

// clusterDir returns a new directory for a cluster, removed when the test
// ends. The name carries this process's pid so that dbtest's leftover sweep
// recognises it if the test binary is killed.
func clusterDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp(scratch(), fmt.Sprintf("bulwark-pg-%d-", os.Getpid()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// testConfig is a fast managed cluster in dir, copying the same cached
// initdb output as dbtest.
func testConfig(dir string) db.ManagedConfig {
	return db.ManagedConfig{
		Dir:            dir,
		Fast:           true,
		InitCache:      filepath.Join(scratch(), fmt.Sprintf("bulwark-pg-cache-%d", os.Geteuid())),
		StopWithParent: true,
		Logger:         quiet,
	}
}

var quiet = slog.New(slog.DiscardHandler)

func startManaged(t *testing.T, cfg db.ManagedConfig) *db.Managed {
	t.Helper()
	m, err := db.StartManaged(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Stop(context.Background()) })
	return m
}

func connect(t *testing.T, m *db.Managed) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, m.URL(db.ManagedDatabase))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(ctx) })
	return conn
}

func TestManagedRestartKeepsData(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := clusterDir(t)
	// The durable settings, as bulwark serve uses them, and a real initdb.
	cfg := db.ManagedConfig{Dir: dir, Logger: quiet}

	m := startManaged(t, cfg)
	conn := connect(t, m)
	_, err := conn.Exec(ctx, `CREATE TABLE kept (v text); INSERT INTO kept VALUES ('before restart')`)
	require.NoError(t, err)
	var fsync string
	require.NoError(t, conn.QueryRow(ctx, `SHOW fsync`).Scan(&fsync))
	require.Equal(t, "on", fsync)
	require.NoError(t, conn.Close(ctx))
	require.NoError(t, m.Stop(ctx))
	require.NoError(t, m.Stop(ctx), "a second Stop is a no-op")
	_, err = os.Stat(filepath.Join(dir, "data", "postmaster.pid"))
	require.ErrorIs(t, err, os.ErrNotExist, "clean shutdown removes the lock file")

	m2 := startManaged(t, cfg)
	var v string
	require.NoError(t, connect(t, m2).QueryRow(ctx, `SELECT v FROM kept`).Scan(&v))
	require.Equal(t, "before restart", v)

	log, err := os.ReadFile(filepath.Join(dir, "postgres.log"))
	require.NoError(t, err)
	require.Contains(t, string(log), "database system is ready to accept connections")
}

func TestManagedFastSettings(t *testing.T) {
	t.Parallel()
	m := startManaged(t, testConfig(clusterDir(t)))
	conn := connect(t, m)
	for setting, want := range map[string]string{
		"fsync":              "off",
		"synchronous_commit": "off",
		"full_page_writes":   "off",
		"listen_addresses":   "",
		"server_encoding":    "UTF8",
		"lc_collate":         "C",
	} {
		var got string
		require.NoError(t, conn.QueryRow(context.Background(), "SELECT current_setting($1)", setting).Scan(&got))
		require.Equal(t, want, got, setting)
	}
}

// deadPid returns the pid of a process that has exited.
func deadPid(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("true")
	require.NoError(t, cmd.Run())
	return cmd.Process.Pid
}

func TestManagedStalePidFile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := clusterDir(t)
	cfg := testConfig(dir)
	m := startManaged(t, cfg)
	require.NoError(t, m.Stop(ctx))

	// What a power cut leaves: lock files naming a process long gone.
	pid := deadPid(t)
	stale := fmt.Sprintf("%d\n%s\n1700000000\n5432\n%s\n\n  5432001         0\nready   \n", pid, filepath.Join(dir, "data"), dir)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "data", "postmaster.pid"), []byte(stale), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, ".s.PGSQL.5432.lock"), []byte(stale), 0o600))

	m2 := startManaged(t, cfg)
	var one int
	require.NoError(t, connect(t, m2).QueryRow(ctx, `SELECT 1`).Scan(&one))
}

// helperDirEnv makes the test binary act as a bulwark process that starts
// a cluster and waits to be killed (see TestManagedOrphanedServer).
const helperDirEnv = "BULWARK_TEST_MANAGED_HELPER_DIR"

func TestManagedHelperProcess(t *testing.T) {
	dir := os.Getenv(helperDirEnv)
	if dir == "" {
		t.Skip("helper for TestManagedOrphanedServer")
	}
	cfg := testConfig(dir)
	cfg.StopWithParent = false // as bulwark serve: the server outlives us
	m, err := db.StartManaged(context.Background(), cfg)
	require.NoError(t, err)
	fmt.Println("ready")
	<-m.Done()
}

func TestManagedOrphanedServer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := clusterDir(t)

	// A bulwark process that is kill -9'd leaves its Postgres running.
	helper := exec.Command(os.Args[0], "-test.run=^TestManagedHelperProcess$")
	helper.Env = append(os.Environ(), helperDirEnv+"="+dir)
	out, err := helper.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, helper.Start())
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "ready\n", line)
	pidFile, err := os.ReadFile(filepath.Join(dir, "data", "postmaster.pid"))
	require.NoError(t, err)
	orphanPid, err := strconv.Atoi(strings.SplitN(string(pidFile), "\n", 2)[0])
	require.NoError(t, err)
	require.NoError(t, helper.Process.Kill())
	_ = helper.Wait()
	require.NoError(t, syscall.Kill(orphanPid, 0), "the orphan outlived its owner")

	m := startManaged(t, testConfig(dir))
	var pid int
	conn := connect(t, m)
	require.NoError(t, conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
	pidFile, err = os.ReadFile(filepath.Join(dir, "data", "postmaster.pid"))
	require.NoError(t, err)
	require.NotEqual(t, strconv.Itoa(orphanPid), strings.SplitN(string(pidFile), "\n", 2)[0], "the orphan was replaced")
}

// Two live processes must not share a cluster: the second is refused
// rather than treating the first one's server as an orphan.
func TestManagedDirInUse(t *testing.T) {
	t.Parallel()
	cfg := testConfig(clusterDir(t))
	m := startManaged(t, cfg)
	_, err := db.StartManaged(context.Background(), cfg)
	require.Error(t, err)
	require.Contains(t, err.Error(), "in use by another process")
	select {
	case <-m.Done():
		t.Fatal("the refused start stopped the running server")
	default:
	}
}

func TestManagedMissingBinaries(t *testing.T) {
	t.Parallel()
	cfg := testConfig(clusterDir(t))
	cfg.BinDir = t.TempDir()
	_, err := db.StartManaged(context.Background(), cfg)
	require.Error(t, err)
	require.Contains(t, err.Error(), "apt-get install postgresql")
	require.Contains(t, err.Error(), cfg.BinDir)
}

func TestManagedUntraversableParent(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("only root hands the cluster to another user")
	}
	// t.TempDir is 0700 and root's: the postgres user cannot enter it.
	parent := t.TempDir()
	cfg := testConfig(filepath.Join(parent, "cluster"))
	_, err := db.StartManaged(context.Background(), cfg)
	require.Error(t, err)
	require.Contains(t, err.Error(), parent)
	require.Contains(t, err.Error(), "not traversable")
}

// A cluster directory whose socket path would overflow sun_path gets its
// socket in a short directory instead.
func TestManagedLongPath(t *testing.T) {
	t.Parallel()
	parent := clusterDir(t)
	require.NoError(t, os.Chmod(parent, 0o711)) // let the postgres user through
	dir := filepath.Join(parent, strings.Repeat("d", 100))
	m := startManaged(t, testConfig(dir))
	require.NotContains(t, m.URL("x"), strings.Repeat("d", 100))
	var one int
	require.NoError(t, connect(t, m).QueryRow(context.Background(), `SELECT 1`).Scan(&one))
}

package db

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/bulwark-pds/bulwark/procstat"
)

//go:embed managed.sql
var managedSQL string

var managedQueries = MustParseQueries(managedSQL)

// ManagedDatabase is the database StartManaged creates for the server.
const ManagedDatabase = "bulwark"

// Layout of a managed cluster directory.
const (
	managedDataDir = "data"         // PGDATA
	managedLogFile = "postgres.log" // server output, appended across runs
	// managedLockFile is flocked by the process managing the cluster. The
	// kernel drops the lock when that process dies however it dies, so
	// holding it proves a server still running on the directory is an
	// orphan, not the database of another live bulwark.
	managedLockFile = "bulwark.lock"
	// The superuser initdb creates; trust authentication on the socket,
	// whose directory only the server's user can enter, stands in for a
	// password.
	managedSuperuser = "postgres"
	// sunPathMax is the longest socket path the kernel accepts
	// (sizeof(sun_path) minus the terminating NUL).
	sunPathMax = 107
	socketName = ".s.PGSQL.5432"
)

// ManagedConfig configures StartManaged. The zero value of every field but
// Dir works.
type ManagedConfig struct {
	// Dir is the cluster directory, e.g. <data-dir>/postgres. It holds the
	// data directory ("data"), the server log ("postgres.log") and, when
	// its path is short enough, the Unix socket.
	Dir string
	// BinDir holds initdb and postgres. "" searches PATH, pg_config
	// --bindir and /usr/lib/postgresql/*/bin, preferring the version that
	// created an existing cluster, else the highest.
	BinDir string
	// Logger receives lifecycle messages; nil means slog.Default().
	Logger *slog.Logger
	// Fast turns off fsync, synchronous_commit and full_page_writes, so a
	// crash may lose or corrupt data. For throwaway test clusters only.
	Fast bool
	// User is the account Postgres runs as when this process is root
	// (Postgres refuses to run as root). "" means "postgres". Ignored when
	// not root.
	User string
	// InitCache, if set, is a directory in which one freshly initdb'd data
	// directory per Postgres version is kept and copied into new clusters
	// instead of running initdb: a copy takes a fraction of initdb's time,
	// which matters when every test binary starts its own cluster.
	InitCache string
	// StopWithParent has the kernel send Postgres a fast-shutdown signal
	// when the thread that started it dies, so a killed test binary leaves
	// no server behind. Servers leave it off: Go may retire threads, and a
	// restarted server finds and stops an orphan anyway.
	StopWithParent bool
	// Settings are extra server settings ("name=value"), applied after
	// Bulwark's own, so they win: e.g. "shared_buffers=1GB" on a large
	// machine, or "shared_preload_libraries=pg_stat_statements" to profile.
	Settings []string
	// StartTimeout bounds the wait for the server to accept connections,
	// which includes crash recovery. 0 means two minutes.
	StartTimeout time.Duration
}

// Managed is a Postgres cluster run as a child of this process.
type Managed struct {
	logger  *slog.Logger
	dir     string // cluster directory, absolute
	dataDir string
	sockDir string
	binDir  string
	cred    *syscall.Credential // nil unless running as root

	lockFile *os.File
	logFile  *os.File
	cmd      *exec.Cmd
	done     chan struct{} // closed once the postmaster has exited
	waitErr  error         // set before done is closed

	stopOnce sync.Once
	stopErr  error
}

// StartManaged initialises (on first run) and starts a cluster in cfg.Dir,
// listening only on a Unix socket, waits until it accepts connections and
// creates the database "bulwark" if missing. A server left running by a
// previous process that died without stopping it is shut down first.
func StartManaged(ctx context.Context, cfg ManagedConfig) (*Managed, error) {
	if cfg.Dir == "" {
		return nil, errors.New("db: managed postgres: no cluster directory")
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("db: managed postgres: %w", err)
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.Default()
	}
	m := &Managed{
		logger:  logger.With("component", "postgres", "dir", dir),
		dir:     dir,
		dataDir: filepath.Join(dir, managedDataDir),
		done:    make(chan struct{}),
	}

	existing := ""
	if b, err := os.ReadFile(filepath.Join(m.dataDir, "PG_VERSION")); err == nil {
		existing = strings.TrimSpace(string(b))
	}
	m.binDir, err = findBinDir(ctx, cfg.BinDir, existing)
	if err != nil {
		return nil, err
	}

	if os.Geteuid() == 0 {
		if m.cred, err = serviceCredential(cfg.User); err != nil {
			return nil, err
		}
	}
	if err := m.prepareDir(dir); err != nil {
		return nil, err
	}
	if m.sockDir, err = m.socketDir(); err != nil {
		return nil, err
	}
	if err := m.lock(); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			_ = m.lockFile.Close()
		}
	}()
	m.logFile, err = os.OpenFile(filepath.Join(dir, managedLogFile), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("db: managed postgres: open log: %w", err)
	}
	defer func() {
		if !ok {
			_ = m.logFile.Close()
		}
	}()

	if err := m.initCluster(ctx, cfg); err != nil {
		return nil, err
	}
	if err := m.clearPrevious(ctx); err != nil {
		return nil, err
	}
	if err := m.start(cfg); err != nil {
		return nil, err
	}
	timeout := cfg.StartTimeout
	if timeout <= 0 {
		timeout = 2 * time.Minute
	}
	if err := m.waitReady(ctx, timeout); err != nil {
		_ = m.Stop(context.Background())
		return nil, err
	}
	if err := m.ensureDatabase(ctx, ManagedDatabase); err != nil {
		_ = m.Stop(context.Background())
		return nil, err
	}
	ok = true
	m.logger.Info("managed postgres ready", "pid", m.cmd.Process.Pid, "socket_dir", m.sockDir)
	return m, nil
}

// URL returns a pgx connection URL for database on the managed cluster.
func (m *Managed) URL(database string) string {
	q := url.Values{"host": {m.sockDir}, "sslmode": {"disable"}}
	u := url.URL{
		Scheme:   "postgres",
		User:     url.User(managedSuperuser),
		Path:     "/" + database,
		RawQuery: q.Encode(),
	}
	return u.String()
}

// Dir returns the cluster directory.
func (m *Managed) Dir() string { return m.dir }

// ServerCPU is the CPU time (user + system) used so far by the postmaster
// and its live children (backends, WAL writer, checkpointer, ...), read
// from /proc: benchmarks take the difference over a run to attribute CPU
// to Postgres. Children that have exited are not counted.
func (m *Managed) ServerCPU() (time.Duration, error) {
	pm := strconv.Itoa(m.cmd.Process.Pid)
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	var total time.Duration
	for _, e := range ents {
		st, err := procstat.Read("/proc/" + e.Name() + "/stat")
		if err != nil || (e.Name() != pm && st.PPID() != pm) {
			continue
		}
		if cpu, err := st.CPU(); err == nil {
			total += cpu
		}
	}
	return total, nil
}

// Done is closed when the server process exits, whether stopped or not:
// a server can watch it to shut down instead of failing every request.
func (m *Managed) Done() <-chan struct{} { return m.done }

// ensureDatabase creates database name unless it exists.
func (m *Managed) ensureDatabase(ctx context.Context, name string) error {
	conn, err := pgx.Connect(ctx, m.URL("postgres"))
	if err != nil {
		return fmt.Errorf("db: managed postgres: %w", err)
	}
	defer conn.Close(ctx)
	var exists bool
	if err := conn.QueryRow(ctx, managedQueries.MustGet("DatabaseExists"), name).Scan(&exists); err != nil {
		return fmt.Errorf("db: managed postgres: %w", err)
	}
	if exists {
		return nil
	}
	stmt := fmt.Sprintf(managedQueries.MustGet("CreateDatabase"), pgx.Identifier{name}.Sanitize())
	if _, err := conn.Exec(ctx, stmt); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42P04" { // created meanwhile
			return nil
		}
		return fmt.Errorf("db: managed postgres: create database %s: %w", name, err)
	}
	m.logger.Info("created database", "database", name)
	return nil
}

package db

import (
	"bytes"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
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

// Stop shuts the cluster down with a fast shutdown (open transactions are
// rolled back, data is checkpointed) and waits for it to exit. If it has
// not exited when ctx ends (or after a minute if ctx has no deadline) it
// is sent an immediate shutdown, which needs crash recovery on next start.
// Calling Stop again returns the first result.
func (m *Managed) Stop(ctx context.Context) error {
	m.stopOnce.Do(func() { m.stopErr = m.stop(ctx) })
	return m.stopErr
}

func (m *Managed) stop(ctx context.Context) error {
	// Deferred first, so released last: only once the server is down may
	// another process treat the directory as free.
	defer m.lockFile.Close()
	defer m.logFile.Close()
	if m.sockDir != m.dir {
		// The server removes its socket on exit; the short directory made
		// for it under /tmp would otherwise pile up. Remove fails, as it
		// should, if anything is still inside.
		defer os.Remove(m.sockDir)
	}
	select {
	case <-m.done:
		if m.waitErr != nil {
			return fmt.Errorf("db: managed postgres had already exited: %w", m.waitErr)
		}
		return nil
	default:
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Minute)
		defer cancel()
	}
	_ = m.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-m.done:
		m.logger.Info("managed postgres stopped")
		return nil
	case <-ctx.Done():
	}
	m.logger.Warn("managed postgres slow to stop; sending immediate shutdown")
	_ = m.cmd.Process.Signal(syscall.SIGQUIT)
	select {
	case <-m.done:
		return nil
	case <-time.After(10 * time.Second):
	}
	_ = m.cmd.Process.Kill()
	<-m.done
	return errors.New("db: managed postgres ignored shutdown signals and was killed")
}

// lock takes the cluster directory's lock file, failing at once if another
// live process manages the cluster.
func (m *Managed) lock() error {
	path := filepath.Join(m.dir, managedLockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("db: managed postgres: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder, _ := os.ReadFile(path)
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return fmt.Errorf("db: managed postgres: %s is in use by another process (pid %s)", m.dir, strings.TrimSpace(string(holder)))
		}
		return fmt.Errorf("db: managed postgres: lock %s: %w", path, err)
	}
	// The pid is for the error message above; the lock is what counts.
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	m.lockFile = f
	return nil
}

// serviceCredential resolves the account Postgres runs as under root.
func serviceCredential(name string) (*syscall.Credential, error) {
	if name == "" {
		name = "postgres"
	}
	u, err := user.Lookup(name)
	if err != nil {
		return nil, fmt.Errorf("db: managed postgres: running as root, and Postgres refuses to run as root, but user %q does not exist (apt-get install postgresql creates it; or run bulwark as a normal user): %w", name, err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("db: managed postgres: user %q has non-numeric ids", name)
	}
	cred := &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	if gids, err := u.GroupIds(); err == nil {
		for _, g := range gids {
			if n, err := strconv.ParseUint(g, 10, 32); err == nil {
				cred.Groups = append(cred.Groups, uint32(n))
			}
		}
	}
	return cred, nil
}

// prepareDir creates dir for the server's user and, under root, checks that
// this user can reach it: a 0700 directory anywhere above (os.MkdirTemp,
// t.TempDir, a home directory) would make initdb fail with a vaguer error.
func (m *Managed) prepareDir(dir string) error {
	parentPerm := os.FileMode(0o700)
	if m.cred != nil {
		parentPerm = 0o711 // traversable, not listable, by the server's user
	}
	if err := os.MkdirAll(filepath.Dir(dir), parentPerm); err != nil {
		return fmt.Errorf("db: managed postgres: %w", err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("db: managed postgres: %w", err)
	}
	if m.cred == nil {
		return nil
	}
	if err := os.Chown(dir, int(m.cred.Uid), int(m.cred.Gid)); err != nil {
		return fmt.Errorf("db: managed postgres: %w", err)
	}
	return checkTraversable(dir, m.cred)
}

// checkTraversable returns an error naming the first directory above dir
// that cred may not search.
func checkTraversable(dir string, cred *syscall.Credential) error {
	for d := filepath.Dir(dir); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return fmt.Errorf("db: managed postgres: %w", err)
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			perm := fi.Mode().Perm()
			var can bool
			switch {
			case st.Uid == cred.Uid:
				can = perm&0o100 != 0
			case st.Gid == cred.Gid || slices.Contains(cred.Groups, st.Gid):
				can = perm&0o010 != 0
			default:
				can = perm&0o001 != 0
			}
			if !can {
				return fmt.Errorf("db: managed postgres: directory %s (mode %04o) is not traversable by uid %d, which Postgres runs as because this process is root; it needs to reach %s: chmod o+x %s, or choose another directory",
					d, perm, cred.Uid, dir, d)
			}
		}
		if d == filepath.Dir(d) {
			return nil
		}
	}
}

// socketDir picks the socket directory: the cluster directory when the
// socket path fits in sun_path, else a short directory under /tmp (not
// $TMPDIR, which may itself be long) named after a hash of the cluster
// directory, so a restart finds the same one.
func (m *Managed) socketDir() (string, error) {
	if len(m.dir)+1+len(socketName) <= sunPathMax && !strings.ContainsAny(m.dir, ", '\"\\") {
		return m.dir, nil
	}
	sum := sha256.Sum256([]byte(m.dir))
	d := filepath.Join("/tmp", "bulwark-pg-sock-"+hex.EncodeToString(sum[:6]))
	if err := os.Mkdir(d, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return "", fmt.Errorf("db: managed postgres: socket directory: %w", err)
	}
	uid := uint32(os.Geteuid())
	if m.cred != nil {
		uid = m.cred.Uid
		if err := os.Chown(d, int(m.cred.Uid), int(m.cred.Gid)); err != nil {
			return "", fmt.Errorf("db: managed postgres: socket directory: %w", err)
		}
	}
	// A shared /tmp lets another user create this name first; the socket
	// is only as private as its directory, so refuse one we do not own.
	fi, err := os.Lstat(d)
	if err != nil {
		return "", fmt.Errorf("db: managed postgres: socket directory: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !fi.IsDir() || (ok && st.Uid != uid) || fi.Mode().Perm()&0o077 != 0 {
		return "", fmt.Errorf("db: managed postgres: socket directory %s is not a private directory owned by uid %d", d, uid)
	}
	return d, nil
}

// initCluster creates the data directory on first run. It is built under
// a temporary name and renamed, so a data directory exists only complete.
func (m *Managed) initCluster(ctx context.Context, cfg ManagedConfig) error {
	if _, err := os.Stat(filepath.Join(m.dataDir, "PG_VERSION")); err == nil {
		return nil
	}
	if _, err := os.Stat(m.dataDir); err == nil {
		return fmt.Errorf("db: managed postgres: %s exists but holds no Postgres cluster; move it away", m.dataDir)
	}
	tmp := m.dataDir + ".init"
	if err := os.RemoveAll(tmp); err != nil {
		return fmt.Errorf("db: managed postgres: %w", err)
	}
	start := time.Now()
	if cfg.InitCache != "" {
		src, err := m.cachedCluster(ctx, cfg)
		if err != nil {
			return err
		}
		// cp -a keeps ownership and modes, which Postgres checks, and is
		// faster than a walk in Go.
		if out, err := exec.CommandContext(ctx, "cp", "-a", src, tmp).CombinedOutput(); err != nil {
			return fmt.Errorf("db: managed postgres: copy cached cluster: %w: %s", err, out)
		}
	} else if err := m.initdb(ctx, tmp, cfg.Fast); err != nil {
		return err
	}
	if err := os.Rename(tmp, m.dataDir); err != nil {
		return fmt.Errorf("db: managed postgres: %w", err)
	}
	m.logger.Info("initialised postgres cluster", "duration", time.Since(start), "cached", cfg.InitCache != "")
	return nil
}

func (m *Managed) initdb(ctx context.Context, dataDir string, fast bool) error {
	args := []string{
		"-D", dataDir,
		"--username=" + managedSuperuser,
		// Trust only on the Unix socket; TCP is off, and would want a
		// password nobody has even if turned on.
		"--auth-local=trust", "--auth-host=scram-sha-256",
		// UTF8 with C collation: byte order, as atproto compares keys.
		"--encoding=UTF8", "--no-locale",
	}
	if fast {
		args = append(args, "--no-sync")
	}
	cmd := exec.CommandContext(ctx, filepath.Join(m.binDir, "initdb"), args...)
	cmd.Env = serverEnv()
	cmd.Stdout, cmd.Stderr = m.logFile, m.logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: m.cred}
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("db: managed postgres: initdb failed (see %s): %w\n%s", m.logFile.Name(), err, logTail(m.logFile.Name()))
	}
	return nil
}

// cachedCluster returns a pristine data directory from cfg.InitCache,
// running initdb into the cache first if needed. Concurrent processes may
// both run initdb; the first rename wins and the loser uses its result.
func (m *Managed) cachedCluster(ctx context.Context, cfg ManagedConfig) (string, error) {
	version, err := binVersion(ctx, m.binDir)
	if err != nil {
		return "", err
	}
	uid := os.Geteuid()
	if m.cred != nil {
		uid = int(m.cred.Uid)
	}
	sum := sha256.Sum256([]byte(fmt.Sprintf("%s|%s|%d|%t|v1", m.binDir, version, uid, cfg.Fast)))
	entry := filepath.Join(cfg.InitCache, "pg"+version+"-"+hex.EncodeToString(sum[:6]))
	data := filepath.Join(entry, managedDataDir)
	if _, err := os.Stat(filepath.Join(data, "PG_VERSION")); err == nil {
		return data, nil
	}
	perm := os.FileMode(0o700)
	if m.cred != nil {
		perm = 0o711
	}
	if err := os.MkdirAll(cfg.InitCache, perm); err != nil {
		return "", fmt.Errorf("db: managed postgres: init cache: %w", err)
	}
	removeStale(cfg.InitCache, filepath.Base(entry)+".tmp-*", time.Hour)
	staging, err := os.MkdirTemp(cfg.InitCache, filepath.Base(entry)+".tmp-")
	if err != nil {
		return "", fmt.Errorf("db: managed postgres: init cache: %w", err)
	}
	defer os.RemoveAll(staging)
	if m.cred != nil {
		if err := os.Chown(staging, int(m.cred.Uid), int(m.cred.Gid)); err != nil {
			return "", fmt.Errorf("db: managed postgres: init cache: %w", err)
		}
		if err := checkTraversable(staging, m.cred); err != nil {
			return "", err
		}
	}
	if err := m.initdb(ctx, filepath.Join(staging, managedDataDir), cfg.Fast); err != nil {
		return "", err
	}
	if err := os.Rename(staging, entry); err != nil {
		if _, statErr := os.Stat(filepath.Join(data, "PG_VERSION")); statErr != nil {
			return "", fmt.Errorf("db: managed postgres: init cache: %w", err)
		}
	}
	return data, nil
}

// removeStale deletes entries of dir matching pattern older than age:
// leftovers of processes killed half-way.
func removeStale(dir, pattern string, age time.Duration) {
	matches, _ := filepath.Glob(filepath.Join(dir, pattern))
	for _, p := range matches {
		if fi, err := os.Stat(p); err == nil && time.Since(fi.ModTime()) > age {
			_ = os.RemoveAll(p)
		}
	}
}

// clearPrevious deals with the lock files of a previous run. A server
// still running on this data directory is an orphan, since this process
// holds the directory lock; it is shut down (a clean shutdown beats
// adopting a server whose settings and log file we did not choose); lock files naming a dead or unrelated process are removed, since
// Postgres would otherwise refuse to start if that pid had been reused.
func (m *Managed) clearPrevious(ctx context.Context) error {
	pidFile := filepath.Join(m.dataDir, "postmaster.pid")
	if pid := readLockPid(pidFile); pid > 0 {
		if isPostmasterFor(pid, m.dataDir) {
			m.logger.Warn("stopping postgres left running by a previous process", "pid", pid)
			if err := stopOrphan(ctx, pid); err != nil {
				return err
			}
		} else {
			m.logger.Info("removing stale postmaster.pid", "pid", pid)
		}
		if err := os.Remove(pidFile); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("db: managed postgres: %w", err)
		}
	}
	sockLock := filepath.Join(m.sockDir, socketName+".lock")
	if pid := readLockPid(sockLock); pid > 0 && !isPostmasterFor(pid, m.dataDir) {
		if err := os.Remove(sockLock); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("db: managed postgres: %w", err)
		}
	}
	return nil
}

// readLockPid returns the pid on the first line of a Postgres lock file,
// or 0.
func readLockPid(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		return 0
	}
	if pid < 0 { // older servers wrote -pid for single-user backends
		pid = -pid
	}
	return pid
}

// processAlive reports whether pid exists and has not exited (a zombie,
// awaiting its parent's wait, counts as exited).
func processAlive(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return !errors.Is(err, os.ErrNotExist) || !procMounted()
	}
	// The state follows the parenthesised command name, which may itself
	// contain parentheses.
	if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) {
		return b[i+2] != 'Z' && b[i+2] != 'X'
	}
	return true
}

func procMounted() bool {
	_, err := os.Stat("/proc/self/stat")
	return err == nil
}

// isPostmasterFor reports whether pid is a live Postgres server for
// dataDir. The postmaster's working directory is its data directory, which
// tells it apart from an unrelated process that reused the pid. Without
// /proc the pid being alive has to do.
func isPostmasterFor(pid int, dataDir string) bool {
	if !processAlive(pid) {
		return false
	}
	if !procMounted() {
		return true
	}
	want, err := filepath.EvalSymlinks(dataDir)
	if err != nil {
		want = dataDir
	}
	if cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid)); err == nil {
		return cwd == want
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	return bytes.Contains(cmdline, []byte("postgres")) && bytes.Contains(cmdline, []byte(dataDir))
}

// stopOrphan shuts down a server this process did not start: fast
// shutdown, then immediate shutdown if it takes more than a minute. It is
// not our child, so its exit is observed by polling.
func stopOrphan(ctx context.Context, pid int) error {
	steps := []struct {
		sig     syscall.Signal
		timeout time.Duration
	}{{syscall.SIGINT, time.Minute}, {syscall.SIGQUIT, 10 * time.Second}, {syscall.SIGKILL, 10 * time.Second}}
	for _, s := range steps {
		if err := syscall.Kill(pid, s.sig); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("db: managed postgres: signal orphaned server %d: %w", pid, err)
		}
		deadline := time.Now().Add(s.timeout)
		for processAlive(pid) && time.Now().Before(deadline) {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(20 * time.Millisecond):
			}
		}
		if !processAlive(pid) {
			return nil
		}
	}
	return fmt.Errorf("db: managed postgres: orphaned server %d will not exit", pid)
}

// start launches the postmaster. It gets its own process group so that a
// Ctrl-C meant for the server does not also shut the database down under
// the requests still draining.
func (m *Managed) start(cfg ManagedConfig) error {
	settings := []string{
		"listen_addresses=",
		"unix_socket_directories=" + m.sockDir,
		"unix_socket_permissions=0700",
		"max_connections=100",
		"shared_buffers=128MB",
		"logging_collector=off",
	}
	if cfg.Fast {
		settings = []string{
			"listen_addresses=",
			"unix_socket_directories=" + m.sockDir,
			"unix_socket_permissions=0700",
			// Many parallel tests, each with its own pool.
			"max_connections=200",
			"shared_buffers=32MB",
			"logging_collector=off",
			"fsync=off",
			"synchronous_commit=off",
			"full_page_writes=off",
			"wal_level=minimal",
			"max_wal_senders=0",
		}
	}
	settings = append(settings, cfg.Settings...)
	args := []string{"-D", m.dataDir}
	for _, s := range settings {
		args = append(args, "-c", s)
	}
	fmt.Fprintf(m.logFile, "\n--- bulwark: starting postgres at %s\n", time.Now().UTC().Format(time.RFC3339))
	cmd := exec.Command(filepath.Join(m.binDir, "postgres"), args...)
	cmd.Dir = m.dataDir
	cmd.Env = serverEnv()
	cmd.Stdout, cmd.Stderr = m.logFile, m.logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: m.cred}
	if cfg.StopWithParent {
		cmd.SysProcAttr.Pdeathsig = syscall.SIGINT
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("db: managed postgres: start: %w", err)
	}
	m.cmd = cmd
	go func() {
		m.waitErr = cmd.Wait()
		close(m.done)
	}()
	return nil
}

// serverEnv is this process's environment without libpq's PG* variables,
// which would otherwise redirect initdb or the server (PGDATA, PGPORT...).
func serverEnv() []string {
	env := os.Environ()
	return slices.DeleteFunc(env, func(kv string) bool { return strings.HasPrefix(kv, "PG") })
}

// waitReady connects until the server accepts a connection, it exits, or
// timeout passes.
func (m *Managed) waitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	delay := 5 * time.Millisecond
	for {
		attemptCtx, attemptCancel := context.WithTimeout(ctx, 5*time.Second)
		conn, err := pgx.Connect(attemptCtx, m.URL("postgres"))
		attemptCancel()
		if err == nil {
			_ = conn.Close(ctx)
			return nil
		}
		select {
		case <-m.done:
			return fmt.Errorf("db: managed postgres exited during start-up (%v); log %s ends:\n%s", m.waitErr, m.logFile.Name(), logTail(m.logFile.Name()))
		case <-ctx.Done():
			return fmt.Errorf("db: managed postgres not accepting connections after %s: %w (last error: %v)", timeout, ctx.Err(), err)
		case <-time.After(delay):
		}
		delay = min(2*delay, 100*time.Millisecond)
	}
}

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

// logTail returns the end of the server log, for error messages.
func logTail(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	const n = 2048
	if fi, err := f.Stat(); err == nil && fi.Size() > n {
		_, _ = f.Seek(-n, io.SeekEnd)
	}
	b, _ := io.ReadAll(f)
	return string(b)
}

// binCandidate is a directory holding initdb and postgres.
type binCandidate struct {
	dir     string
	version string // major version, as in PG_VERSION
}

// findBinDir picks the directory of the Postgres binaries: explicit if
// given, else among PATH, pg_config --bindir and /usr/lib/postgresql/*/bin
// the one matching want (the version of an existing cluster), else the
// highest version.
func findBinDir(ctx context.Context, explicit, want string) (string, error) {
	const install = "install PostgreSQL (Debian/Ubuntu: apt-get install postgresql)"
	if explicit != "" {
		if !hasServerBinaries(explicit) {
			return "", fmt.Errorf("db: managed postgres: no initdb and postgres in %s: %s or set the Postgres bin directory correctly", explicit, install)
		}
		return explicit, nil
	}
	var dirs []string
	if p, err := exec.LookPath("postgres"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			dirs = append(dirs, filepath.Dir(real))
		}
		dirs = append(dirs, filepath.Dir(p))
	}
	if out, err := exec.CommandContext(ctx, "pg_config", "--bindir").Output(); err == nil {
		dirs = append(dirs, strings.TrimSpace(string(out)))
	}
	globbed, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	dirs = append(dirs, globbed...)
	more, _ := filepath.Glob("/usr/pgsql-*/bin") // RPM layout
	dirs = append(dirs, more...)

	var cands []binCandidate
	seen := map[string]bool{}
	for _, d := range dirs {
		if seen[d] || !hasServerBinaries(d) {
			continue
		}
		seen[d] = true
		v, err := binVersion(ctx, d)
		if err != nil {
			continue
		}
		cands = append(cands, binCandidate{dir: d, version: v})
	}
	if len(cands) == 0 {
		return "", fmt.Errorf("db: managed postgres: no PostgreSQL server binaries (initdb, postgres) found in PATH, pg_config --bindir or /usr/lib/postgresql/*/bin: %s, or set BULWARK_DATABASE_URL to use an existing server", install)
	}
	if want != "" {
		for _, c := range cands {
			if c.version == want {
				return c.dir, nil
			}
		}
		return "", fmt.Errorf("db: managed postgres: the cluster was created by PostgreSQL %s but only %s found: install PostgreSQL %s or upgrade the cluster with pg_upgrade", want, describe(cands), want)
	}
	// Stable sort: among equal versions, the earlier source (PATH) wins.
	slices.SortStableFunc(cands, func(a, b binCandidate) int { return compareVersions(b.version, a.version) })
	return cands[0].dir, nil
}

func describe(cands []binCandidate) string {
	var parts []string
	for _, c := range cands {
		parts = append(parts, c.version+" ("+c.dir+")")
	}
	return strings.Join(parts, ", ")
}

func hasServerBinaries(dir string) bool {
	for _, name := range []string{"initdb", "postgres"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			return false
		}
	}
	return true
}

// binVersion returns the major version of the server in dir ("15", or
// "9.6" for old releases), as PG_VERSION spells it.
func binVersion(ctx context.Context, dir string) (string, error) {
	out, err := exec.CommandContext(ctx, filepath.Join(dir, "postgres"), "-V").Output()
	if err != nil {
		return "", fmt.Errorf("db: managed postgres: %s -V: %w", filepath.Join(dir, "postgres"), err)
	}
	// "postgres (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)"
	fields := strings.Fields(string(out))
	if len(fields) < 3 {
		return "", fmt.Errorf("db: managed postgres: unexpected version output %q", out)
	}
	parts := strings.Split(fields[2], ".")
	if n, err := strconv.Atoi(parts[0]); err == nil && n < 10 && len(parts) > 1 {
		return parts[0] + "." + parts[1], nil
	}
	// Development builds say "17devel" or "17beta1": keep the leading digits.
	major := parts[0]
	if i := strings.IndexFunc(major, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
		major = major[:i]
	}
	return major, nil
}

// compareVersions orders major versions numerically ("9.6" < "15").
func compareVersions(a, b string) int {
	pa, pb := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < max(len(pa), len(pb)); i++ {
		var x, y int
		if i < len(pa) {
			x, _ = strconv.Atoi(pa[i])
		}
		if i < len(pb) {
			y, _ = strconv.Atoi(pb[i])
		}
		if x != y {
			return x - y
		}
	}
	return 0
}

package db

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

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

// clearPrevious deals with the lock files of a previous run. A server
// still running on this data directory is an orphan, since this process
// holds the directory lock; it is shut down (a clean shutdown beats
// adopting a server whose settings and log file we did not choose). Lock
// files naming a dead or unrelated process are removed, since Postgres
// would otherwise refuse to start if that pid had been reused.
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

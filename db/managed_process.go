package db

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

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

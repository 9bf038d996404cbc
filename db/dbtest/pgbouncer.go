package dbtest

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/internal/pgbouncer"
)

// PgBouncer runs a real PgBouncer in transaction mode in front of
// the test database at direct, and returns the URL through it. With
// ignore, it passes over the session settings Bulwark sends instead of
// refusing them (ignore_startup_parameters). It skips the test where
// pgbouncer is not installed.
func PgBouncer(t testing.TB, direct string, ignore bool) string {
	t.Helper()
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		for _, p := range []string{"/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"} {
			if _, serr := os.Stat(p); serr == nil {
				bin, err = p, nil
			}
		}
	}
	if err != nil {
		t.Skip("pgbouncer is not installed (apt-get install pgbouncer)")
	}
	u, err := url.Parse(direct)
	require.NoError(t, err)
	dir, err := os.MkdirTemp("", "bulwark-pgbouncer-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o777))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	require.NoError(t, ln.Close())
	cfg := pgbouncer.Config{Server: "host=" + u.Query().Get("host"), Port: port}
	if ignore {
		cfg.IgnoreStartup = []string{"idle_in_transaction_session_timeout", "tcp_keepalives_idle", "tcp_keepalives_interval", "tcp_keepalives_count", "tcp_user_timeout"}
	}
	ini, err := cfg.Write(dir)
	require.NoError(t, err)
	args := []string{ini}
	cmd := exec.Command(bin, args...)
	if os.Geteuid() == 0 {
		// PgBouncer refuses to run as root.
		pg, err := user.Lookup("postgres")
		require.NoError(t, err, "running as root needs the postgres user for pgbouncer")
		cmd = exec.Command("runuser", append([]string{"-u", pg.Username, "--", bin}, args...)...)
	}
	// Its own process group, so that the cleanup also stops pgbouncer
	// under runuser, not runuser alone.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); _ = cmd.Wait() })
	pooled := fmt.Sprintf("postgres://postgres@127.0.0.1:%d%s?sslmode=disable", port, u.Path)
	require.Eventually(t, func() bool {
		c, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err == nil {
			c.Close()
		}
		return err == nil
	}, time.Minute, 20*time.Millisecond, "pgbouncer did not listen")
	return pooled
}

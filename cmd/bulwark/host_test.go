package main

import (
	"context"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/backup"
	"github.com/bulwark-pds/bulwark/db/dbtest"
	"github.com/bulwark-pds/bulwark/internal/syncbuf"
	"github.com/bulwark-pds/bulwark/plc/plctest"
)

// serveRefused runs `bulwark serve` as startLiveServer would, on a fresh
// port, under hostname, and requires it to stop with exit code 1 before
// it serves; it returns the log.
func serveRefused(t *testing.T, dataDir, databaseURL, plcURL, hostname string) string {
	t.Helper()
	return serveRefusedArgs(t, "--listen", "127.0.0.1:"+strconv.Itoa(freePort(t)), "--hostname", hostname,
		"--data-dir", dataDir, "--database-url", databaseURL, "--plc-url", plcURL, "--log-format", "text")
}

// serveRefusedArgs runs `bulwark serve args...` and requires it to stop
// with exit code 1 before it serves (one that serves is stopped and fails
// the test); it returns the log.
func serveRefusedArgs(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	logs := &syncbuf.Buffer{}
	go func() { done <- run(ctx, append([]string{"serve"}, args...), io.Discard, logs) }()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	limit := time.After(waitLimit)
	for {
		select {
		case code := <-done:
			require.Equal(t, 1, code, logs.String())
			return logs.String()
		case <-tick.C:
			if strings.Contains(logs.String(), "msg=serving") {
				cancel()
				<-done
				t.Fatalf("serve %v started: %s", args, logs.String())
			}
		case <-limit:
			t.Fatalf("serve neither served nor stopped: %s", logs.String())
		}
	}
}

// TestBackupRecordsTheServersHost: a backup taken as the README says
// (data dir and database, no host name) names the host the accounts are
// served under, whatever the backup command's own listen address; restore
// advises it; a server started on the restored data under another name is
// refused, and under the recorded one serves.
func TestBackupRecordsTheServersHost(t *testing.T) {
	t.Parallel()
	_, plc := plctest.NewServer(t)
	src := startLiveServer(t, serverOptions{plcURL: plc.URL})
	var acct createdAccount
	src.adminJSON(t, &acct, "account", "create", "--handle", "alice", "--email", "alice@example.com")

	out := filepath.Join(t.TempDir(), "backup")
	code, _, errOut := cli("backup", "--data-dir", src.dataDir, "--database-url", src.databaseURL, "--out", out)
	require.Equal(t, 0, code, errOut)
	m, err := backup.ReadManifest(out)
	require.NoError(t, err)
	require.Equal(t, src.hostname, m.Hostname, "the server's host, not one made from the backup command's listen port")
	require.NotContains(t, strings.Join(m.Notes, "\n"), "host name")
	src.stop(t)

	target, dst := dbtest.NewURL(t), t.TempDir()
	code, stdout, errOut := cli("restore", "--from", out, "--data-dir", dst, "--database-url", target, "--force")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, stdout, "with BULWARK_HOSTNAME="+src.hostname+";")

	logs := serveRefused(t, dst, target, plc.URL, "localhost:2583")
	require.Contains(t, logs, "host name does not match this database's accounts")
	require.Contains(t, logs, "BULWARK_HOSTNAME="+src.hostname)

	restored := startLiveServer(t, serverOptions{dataDir: dst, databaseURL: target, hostname: src.hostname, plcURL: plc.URL})
	var info accountInfoOutput
	restored.adminJSON(t, &info, "account", "info", acct.DID)
	require.Equal(t, acct.Handle, info.Account.Handle)
}

// TestHostCheckReadsDIDDocuments: a database that records no host (made
// before the record existed) is checked against the DID document of its
// newest account; a server under another name is refused, one under the
// right name records it.
func TestHostCheckReadsDIDDocuments(t *testing.T) {
	t.Parallel()
	_, plc := plctest.NewServer(t)
	s := startLiveServer(t, serverOptions{plcURL: plc.URL})
	require.Contains(t, s.logs.String(), "First account:")
	var acct createdAccount
	s.adminJSON(t, &acct, "account", "create", "--handle", "alice", "--email", "alice@example.com")
	s.stop(t)

	ctx := context.Background()
	conn, err := pgx.Connect(ctx, s.databaseURL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "DELETE FROM server_identity")
	require.NoError(t, err)

	logs := serveRefused(t, s.dataDir, s.databaseURL, plc.URL, "localhost:2583")
	require.Contains(t, logs, "the DID document of "+acct.DID)
	require.Contains(t, logs, "host name does not match this database's accounts")
	require.Contains(t, logs, "http://"+s.hostname)

	startLiveServer(t, serverOptions{dataDir: s.dataDir, databaseURL: s.databaseURL, hostname: s.hostname, plcURL: plc.URL})
	var host string
	require.NoError(t, conn.QueryRow(ctx, "SELECT hostname FROM server_identity").Scan(&host))
	require.Equal(t, s.hostname, host)
}

// TestBannerAfterFirstAccount: the start banner proposes the first
// account only while there is none; restarted with accounts, it lists
// them.
func TestBannerAfterFirstAccount(t *testing.T) {
	t.Parallel()
	_, plc := plctest.NewServer(t)
	s := startLiveServer(t, serverOptions{plcURL: plc.URL})
	require.Contains(t, s.logs.String(), "First account:")
	s.admin(t, "account", "create", "--handle", "alice", "--email", "alice@example.com")
	s.stop(t)

	again := startLiveServer(t, serverOptions{dataDir: s.dataDir, databaseURL: s.databaseURL, hostname: s.hostname, plcURL: plc.URL})
	logs := again.logs.String()
	require.NotContains(t, logs, "First account:")
	require.NotContains(t, logs, "alice@example.com")
	require.Contains(t, logs, "Accounts:       bulwark admin --data-dir "+s.dataDir+" account list")
}

package main

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/db/dbtest"
	"github.com/bulwark-pds/bulwark/serverid"
)

// TestBusyPortFailsFirst: a server whose port is taken fails before it
// creates anything: no data dir, no secrets, no Postgres cluster, and an
// error that names the address and the setting.
func TestBusyPortFailsFirst(t *testing.T) {
	t.Parallel()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer busy.Close()
	dataDir := filepath.Join(t.TempDir(), "data")

	var out bytes.Buffer
	code := run(context.Background(), []string{"serve", "--listen", busy.Addr().String(), "--data-dir", dataDir}, &out, &out)
	require.Equal(t, 1, code, out.String())
	require.Contains(t, out.String(), "listen on "+busy.Addr().String()+" (--listen, BULWARK_LISTEN)")
	require.Contains(t, out.String(), "address already in use")
	require.NotContains(t, out.String(), "generated a secret", "nothing was set up first")
	require.NoDirExists(t, dataDir, "no data dir, secrets or cluster left behind")
}

// TestPublicPLCRefusedAtStart: a public PLC directory with a plain-http
// PDS URL stops serve (and migrate) before anything is stored or sent,
// with an error naming both settings.
func TestPublicPLCRefusedAtStart(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"serve", "--hostname", "localhost:2583", "--plc-url", "https://plc.directory"},
		{"serve", "--hostname", "pds.example.com:8443"},
		{"migrate", "up", "--plc-url", "https://plc.directory"},
	} {
		dataDir := filepath.Join(t.TempDir(), "data")
		var out bytes.Buffer
		code := run(context.Background(), append(args, "--data-dir", dataDir, "--listen", "127.0.0.1:0"), &out, &out)
		require.Equal(t, 2, code, "%v: %s", args, out.String())
		require.Contains(t, out.String(), "BULWARK_HOSTNAME", args)
		require.Contains(t, out.String(), "BULWARK_PLC_URL", args)
		require.NoDirExists(t, dataDir, "%v: nothing stored", args)
	}
}

// TestConfigCommand: `bulwark config` prints one setting per line, with
// derived defaults and without secrets, and refuses what serve refuses.
func TestConfigCommand(t *testing.T) {
	t.Parallel()
	dataDir := filepath.Join(t.TempDir(), "data")
	var out, errs bytes.Buffer
	code := run(context.Background(), []string{"config", "--listen", "127.0.0.1:2999", "--data-dir", dataDir,
		"--jwt-secret", strings.Repeat("s3cret", 8), "--database-url", "postgres://u:dbpass@db/bulwark"}, &out, &errs)
	require.Equal(t, 0, code, errs.String())
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Greater(t, len(lines), 40)
	for _, l := range lines {
		require.Regexp(t, `^BULWARK_[A-Z0-9_]+=`, l)
	}
	text := out.String()
	require.Contains(t, text, "BULWARK_HOSTNAME=localhost:2999\n")
	require.Contains(t, text, "BULWARK_PLC_URL=http://localhost:2999\n")
	require.Contains(t, text, "BULWARK_INVITE_REQUIRED=false\n")
	require.Contains(t, text, "BULWARK_JWT_SECRET=(redacted)\n")
	require.Contains(t, text, "BULWARK_ADMIN_PASSWORD=(kept in "+filepath.Join(dataDir, "secrets", "admin-password")+")\n")
	require.NotContains(t, text, "s3cret")
	require.NotContains(t, text, "dbpass")
	require.NoDirExists(t, dataDir, "config changes nothing")

	out.Reset()
	errs.Reset()
	require.Equal(t, 2, run(context.Background(), []string{"config", "--hostname", "pds.example.com:8443"}, &out, &errs))
	require.Contains(t, errs.String(), "BULWARK_PLC_URL")
	require.Empty(t, out.String())
}

// TestBusyMetricsPortFailsFirst: a --metrics-listen address in use stops
// the server before the data dir, secrets or database are touched, with
// an error naming the address and the setting.
func TestBusyMetricsPortFailsFirst(t *testing.T) {
	t.Parallel()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer busy.Close()
	dataDir := filepath.Join(t.TempDir(), "data")

	var out bytes.Buffer
	code := run(context.Background(), []string{"serve", "--listen", "127.0.0.1:0", "--metrics-listen", busy.Addr().String(),
		"--data-dir", dataDir, "--database-url", dbtest.NewURL(t)}, &out, &out)
	require.Equal(t, 1, code, out.String())
	require.Contains(t, out.String(), "listen on "+busy.Addr().String()+" (--metrics-listen, BULWARK_METRICS_LISTEN)")
	require.NotContains(t, out.String(), "generated a secret", "nothing was set up first")
	require.NoDirExists(t, dataDir, "no data dir or secrets left behind")
}

// TestDataDirLockExternalDatabase: with an external database, a second
// server on the same data dir (its secrets, blobs and runtime record) is
// refused at start, and the first keeps serving and keeps its record.
func TestDataDirLockExternalDatabase(t *testing.T) {
	t.Parallel()
	s := startLiveServer(t, serverOptions{})

	logs := serveRefusedArgs(t, "--listen", "127.0.0.1:0", "--data-dir", s.dataDir,
		"--database-url", dbtest.NewURL(t), "--log-format", "text")
	require.Contains(t, logs, "data dir "+s.dataDir+" is in use by another bulwark server (pid "+strconv.Itoa(os.Getpid())+")")

	rt, err := serverid.ReadRuntime(s.dataDir)
	require.NoError(t, err)
	require.Equal(t, s.url, rt.AdminURL, "the running server's record is untouched")
	require.Contains(t, s.admin(t, "account", "list"), "HANDLE")
}

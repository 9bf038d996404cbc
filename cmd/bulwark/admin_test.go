package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/db/dbtest"
	"github.com/bulwark-pds/bulwark/pds"
)

// TestAdminCLI drives `bulwark admin` against a running server's admin
// methods.
func TestAdminCLI(t *testing.T) {
	t.Parallel()
	cfg := config.DefaultConfig()
	cfg.DataDir = t.TempDir()
	cfg.AdminPassword = "cli-test-password"
	require.NoError(t, cfg.Finalize())
	s, err := pds.New(pds.Options{Config: cfg, DB: dbtest.New(t), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)

	admin := func(args ...string) (int, string, string) {
		var out, errOut bytes.Buffer
		all := append([]string{"admin", "--url", ts.URL, "--admin-password", cfg.AdminPassword}, args...)
		code := run(context.Background(), all, &out, &errOut)
		return code, out.String(), errOut.String()
	}

	code, out, errOut := admin("firehose", "raise-seq", "--floor", "77", "--reason", "restore")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "last seq raised from 0 to 77: the next event gets 78 or more\n")

	code, out, _ = admin("firehose", "events", "--over-limits")
	require.Equal(t, 0, code)
	require.Contains(t, out, "SEQ")

	code, out, _ = admin("audit")
	require.Equal(t, 0, code)
	require.Contains(t, out, "firehose.raiseSeq")

	code, _, errOut = admin("firehose", "rewrite-as-sync")
	require.Equal(t, 2, code, "a missing --seq is a usage error")
	require.Contains(t, errOut, "--seq")

	code, _, errOut = admin("firehose", "rewrite-as-sync", "--seq", "12345")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "EventNotFound")

	var out2, errOut2 bytes.Buffer
	code = run(context.Background(), []string{"admin", "--url", ts.URL, "--admin-password", "wrong", "firehose", "events"}, &out2, &errOut2)
	require.Equal(t, 1, code)
	require.Contains(t, errOut2.String(), "AuthenticationRequired")
}

// TestAdminHelpHidesPassword: -h shows flag defaults, never a password
// given on the command line.
func TestAdminHelpHidesPassword(t *testing.T) {
	t.Parallel()
	code, out, errOut := cli("admin", "--admin-password", "sekrit-pw", "account", "list", "-h")
	require.Equal(t, 0, code)
	require.Contains(t, out, "-admin-password")
	require.NotContains(t, out+errOut, "sekrit-pw")
}

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http/httptest"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/db/dbtest"
	"github.com/bulwark-pds/bulwark/pds"
	"github.com/bulwark-pds/bulwark/repo"
)

// TestAdminAccountTokens: with no SMTP server, the code a user asked for
// is read with `bulwark admin account tokens` and works.
func TestAdminAccountTokens(t *testing.T) {
	t.Parallel()
	cfg := plcTestConfig(t, "cli-test-password")
	require.NoError(t, cfg.Finalize())
	pool := dbtest.New(t)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	accounts, engine, _, err := newAccountStack(cfg, pool, nil, repo.Config{}, nil, nil, logger)
	require.NoError(t, err)
	s, err := pds.New(pds.Options{Config: cfg, DB: pool, Logger: logger, Accounts: accounts, Repo: engine})
	require.NoError(t, err)
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)

	post := func(nsid, token string, in any) map[string]any { return postOK(t, ts.URL, nsid, token, in) }
	acct := post("com.atproto.server.createAccount", "", map[string]any{"handle": "alice.test", "email": "alice@example.com", "password": "alice password"})
	post("com.atproto.server.requestEmailConfirmation", acct["accessJwt"].(string), nil)

	admin := func(args ...string) (int, string, string) {
		var out, errOut bytes.Buffer
		all := append([]string{"admin", "--url", ts.URL, "--admin-password", cfg.AdminPassword}, args...)
		code := run(context.Background(), all, &out, &errOut)
		return code, out.String(), errOut.String()
	}
	code, out, errOut := admin("account", "tokens", "alice.test")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "confirm_email")
	token := regexp.MustCompile(`[A-Z2-7]{5}-[A-Z2-7]{5}`).FindString(out)
	require.NotEmpty(t, token, out)

	code, out, errOut = admin("account", "tokens", acct["did"].(string), "--json")
	require.Equal(t, 0, code, errOut)
	var res struct {
		Tokens []struct{ Purpose, Code string } `json:"tokens"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &res))
	require.Len(t, res.Tokens, 1)
	require.Equal(t, token, res.Tokens[0].Code)

	post("com.atproto.server.confirmEmail", acct["accessJwt"].(string), map[string]any{"email": "alice@example.com", "token": token})
	code, out, _ = admin("account", "tokens", "alice.test")
	require.Equal(t, 0, code)
	require.Contains(t, out, "no codes waiting")

	code, _, errOut = admin("account", "tokens", "nobody.test")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "NotFound")
	for _, args := range [][]string{{"account"}, {"account", "tokens"}, {"account", "tokens", "a", "b"}} {
		code, _, errOut = admin(args...)
		require.Equal(t, 2, code, "%v: %s", args, errOut)
		require.Contains(t, errOut, "account tokens ACCOUNT")
	}
}

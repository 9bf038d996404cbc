package oauth_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/db/dbtest"
	"github.com/bulwark-pds/bulwark/oauth"
)

func TestNewChecksConfig(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	good := oauth.Config{Issuer: "https://pds.example.com", Pool: pool, Accounts: &testAccounts{}, Secret: []byte(strings.Repeat("s", 32))}
	_, err := oauth.New(good)
	require.NoError(t, err)
	for name, edit := range map[string]func(*oauth.Config){
		"no pool":      func(c *oauth.Config) { c.Pool = nil },
		"no accounts":  func(c *oauth.Config) { c.Accounts = nil },
		"short secret": func(c *oauth.Config) { c.Secret = []byte("short") },
		"path":         func(c *oauth.Config) { c.Issuer = "https://pds.example.com/pds" },
		"not a URL":    func(c *oauth.Config) { c.Issuer = "pds.example.com" },
	} {
		c := good
		edit(&c)
		_, err := oauth.New(c)
		require.Error(t, err, name)
	}
}

// On a plain-http issuer (local development) cookies cannot be Secure or
// carry the __Host- prefix, or browsers would drop them.
func TestPlainHTTPIssuerCookies(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	mux := http.NewServeMux()
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	s, err := oauth.New(oauth.Config{Issuer: srv.URL, Pool: pool, Accounts: &testAccounts{}, Secret: []byte(strings.Repeat("s", 32)),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	s.Routes(mux)
	resp, err := http.Get(srv.URL + oauth.PathAccount)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	ck := resp.Header.Get("Set-Cookie")
	require.True(t, strings.HasPrefix(ck, "bulwark-device="), ck)
	require.NotContains(t, ck, "Secure")
	require.Contains(t, ck, "HttpOnly")
}

func TestCleanupRemovesExpiredState(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := setup(t)
	c := f.rawClient("cleanup", "atproto")
	a := c.tokens()
	c.par(c.parForm())

	pool := f.pool
	for _, table := range []string{"oauth_requests", "oauth_grants", "oauth_used_values", "oauth_device_accounts", "oauth_devices"} {
		_, err := pool.Exec(ctx, "UPDATE "+table+" SET expires_at = now() - interval '1 second'")
		require.NoError(t, err)
	}
	require.NoError(t, f.oauth.Cleanup(ctx))
	for _, table := range []string{"oauth_requests", "oauth_grants", "oauth_spent_refresh", "oauth_used_values", "oauth_device_accounts", "oauth_devices"} {
		var n int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n))
		require.Zero(t, n, table)
	}
	require.Equal(t, http.StatusUnauthorized, c.call(a.str("access_token"), c.key, "").StatusCode)
}

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/db/dbtest"
	"github.com/bulwark-pds/bulwark/oauth"
	"github.com/bulwark-pds/bulwark/oauth/dpop/dpoptest"
	"github.com/bulwark-pds/bulwark/ratelimit"
)

// TestServeMountsOAuth: serve is an OAuth authorization server whose
// issuer is its public URL, with the pages on the main listener, and
// refuses client_ids on private addresses unless the development setting
// allows them.
func TestServeMountsOAuth(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, done, logs := startServe(t, ctx, []string{"serve", "--database-url", dbtest.NewURL(t), "--data-dir", t.TempDir(), "--listen", "127.0.0.1:0"})
	base := "http://" + addr
	_, port, _ := strings.Cut(addr, ":")
	public := "http://localhost:" + port

	var md struct {
		Issuer string `json:"issuer"`
		PAR    string `json:"pushed_authorization_request_endpoint"`
	}
	getJSON(t, base+oauth.PathASMetadata, &md)
	require.Equal(t, public, md.Issuer)
	require.Equal(t, public+oauth.PathPAR, md.PAR)
	var rs struct {
		AuthorizationServers []string `json:"authorization_servers"`
	}
	getJSON(t, base+oauth.PathRSMetadata, &rs)
	require.Equal(t, []string{public}, rs.AuthorizationServers)

	resp, err := http.Get(base + oauth.PathAccount)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, resp.Header.Get("Content-Security-Policy"), "default-src 'none'")

	// A client_id on a loopback address is refused before anything is
	// fetched from it.
	status, e := par(t, base, public, url.Values{"client_id": {"https://127.0.0.1/client.json"}})
	require.Equal(t, http.StatusUnauthorized, status, e)
	require.Equal(t, oauth.CodeInvalidClient, e.Error, e)
	require.Contains(t, e.Desc, "IP address", e)

	_, ok := describe(base)
	require.True(t, ok, "describeServer answers as before")
	cancel()
	select {
	case code := <-done:
		require.Equal(t, 0, code, logs.String())
	case <-time.After(waitLimit):
		t.Fatal("serve did not stop")
	}
}

// TestServeLimitsOAuth: with the default settings, a burst of anonymous
// connected-apps page views or pushed requests from one address meets 429
// (with the RateLimit-* headers and Retry-After) long before a few
// thousand, and the page views leave no browser stored.
func TestServeLimitsOAuth(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dbURL := dbtest.NewURL(t)
	addr, done, logs := startServe(t, ctx, []string{"serve", "--database-url", dbURL, "--data-dir", t.TempDir(), "--listen", "127.0.0.1:0"})
	base := "http://" + addr
	for _, tc := range []struct {
		method, path string
		rule         ratelimit.Rule
	}{
		{http.MethodGet, oauth.PathAccount, ratelimit.DefaultPolicies()[ratelimit.PolicyOAuthPage][0]},
		{http.MethodPost, oauth.PathPAR, ratelimit.DefaultPolicies()[ratelimit.PolicyOAuthPAR][0]},
	} {
		start := time.Now()
		refusedAt := 0
		for i := 1; i <= 4000 && refusedAt == 0; i++ {
			req, err := http.NewRequest(tc.method, base+tc.path, strings.NewReader("client_id=https%3A%2F%2Fapp.example.com%2Fclient.json"))
			require.NoError(t, err)
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusTooManyRequests {
				refusedAt = i
				require.NotEmpty(t, resp.Header.Get("Retry-After"))
				require.Equal(t, strconv.Itoa(tc.rule.Limit), resp.Header.Get("RateLimit-Limit"))
				require.Equal(t, "0", resp.Header.Get("RateLimit-Remaining"))
			}
		}
		// The limit's worth, and what the bucket refilled meanwhile.
		refilled := int(time.Since(start) * time.Duration(tc.rule.Limit) / tc.rule.Window)
		require.Greater(t, refusedAt, tc.rule.Limit, tc.path)
		require.LessOrEqual(t, refusedAt, tc.rule.Limit+refilled+1, tc.path)
	}
	conn, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var devices int
	require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM oauth_devices").Scan(&devices))
	require.Zero(t, devices)
	cancel()
	select {
	case code := <-done:
		require.Equal(t, 0, code, logs.String())
	case <-time.After(waitLimit):
		t.Fatal("serve did not stop")
	}
}

type oauthError struct {
	Error string `json:"error"`
	Desc  string `json:"error_description"`
}

// par sends a pushed authorization request with a valid DPoP proof (and
// the server's nonce) and returns the refusal.
func par(t *testing.T, base, public string, form url.Values) (int, oauthError) {
	t.Helper()
	key := dpoptest.NewKey()
	nonce := ""
	for range 2 {
		req, err := http.NewRequest(http.MethodPost, base+oauth.PathPAR, strings.NewReader(form.Encode()))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("DPoP", key.Proof(dpoptest.Claims{Method: http.MethodPost, URL: public + oauth.PathPAR, Nonce: nonce}))
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		var e oauthError
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&e))
		resp.Body.Close()
		if e.Error == oauth.CodeUseDPoPNonce && nonce == "" {
			nonce = resp.Header.Get("DPoP-Nonce")
			continue
		}
		return resp.StatusCode, e
	}
	t.Fatal("the server asked for a nonce twice")
	return 0, oauthError{}
}

func getJSON(t *testing.T, u string, v any) {
	t.Helper()
	resp, err := http.Get(u)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.NoError(t, json.NewDecoder(resp.Body).Decode(v))
}

func TestOAuthPrivateClientsSetting(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		args []string
		want string
	}{
		{nil, "BULWARK_OAUTH_ALLOW_PRIVATE_CLIENTS=false"},
		{[]string{"--oauth-allow-private-clients"}, "BULWARK_OAUTH_ALLOW_PRIVATE_CLIENTS=true"},
	} {
		var out, errs bytes.Buffer
		code := run(context.Background(), append([]string{"config", "--data-dir", t.TempDir()}, tt.args...), &out, &errs)
		require.Equal(t, 0, code, errs.String())
		require.Contains(t, out.String(), tt.want)
	}
}

// TestServeOAuthPrivateClients: with the development setting, a client_id
// on this machine passes the name check and is fetched through the
// outbound client, which now reaches loopback: the fetch gets as far as
// the TLS handshake (the test server's certificate is not trusted).
func TestServeOAuthPrivateClients(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	apps := httptest.NewTLSServer(http.NotFoundHandler())
	defer apps.Close()
	addr, done, logs := startServe(t, ctx, []string{"serve", "--oauth-allow-private-clients",
		"--database-url", dbtest.NewURL(t), "--data-dir", t.TempDir(), "--listen", "127.0.0.1:0"})
	_, port, _ := strings.Cut(addr, ":")
	status, e := par(t, "http://"+addr, "http://localhost:"+port, url.Values{"client_id": {apps.URL + "/client.json"}})
	require.Equal(t, http.StatusUnauthorized, status, e)
	// The app is told which document failed, never what the fetch met
	// (addresses, DNS answers, TLS errors); the log has that.
	require.Equal(t, "the client metadata document could not be fetched", e.Desc)
	require.Contains(t, logs.String(), "certificate")
	require.Contains(t, logs.String(), "oauth-allow-private-clients")
	cancel()
	select {
	case code := <-done:
		require.Equal(t, 0, code, logs.String())
	case <-time.After(waitLimit):
		t.Fatal("serve did not stop")
	}
}

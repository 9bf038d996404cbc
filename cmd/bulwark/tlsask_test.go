package main

import (
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/serverid"
)

// askTLS asks the server's /tls-ask about domain, as Caddy's on-demand TLS
// does, and returns the status.
func askTLS(t *testing.T, s *liveServer, domain string) int {
	t.Helper()
	resp, err := http.Get(s.url + serverid.AskPath + "?" + url.Values{"domain": {domain}}.Encode())
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// TestTLSAsk: the on-demand TLS question answers yes for the server's own
// name and the handles of its active accounts only, and every address
// asking is held to the global rate limit.
func TestTLSAsk(t *testing.T) {
	t.Parallel()
	s := startLiveServer(t, serverOptions{extra: []string{"--ratelimits", "global=40/1d"}})
	var alice, bob createdAccount
	s.adminJSON(t, &alice, "account", "create", "--handle", "alice", "--email", "alice@example.com")
	s.adminJSON(t, &bob, "account", "create", "--handle", "bobby", "--email", "bob@example.com")
	s.admin(t, "account", "takedown", bob.DID)

	host := strings.Split(s.hostname, ":")[0]
	for domain, want := range map[string]int{
		host:                               http.StatusOK,
		strings.ToUpper(host) + ".":        http.StatusOK,
		alice.Handle:                       http.StatusOK,
		strings.ToUpper(alice.Handle):      http.StatusOK,
		bob.Handle:                         http.StatusNotFound, // taken down
		"nobody.test":                      http.StatusNotFound,
		"evil.example.com":                 http.StatusNotFound,
		"":                                 http.StatusBadRequest,
		"a..b":                             http.StatusBadRequest,
		"127.0.0.1":                        http.StatusBadRequest,
		strings.Repeat("a", 300) + ".test": http.StatusBadRequest,
	} {
		require.Equal(t, want, askTLS(t, s, domain), "%q", domain)
	}
	resp, err := http.Post(s.url+serverid.AskPath+"?domain="+host, "text/plain", nil)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)

	// The global limit holds for each address: past it, 429 (a no for
	// Caddy), and the identity question is held to it too.
	refused := 0
	for range 60 {
		if askTLS(t, s, "nobody.test") == http.StatusTooManyRequests {
			refused++
		}
	}
	require.Greater(t, refused, 0)
	require.Equal(t, http.StatusTooManyRequests, askTLS(t, s, alice.Handle))
	resp, err = http.Get(s.url + serverid.IdentifyPath)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
}

package pds

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/audit"
	"github.com/bulwark-pds/bulwark/config"
)

// crawlRelay is a relay that records the host names it is asked to crawl,
// answering with status.
func crawlRelay(t *testing.T, status int) (string, <-chan string) {
	t.Helper()
	got := make(chan string, 4)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			Hostname string `json:"hostname"`
		}
		if r.URL.Path == "/xrpc/com.atproto.sync.requestCrawl" && json.NewDecoder(io.LimitReader(r.Body, 1024)).Decode(&in) == nil {
			got <- in.Hostname
		}
		w.WriteHeader(status)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, got
}

func TestAdminRequestCrawl(t *testing.T) {
	t.Parallel()
	configured, configuredGot := crawlRelay(t, http.StatusOK)
	b := setup(t, func(c *config.Config) {
		c.Hostname = "pds.example.com"
		c.AdminPassword = testAdminPassword
		c.Crawlers = []string{configured}
	}, nil)
	call := func(password, body string) (*http.Response, []byte) {
		h := http.Header{"Content-Type": {"application/json"}, "Authorization": {"Basic " + basic("admin", password)}}
		return do(t, http.MethodPost, b.url+"/xrpc/"+AdminNSIDPrefix+"requestCrawl", strings.NewReader(body), h)
	}
	type result struct {
		Hostname string               `json:"hostname"`
		Results  []requestCrawlResult `json:"results"`
	}
	decode := func(body []byte) result {
		var r result
		require.NoError(t, json.Unmarshal(body, &r), "%s", body)
		return r
	}

	resp, body := call(testAdminPassword, `{}`)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	require.Equal(t, result{Hostname: "pds.example.com", Results: []requestCrawlResult{{Relay: configured, OK: true}}}, decode(body))
	require.Equal(t, "pds.example.com", <-configuredGot)
	entries, err := audit.List(context.Background(), b.server.db, "pds.example.com", 0, 10)
	require.NoError(t, err)
	require.Len(t, entries, 1, "the admin's call is audited")
	require.Equal(t, AdminNSIDPrefix+"requestCrawl", entries[0].Action)

	// A configured relay named in the request is reached as configured.
	resp, body = call(testAdminPassword, `{"relay":"`+configured+`/"}`)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	require.Equal(t, []requestCrawlResult{{Relay: configured, OK: true}}, decode(body).Results)
	require.Equal(t, "pds.example.com", <-configuredGot)

	// Any other relay given is fetched through the outbound guard: on a
	// loopback address it is refused before anything is sent, although
	// a configured crawler is on the same address.
	other, otherGot := crawlRelay(t, http.StatusOK)
	for _, relay := range []string{other, strings.Replace(other, "127.0.0.1", "localhost", 1)} {
		resp, body = call(testAdminPassword, `{"relay":"`+relay+`"}`)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
		r := decode(body)
		require.Len(t, r.Results, 1)
		require.False(t, r.Results[0].OK, relay)
		require.Contains(t, r.Results[0].Error, "--proxy-allow-private")
	}
	require.Empty(t, otherGot, "nothing was sent to a relay the guard refused")

	// With --proxy-allow-private it is reached, and its refusal reported.
	allowed := setup(t, func(c *config.Config) {
		c.Hostname = "pds.example.com"
		c.AdminPassword = testAdminPassword
		c.ProxyAllowPrivate = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}
	}, nil)
	refusing, refusingGot := crawlRelay(t, http.StatusBadRequest)
	h := http.Header{"Content-Type": {"application/json"}, "Authorization": {"Basic " + basic("admin", testAdminPassword)}}
	resp, body = do(t, http.MethodPost, allowed.url+"/xrpc/"+AdminNSIDPrefix+"requestCrawl", strings.NewReader(`{"relay":"`+refusing+`/"}`), h)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	r := decode(body)
	require.Len(t, r.Results, 1)
	require.Equal(t, refusing, r.Results[0].Relay)
	require.False(t, r.Results[0].OK)
	require.Contains(t, r.Results[0].Error, "400")
	require.Equal(t, "pds.example.com", <-refusingGot)

	for _, bad := range []string{`{"relay":"ftp://relay.example"}`, `{"relay":"https://user:pw@relay.example"}`, `{"relay":"https://relay.example/?a=b"}`, `{"relay":"` + strings.Repeat("a", maxRelayURLLen+1) + `"}`, `{"relay":5}`, ``} {
		resp, body = call(testAdminPassword, bad)
		requireXRPCError(t, resp, body, http.StatusBadRequest, "InvalidRequest")
	}
	resp, body = call("wrong", `{}`)
	requireXRPCError(t, resp, body, http.StatusUnauthorized, "AuthenticationRequired")

	none := setup(t, func(c *config.Config) { c.AdminPassword = testAdminPassword }, nil)
	resp, body = do(t, http.MethodPost, none.url+"/xrpc/"+AdminNSIDPrefix+"requestCrawl", strings.NewReader(`{}`), h)
	require.Contains(t, requireXRPCError(t, resp, body, http.StatusBadRequest, "InvalidRequest").Message, "no crawlers configured")
}

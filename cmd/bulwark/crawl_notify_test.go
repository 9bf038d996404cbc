package main

import (
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/internal/devdns"
)

// TestCrawlNotifierIsGuarded: the relays --crawlers names are called
// after writes through the guarded outbound client. A relay given by its
// address is the operator's own and reached; one given by a name that
// resolves to a private address is not (a name in the setting does not
// open the server to whatever it resolves to), and neither is a private
// address a relay redirects to.
func TestCrawlNotifierIsGuarded(t *testing.T) {
	t.Parallel()
	dns, err := devdns.Start("127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(dns.Close)
	named, namedCrawled := fakeRelay(t, false)
	literal, literalCrawled := fakeRelay(t, false)
	u, err := url.Parse(named)
	require.NoError(t, err)
	dns.SetAddr("relay.example.com", netip.MustParseAddr("127.0.0.1"))
	namedURL := "http://relay.example.com:" + u.Port()

	// A relay on an allowed address that redirects to another private one.
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	require.NoError(t, err)
	elsewhere, elsewhereCrawled := fakeRelayOn(t, ln)
	redirecting := httptest.NewServer(http.RedirectHandler(elsewhere+"/xrpc/com.atproto.sync.requestCrawl", http.StatusTemporaryRedirect))
	t.Cleanup(redirecting.Close)

	// The literal relay comes last: the notifier calls the relays in
	// order, so once it has its call the others were tried.
	s := startLiveServer(t, serverOptions{extra: []string{"--crawlers", namedURL + "," + redirecting.URL + "," + literal, "--dns-server", dns.Addr}})
	status, body := s.xrpc(t, http.MethodPost, "com.atproto.server.createAccount", "", nil,
		map[string]string{"handle": "crawl.test", "email": "crawl@example.com", "password": "crawl-password-1"}, nil)
	require.Equal(t, http.StatusOK, status, "%s", body)
	require.Equal(t, s.hostname, <-literalCrawled)
	require.Empty(t, namedCrawled, "a relay named by a private name is not called")
	require.Empty(t, elsewhereCrawled, "a redirect to a private address is not followed")
	require.Contains(t, s.logs.String(), "requestCrawl failed")
}

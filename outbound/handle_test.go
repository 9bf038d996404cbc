package outbound

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/stretchr/testify/require"
)

const (
	didAlice = "did:plc:ewvi7nxzyoun6zhxrhs64oiz"
	didBob   = "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa"
)

func TestDIDFromTXT(t *testing.T) {
	t.Parallel()
	ok := map[string][]string{
		"one":             {"did=" + didAlice},
		"noise":           {"v=spf1 -all", "did=" + didAlice, "google-site-verification=x"},
		"same twice":      {"did=" + didAlice, "did=" + didAlice},
		"invalid ignored": {"did=not a did", "did=" + didAlice},
		"whitespace":      {"did= " + didAlice + " "},
	}
	for name, recs := range ok {
		did, err := didFromTXT(recs)
		require.NoError(t, err, name)
		require.Equal(t, syntax.DID(didAlice), did, name)
	}
	_, err := didFromTXT([]string{"did=" + didAlice, "did=" + didBob})
	require.ErrorIs(t, err, ErrHandleResolutionFailed)
	require.NotErrorIs(t, err, ErrHandleNotFound)
	for _, recs := range [][]string{nil, {"v=spf1"}, {"did=nope"}, {"DID=" + didAlice}} {
		_, err := didFromTXT(recs)
		require.ErrorIs(t, err, ErrHandleNotFound, "%q", recs)
	}
}

// handleEnv is a TLS well-known server on 127.0.0.2 (an allowed network)
// that answers for every *.example.com name the resolver maps to it.
type handleEnv struct {
	client   *Client
	resolver *fakeResolver
	server   *testServer
	internal *testServer // on 127.0.0.1, not allowed
}

func newHandleEnv(t *testing.T, mux *http.ServeMux) *handleEnv {
	t.Helper()
	internal := startServer(t, "127.0.0.1", true, text(didBob))
	mux.HandleFunc("/redirect-internal/.well-known/atproto-did", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, internal.URL+"/.well-known/atproto-did", http.StatusFound)
	})
	s := startServer(t, "127.0.0.2", true, hostRouter(mux))
	names := []string{"bob.example.com", "gone.example.com", "broken.example.com", "huge.example.com",
		"garbage.example.com", "redirect-internal.example.com", "hop.example.com"}
	r := &fakeResolver{
		hosts: map[string][]netip.Addr{"internal.example.com": addrs("127.0.0.1")},
		txt: map[string][]string{
			"_atproto.alice.example.com": {"did=" + didAlice},
			"_atproto.twice.example.com": {"did=" + didAlice, "did=" + didBob},
		},
		txtErr: map[string]error{"_atproto.servfail.example.com": &net.DNSError{Err: "server misbehaving", Name: "_atproto.servfail.example.com", IsTemporary: true}},
	}
	ports := map[string]string{"internal.example.com:443": internal.port()}
	for _, n := range append(names, "servfail.example.com") {
		r.hosts[n] = addrs("127.0.0.2")
		ports[n+":443"] = s.port()
	}
	c := newTestClient(t, Config{RootCAs: s.pool(), Resolver: r, AllowCIDRs: prefixes("127.0.0.2/32")}, ports)
	return &handleEnv{client: c, resolver: r, server: s, internal: internal}
}

// hostRouter prefixes the path with the Host's first label, so one server
// plays many handle hosts.
func hostRouter(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		label, _, _ := strings.Cut(r.Host, ".")
		r.URL.Path = "/" + label + r.URL.Path
		mux.ServeHTTP(w, r)
	})
}

func TestResolveHandle(t *testing.T) {
	t.Parallel()
	mux := http.NewServeMux()
	mux.Handle("/bob/.well-known/atproto-did", text(didBob+"\n"))
	mux.Handle("/servfail/.well-known/atproto-did", text(didBob))
	mux.HandleFunc("/gone/.well-known/atproto-did", http.NotFound)
	mux.HandleFunc("/broken/.well-known/atproto-did", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "oops", http.StatusInternalServerError)
	})
	mux.Handle("/huge/.well-known/atproto-did", text(didBob+strings.Repeat(" ", MaxWellKnownBytes)))
	mux.Handle("/garbage/.well-known/atproto-did", text("<html>hello</html>"))
	mux.HandleFunc("/hop/.well-known/atproto-did", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "https://bob.example.com/.well-known/atproto-did", http.StatusMovedPermanently)
	})
	env := newHandleEnv(t, mux)
	ctx := context.Background()
	resolve := func(h string) (syntax.DID, error) {
		return env.client.ResolveHandle(ctx, syntax.Handle(h))
	}

	// DNS first; the HTTPS method only when DNS finds nothing.
	did, err := resolve("Alice.Example.COM")
	require.NoError(t, err)
	require.Equal(t, syntax.DID(didAlice), did)
	did, err = resolve("bob.example.com")
	require.NoError(t, err)
	require.Equal(t, syntax.DID(didBob), did)
	did, err = resolve("hop.example.com")
	require.NoError(t, err, "a redirect to a permitted host is followed")
	require.Equal(t, syntax.DID(didBob), did)
	did, err = resolve("servfail.example.com")
	require.NoError(t, err, "a DNS failure falls through to HTTPS")
	require.Equal(t, syntax.DID(didBob), did)

	notFound := []string{"gone.example.com", "nxdomain.example.com", "alice.example.local", "handle.invalid"}
	for _, h := range notFound {
		_, err := resolve(h)
		require.ErrorIs(t, err, ErrHandleNotFound, h)
		require.NotErrorIs(t, err, ErrHandleResolutionFailed, h)
	}
	failed := []string{"twice.example.com", "broken.example.com", "huge.example.com", "garbage.example.com"}
	for _, h := range failed {
		_, err := resolve(h)
		require.ErrorIs(t, err, ErrHandleResolutionFailed, h)
		require.NotErrorIs(t, err, ErrHandleNotFound, h)
	}
	_, err = resolve("huge.example.com")
	require.ErrorIs(t, err, ErrResponseTooLarge)
	env.internal.requireUntouched(t)
}

func TestResolveHandleRefusalIsNotFound(t *testing.T) {
	t.Parallel()
	env := newHandleEnv(t, http.NewServeMux())
	ctx := context.Background()
	// The handle's host is internal, or its well-known redirects there:
	// refused without connecting, and reported as not found.
	for _, h := range []string{"internal.example.com", "redirect-internal.example.com"} {
		_, err := env.client.ResolveHandle(ctx, syntax.Handle(h))
		require.ErrorIs(t, err, ErrHandleNotFound, h)
		require.ErrorIs(t, err, ErrForbiddenAddress, h)
		require.True(t, Refused(err), h)
		require.NotErrorIs(t, err, ErrHandleResolutionFailed, h)
	}
	env.internal.requireUntouched(t)
}

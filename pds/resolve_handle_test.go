package pds

import (
	"context"
	"crypto/x509"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/outbound"
	"github.com/bulwark-pds/bulwark/ratelimit"
)

// hostsResolver answers name lookups from a map; TXT records never exist.
type hostsResolver map[string]netip.Addr

func (h hostsResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := h[host]; ok {
		return []netip.Addr{a}, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

func (h hostsResolver) LookupTXT(_ context.Context, name string) ([]string, error) {
	return nil, &net.DNSError{Err: "no such host", Name: name, IsNotFound: true}
}

// countingServer is an httptest server on ip that counts the connections
// it accepts.
type countingServer struct {
	*httptest.Server
	accepts atomic.Int64
}

type countingListener struct {
	net.Listener
	n *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

func startCounting(t *testing.T, ip string, tls bool, h http.Handler) *countingServer {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	require.NoError(t, err)
	s := &countingServer{Server: httptest.NewUnstartedServer(h)}
	s.Listener.Close()
	s.Listener = countingListener{Listener: ln, n: &s.accepts}
	if tls {
		s.StartTLS()
	} else {
		s.Start()
	}
	t.Cleanup(s.Close)
	return s
}

func (s *countingServer) port() string {
	return strconv.Itoa(s.Listener.Addr().(*net.TCPAddr).Port)
}

// resolveEnv is a server whose outbound client may reach 127.0.0.2 (a
// stand-in for the public internet, serving the well-knowns of
// *.example.com over TLS) and nothing else that is not public, and an
// internal service on 127.0.0.1 that must never be reached.
type resolveEnv struct {
	*accountEnv
	front, inside *countingServer
}

func newResolveEnv(t *testing.T, limits map[string]string) *resolveEnv {
	t.Helper()
	inside := startCounting(t, "127.0.0.1", false, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("did:plc:internalinternalinte"))
	}))
	insideURL := "http://127.0.0.1:" + inside.port() + "/.well-known/atproto-did"
	front := startCounting(t, "127.0.0.2", true, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Host {
		case "evil.example.com":
			http.Redirect(w, r, insideURL, http.StatusFound)
		case "good.example.com":
			_, _ = w.Write([]byte("did:plc:goodgoodgoodgoodgoodgood"))
		default:
			http.NotFound(w, r)
		}
	}))
	roots := x509.NewCertPool()
	roots.AddCert(front.Certificate())
	ports := map[string]string{}
	hosts := hostsResolver{"internal.example.com": netip.MustParseAddr("127.0.0.1")}
	for _, h := range []string{"evil.example.com", "good.example.com", "missing.example.com"} {
		hosts[h] = netip.MustParseAddr("127.0.0.2")
		ports[h+":443"] = front.port()
	}
	web := outbound.New(outbound.Config{
		AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.2/32")},
		Resolver:   hosts, RootCAs: roots, DialPorts: ports,
	})
	t.Cleanup(web.CloseIdleConnections)
	policies := map[string][]ratelimit.Rule{}
	for name, rules := range limits {
		parsed, err := ratelimit.ParseRules(rules)
		require.NoError(t, err)
		policies[name] = parsed
	}
	set, err := ratelimit.NewSet(policies, 0)
	require.NoError(t, err)
	e := newAccountEnv(t, envOptions{
		configure: func(c *config.Config) {
			c.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}
		},
		options: func(o *Options) { o.Outbound, o.Limits = web, set },
	})
	return &resolveEnv{accountEnv: e, front: front, inside: inside}
}

func (e *resolveEnv) resolve(t *testing.T, ip, handle string) xrpcResult {
	t.Helper()
	return e.do(t, http.MethodGet, "com.atproto.identity.resolveHandle", "", nil, url.Values{"handle": {handle}}, from(ip))
}

// TestResolveHandleRefusesPrivateAddresses: a handle whose well-known
// redirects to a loopback address, or that resolves to one, is answered
// exactly as a handle that does not exist (400 HandleNotFound), and the
// address behind it is never connected to. A public one resolves.
func TestResolveHandleRefusesPrivateAddresses(t *testing.T) {
	t.Parallel()
	e := newResolveEnv(t, nil)

	missing := e.resolve(t, "192.0.2.1", "missing.example.com")
	require.Equal(t, "Unable to resolve handle", missing.fails(t, http.StatusBadRequest, "HandleNotFound"))
	for _, h := range []string{"evil.example.com", "internal.example.com", "nowhere.example.com"} {
		got := e.resolve(t, "192.0.2.1", h)
		require.Equal(t, missing.status, got.status, h)
		require.Equal(t, string(missing.body), string(got.body), h)
	}
	require.Positive(t, e.front.accepts.Load(), "the public server was asked, and redirected")
	require.Zero(t, e.inside.accepts.Load(), "the internal service was connected to")

	require.Equal(t, "did:plc:goodgoodgoodgoodgoodgood", e.resolve(t, "192.0.2.1", "good.example.com").ok(t).str(t, "did"))
	// A hosted handle that does not exist gets the same answer too.
	require.Equal(t, string(missing.body), string(e.resolve(t, "192.0.2.1", "nobody.test").body))
}

// TestResolveHandleRateLimited: resolving handles hosted elsewhere is
// limited per address; hosted handles are answered from the database and
// not counted.
func TestResolveHandleRateLimited(t *testing.T) {
	t.Parallel()
	const limit = 2
	e := newResolveEnv(t, map[string]string{ratelimit.PolicyResolveHandle: strconv.Itoa(limit) + "/5m"})
	u := e.createUser(t)
	for range limit {
		e.resolve(t, "192.0.2.7", "good.example.com").ok(t)
	}
	requireRefusal(t, e.resolve(t, "192.0.2.7", "good.example.com"), limit)
	require.Equal(t, u.did.String(), e.resolve(t, "192.0.2.7", u.handle).ok(t).str(t, "did"))
	e.resolve(t, "192.0.2.8", "good.example.com").ok(t)
}

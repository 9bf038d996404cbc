package outbound

import (
	"context"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// fakeResolver answers name lookups from maps; anything else is NXDOMAIN.
type fakeResolver struct {
	hosts map[string][]netip.Addr
	txt   map[string][]string
	// txtErr, when set for a name, is returned instead of records.
	txtErr map[string]error
	txtN   atomic.Int64
}

func (r *fakeResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := r.hosts[host]; ok {
		return a, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

func (r *fakeResolver) LookupTXT(_ context.Context, name string) ([]string, error) {
	r.txtN.Add(1)
	if err, ok := r.txtErr[name]; ok {
		return nil, err
	}
	if t, ok := r.txt[name]; ok {
		return t, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: name, IsNotFound: true}
}

func addrs(ss ...string) []netip.Addr {
	out := make([]netip.Addr, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParseAddr(s)
	}
	return out
}

func prefixes(ss ...string) []netip.Prefix {
	return mustPrefixes(ss...)
}

// countingListener counts the connections a server accepts.
type countingListener struct {
	net.Listener
	n *atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// testServer is an httptest server on a chosen loopback address that
// counts accepted connections.
type testServer struct {
	*httptest.Server
	accepts atomic.Int64
}

// startServer serves h on ip (127.0.0.1, 127.0.0.2, ...), over TLS if
// useTLS. Every TLS test server has the same certificate (valid for
// 127.0.0.1, example.com and *.example.com).
func startServer(t *testing.T, ip string, useTLS bool, h http.Handler) *testServer {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	require.NoError(t, err)
	s := &testServer{Server: httptest.NewUnstartedServer(h)}
	s.Listener.Close()
	s.Listener = &countingListener{Listener: l, n: &s.accepts}
	if useTLS {
		s.StartTLS()
	} else {
		s.Start()
	}
	t.Cleanup(s.Close)
	return s
}

// port is the server's port.
func (s *testServer) port() string {
	return strconv.Itoa(s.Listener.Addr().(*net.TCPAddr).Port)
}

// pool trusts the test servers' certificate.
func (s *testServer) pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(s.Certificate())
	return p
}

// requireUntouched proves the code under test never connected to s: a
// connection of our own is accepted after any earlier one, so when it is
// the only one counted, there was none before it.
func (s *testServer) requireUntouched(t *testing.T) {
	t.Helper()
	c := *s.Client()
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := c.Get(s.URL + "/probe")
	require.NoError(t, err)
	resp.Body.Close()
	require.EqualValues(t, 1, s.accepts.Load(), "the server saw a connection before the probe")
}

// newTestClient is New(cfg) with ports remapped (see guard.ports), closed
// at the end of the test.
func newTestClient(t *testing.T, cfg Config, ports map[string]string) *Client {
	t.Helper()
	c := newClient(cfg, ports)
	t.Cleanup(c.CloseIdleConnections)
	return c
}

// get fetches rawURL and reads the whole body.
func get(t *testing.T, c *Client, rawURL string, opts ...Option) (*http.Response, []byte, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, rawURL, nil)
	require.NoError(t, err)
	resp, err := c.Do(req, opts...)
	if err != nil {
		return resp, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp, body, err
}

// text answers every request with body.
func text(body string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = io.WriteString(w, body)
	})
}

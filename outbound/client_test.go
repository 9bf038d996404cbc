package outbound

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestLoopbackRefusedWithoutConnecting(t *testing.T) {
	t.Parallel()
	s := startServer(t, "127.0.0.1", true, text("hello"))

	c := newTestClient(t, Config{RootCAs: s.pool()}, nil)
	_, _, err := get(t, c, s.URL)
	require.ErrorIs(t, err, ErrForbiddenAddress)
	var ue *url.Error
	require.ErrorAs(t, err, &ue, "net/http's wrapping is kept")
	require.True(t, Refused(err))
	s.requireUntouched(t)

	allowed := newTestClient(t, Config{RootCAs: s.pool(), AllowCIDRs: prefixes("127.0.0.0/8")}, nil)
	// A proxy from the environment would connect wherever it is asked to.
	require.Nil(t, allowed.https.Proxy)
	require.Nil(t, allowed.plain.Proxy)
	resp, body, err := get(t, allowed, s.URL)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "hello", string(body))
}

func TestPlainHTTPOnlyToAllowedNetworks(t *testing.T) {
	t.Parallel()
	s := startServer(t, "127.0.0.1", false, text("plain"))

	// Without AllowCIDRs plain http is refused before any lookup.
	c := newTestClient(t, Config{}, nil)
	_, _, err := get(t, c, s.URL)
	require.ErrorIs(t, err, ErrForbiddenScheme)
	_, _, err = get(t, c, "ftp://example.com/file")
	require.ErrorIs(t, err, ErrForbiddenScheme)
	s.requireUntouched(t)

	// With them, plain http reaches allowed addresses but not public ones.
	r := &fakeResolver{hosts: map[string][]netip.Addr{"public.example.com": addrs("93.184.215.14")}}
	allowed := newTestClient(t, Config{AllowCIDRs: prefixes("127.0.0.0/8"), Resolver: r}, nil)
	_, body, err := get(t, allowed, s.URL)
	require.NoError(t, err)
	require.Equal(t, "plain", string(body))
	_, _, err = get(t, allowed, "http://public.example.com/")
	require.ErrorIs(t, err, ErrForbiddenScheme)
	_, _, err = get(t, allowed, "http://93.184.215.14/")
	require.ErrorIs(t, err, ErrForbiddenScheme)
}

func TestNameResolvingToLoopbackRefused(t *testing.T) {
	t.Parallel()
	s := startServer(t, "127.0.0.1", true, text("secret"))
	r := &fakeResolver{hosts: map[string][]netip.Addr{
		"pds.example.com":    addrs("127.0.0.1"),
		"mapped.example.com": addrs("::ffff:127.0.0.1"),
		"nat64.example.com":  addrs("64:ff9b::7f00:1"),
	}}
	c := newTestClient(t, Config{RootCAs: s.pool(), Resolver: r}, nil)
	for _, host := range []string{"pds.example.com", "mapped.example.com", "nat64.example.com"} {
		_, _, err := get(t, c, "https://"+host+":"+s.port()+"/")
		require.ErrorIs(t, err, ErrForbiddenAddress, host)
	}
	// localhost through the system resolver (/etc/hosts).
	sys := newTestClient(t, Config{RootCAs: s.pool()}, nil)
	_, _, err := get(t, sys, "https://localhost:"+s.port()+"/")
	require.ErrorIs(t, err, ErrForbiddenAddress)
	s.requireUntouched(t)
}

func TestLiteralMappedIPv6Refused(t *testing.T) {
	t.Parallel()
	s := startServer(t, "127.0.0.1", true, text("secret"))
	c := newTestClient(t, Config{RootCAs: s.pool()}, nil)
	for _, host := range []string{"[::ffff:127.0.0.1]", "[::ffff:7f00:1]", "[64:ff9b::127.0.0.1]", "[::127.0.0.1]", "0.0.0.0", "[::]"} {
		_, _, err := get(t, c, "https://"+host+":"+s.port()+"/")
		require.ErrorIs(t, err, ErrForbiddenAddress, host)
	}
	s.requireUntouched(t)

	// The mapped form of an allowed address is allowed, and reaches it.
	allowed := newTestClient(t, Config{RootCAs: s.pool(), AllowCIDRs: prefixes("127.0.0.1/32")}, nil)
	_, body, err := get(t, allowed, "https://[::ffff:127.0.0.1]:"+s.port()+"/")
	require.NoError(t, err)
	require.Equal(t, "secret", string(body))
}

func TestOnlyPermittedAddressesOfANameAreDialled(t *testing.T) {
	t.Parallel()
	good := startServer(t, "127.0.0.2", true, text("good"))
	l, err := net.Listen("tcp", "127.0.0.1:"+good.port())
	if err != nil {
		t.Skipf("127.0.0.1:%s is taken: %v", good.port(), err)
	}
	bad := &testServer{Server: httptest.NewUnstartedServer(text("bad"))}
	bad.Listener.Close()
	bad.Listener = &countingListener{Listener: l, n: &bad.accepts}
	bad.StartTLS()
	t.Cleanup(bad.Close)

	r := &fakeResolver{hosts: map[string][]netip.Addr{"mixed.example.com": addrs("127.0.0.1", "127.0.0.2")}}
	c := newTestClient(t, Config{RootCAs: good.pool(), Resolver: r, AllowCIDRs: prefixes("127.0.0.2/32")}, nil)
	_, body, err := get(t, c, "https://mixed.example.com:"+good.port()+"/")
	require.NoError(t, err)
	require.Equal(t, "good", string(body))
	bad.requireUntouched(t)
}

func TestRedirects(t *testing.T) {
	t.Parallel()
	target := startServer(t, "127.0.0.1", true, text("internal"))
	plainTarget := startServer(t, "127.0.0.1", false, text("internal"))
	mux := http.NewServeMux()
	mux.HandleFunc("/to-loopback", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target.URL+"/admin", http.StatusFound)
	})
	mux.HandleFunc("/to-plain", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, plainTarget.URL+"/admin", http.StatusFound)
	})
	mux.HandleFunc("/hop", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/final", http.StatusMovedPermanently)
	})
	mux.Handle("/final", text("arrived"))
	front := startServer(t, "127.0.0.2", true, mux)
	r := &fakeResolver{hosts: map[string][]netip.Addr{"front.example.com": addrs("127.0.0.2")}}
	c := newTestClient(t, Config{RootCAs: front.pool(), AllowCIDRs: prefixes("127.0.0.2/32"), Resolver: r}, nil)
	frontURL := "https://front.example.com:" + front.port()

	// By default a redirect is not followed.
	_, _, err := get(t, c, frontURL+"/to-loopback")
	require.ErrorIs(t, err, ErrRedirect)
	var ue *url.Error
	require.ErrorAs(t, err, &ue)
	resp, err := c.HTTPClient().Get(frontURL + "/hop")
	require.ErrorIs(t, err, ErrRedirect)
	require.Equal(t, http.StatusMovedPermanently, resp.StatusCode, "the redirect itself comes back, body closed")

	// Followed, every hop is checked again: address and scheme.
	_, _, err = get(t, c, frontURL+"/to-loopback", WithRedirects(3))
	require.ErrorIs(t, err, ErrForbiddenAddress)
	_, _, err = get(t, c, frontURL+"/to-plain", WithRedirects(3))
	require.ErrorIs(t, err, ErrForbiddenScheme)
	target.requireUntouched(t)
	plainTarget.requireUntouched(t)

	// A permitted hop is followed, up to the limit.
	_, body, err := get(t, c, frontURL+"/hop", WithRedirects(1))
	require.NoError(t, err)
	require.Equal(t, "arrived", string(body))
}

func TestResponseSizeLimit(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("x", 2000)
	mux := http.NewServeMux()
	mux.Handle("/announced", text(big))
	mux.HandleFunc("/streamed", func(w http.ResponseWriter, r *http.Request) {
		for i := 0; i < 20; i++ {
			_, _ = io.WriteString(w, big[:100])
			w.(http.Flusher).Flush()
		}
	})
	mux.Handle("/exact", text(big[:1000]))
	mux.Handle("/json", text(`{"a":"`+big+`"}`))
	s := startServer(t, "127.0.0.1", true, mux)
	c := newTestClient(t, Config{RootCAs: s.pool(), AllowCIDRs: prefixes("127.0.0.0/8")}, nil)

	_, _, err := get(t, c, s.URL+"/announced", WithMaxBytes(1000))
	require.ErrorIs(t, err, ErrResponseTooLarge)
	resp, _, err := get(t, c, s.URL+"/streamed", WithMaxBytes(1000))
	require.ErrorIs(t, err, ErrResponseTooLarge)
	require.Equal(t, int64(-1), resp.ContentLength, "the streamed answer announces no length")
	_, body, err := get(t, c, s.URL+"/exact", WithMaxBytes(1000))
	require.NoError(t, err)
	require.Len(t, body, 1000)

	var v map[string]string
	require.ErrorIs(t, c.GetJSON(context.Background(), s.URL+"/json", 100, &v), ErrResponseTooLarge)
	require.NoError(t, c.GetJSON(context.Background(), s.URL+"/json", 0, &v))
	require.Len(t, v["a"], 2000)

	small := newTestClient(t, Config{RootCAs: s.pool(), AllowCIDRs: prefixes("127.0.0.0/8"), MaxResponseBytes: 1500}, nil)
	_, _, err = get(t, small, s.URL+"/streamed")
	require.ErrorIs(t, err, ErrResponseTooLarge)
	resp, err = small.HTTPClient().Get(s.URL + "/streamed")
	require.NoError(t, err)
	_, err = io.ReadAll(resp.Body)
	resp.Body.Close()
	require.ErrorIs(t, err, ErrResponseTooLarge)
}

func TestSlowServerTimesOut(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	// stall waits until the test ends. When the client gives up first, the
	// handler ends the connection without finishing the answer: closing a
	// TLS connection sends close_notify first, and a server that answered
	// it at once could slip a complete answer in before the socket closes.
	stall := func(r *http.Request) {
		select {
		case <-r.Context().Done():
			panic(http.ErrAbortHandler)
		case <-release:
		}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/headers", func(w http.ResponseWriter, r *http.Request) { stall(r) })
	mux.HandleFunc("/body", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "{")
		w.(http.Flusher).Flush()
		stall(r)
	})
	s := startServer(t, "127.0.0.1", true, mux)
	t.Cleanup(func() { close(release) }) // runs before the server closes
	c := newTestClient(t, Config{RootCAs: s.pool(), AllowCIDRs: prefixes("127.0.0.0/8"), Timeout: 200 * time.Millisecond}, nil)

	_, _, err := get(t, c, s.URL+"/headers")
	requireTimeout(t, err)
	_, _, err = get(t, c, s.URL+"/body")
	requireTimeout(t, err)
	var v any
	requireTimeout(t, c.GetJSON(context.Background(), s.URL+"/body", 0, &v))

	// A call may shorten the client's default (here DefaultTimeout).
	long := newTestClient(t, Config{RootCAs: s.pool(), AllowCIDRs: prefixes("127.0.0.0/8")}, nil)
	_, _, err = get(t, long, s.URL+"/headers", WithTimeout(200*time.Millisecond))
	requireTimeout(t, err)
}

func requireTimeout(t *testing.T, err error) {
	t.Helper()
	var ne net.Error
	require.ErrorAs(t, err, &ne)
	require.True(t, ne.Timeout(), "%v", err)
}

func TestUserAgentAndStatusError(t *testing.T) {
	t.Parallel()
	s := startServer(t, "127.0.0.1", true, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/missing" {
			http.NotFound(w, r)
			return
		}
		_, _ = io.WriteString(w, `{"ua":"`+r.UserAgent()+`"}`)
	}))
	c := newTestClient(t, Config{RootCAs: s.pool(), AllowCIDRs: prefixes("127.0.0.0/8"), UserAgent: "bulwark-test"}, nil)
	var v struct{ UA string }
	require.NoError(t, c.GetJSON(context.Background(), s.URL+"/", 0, &v))
	require.Equal(t, "bulwark-test", v.UA)

	err := c.GetJSON(context.Background(), s.URL+"/missing", 0, &v)
	var se *StatusError
	require.ErrorAs(t, err, &se)
	require.Equal(t, http.StatusNotFound, se.StatusCode)
	require.False(t, Refused(err))
	require.False(t, Refused(errors.New("other")))
}

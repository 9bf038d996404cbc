package pds

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/budget"
	"github.com/bulwark-pds/bulwark/config"
)

// admissionWait bounds the waits below, so that a server that lets the
// trickle through fails the test instead of hanging it. It is not a
// performance assertion.
const admissionWait = time.Minute

// tricklingService is a service that answers 200 at once and then sends a byte
// every 100 ms for as long as the request lasts; each request it gets is
// reported on started, true when it carries a service token.
func tricklingService(t *testing.T) (*upstream, <-chan bool) {
	started := make(chan bool, 1024)
	up := newUpstream(t, false, func(w http.ResponseWriter, r *http.Request) {
		started <- r.Header.Get("Authorization") != ""
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			if _, err := io.WriteString(w, " "); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-tick.C:
			}
		}
	})
	return up, started
}

// trickleEnv is a server on the smallest in-flight budget (16 MiB) with a
// trickling service anyone can name in an atproto-proxy header.
type trickleEnv struct {
	*proxyEnv
	header  string
	started <-chan bool
	ctx     context.Context
	wg      sync.WaitGroup
	status  chan int
}

// With appView, the trickling service is the configured app view too.
func newTrickleEnv(t *testing.T, appView bool) *trickleEnv {
	b := budget.New(budget.Config{Capacity: 16 << 20})
	up, started := tricklingService(t)
	e := newProxyEnv(t, proxyEnvOptions{
		configure: func(c *config.Config) {
			// The trickle (10 bytes a second) within the time bounds:
			// only admission holds it back here.
			c.ProxyMinRate, c.ProxyTotalTimeout = 1, time.Hour
			c.TrustedProxies = loopback
			if appView {
				c.AppViewURL = up.URL
			}
		},
		options: func(o *Options) { o.Budget = b },
	})
	ctx, cancel := context.WithCancel(context.Background())
	te := &trickleEnv{proxyEnv: e, started: started, ctx: ctx, status: make(chan int, 1024)}
	te.header = e.registerService(t, "bsky_appview", up.URL).String() + "#bsky_appview"
	// Before the trickler closes (cleanups run last first): end the
	// requests, then wait for their goroutines.
	t.Cleanup(func() { cancel(); te.wg.Wait() })
	return te
}

// trickle starts an anonymous proxied request to the trickler as coming
// from addr; its status goes to te.status once its headers are in.
func (te *trickleEnv) trickle(t *testing.T, addr string) {
	te.trickleAs(t, addr, "", te.header)
}

// trickleAs is trickle with a session token and an atproto-proxy header
// (or none: to the app view).
func (te *trickleEnv) trickleAs(t *testing.T, addr, token, header string) {
	req, err := http.NewRequestWithContext(te.ctx, http.MethodGet, te.url+"/xrpc/app.bsky.feed.getTimeline", nil)
	require.NoError(t, err)
	if header != "" {
		req.Header.Set("Atproto-Proxy", header)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	req.Header.Set("X-Forwarded-For", addr)
	te.wg.Add(1)
	go func() {
		defer te.wg.Done()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return
		}
		te.status <- resp.StatusCode
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}()
}

// await waits for n answers with status, or n requests reaching the
// trickler when status is 0 (signed-in ones only when signed).
func (te *trickleEnv) await(t *testing.T, status, n int) { te.awaitSigned(t, status, n, false) }

func (te *trickleEnv) awaitSigned(t *testing.T, status, n int, signed bool) {
	t.Helper()
	limit := time.After(admissionWait)
	for got := 0; got < n; {
		var c <-chan bool
		if status == 0 {
			c = te.started
		}
		select {
		case s := <-te.status:
			if s == status {
				got++
			} else if s != http.StatusOK {
				t.Fatalf("a trickling request was answered %d", s)
			}
		case withToken := <-c:
			if withToken || !signed {
				got++
			}
		case <-limit:
			t.Fatalf("%d of %d awaited (status %d)", got, n, status)
		}
	}
}

// stillServes checks that the server's own reads and a signed-in caller's
// proxied requests are answered while the trickle holds what it may.
func (te *trickleEnv) stillServes(t *testing.T, u *user) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), admissionWait)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, te.url+"/xrpc/com.atproto.sync.getRepo?did="+url.QueryEscape(u.did.String()), nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err, "an anonymous getRepo is answered")
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)

	chat := te.call(t, "chat.bsky.convo.listConvos", u.access, te.fakes.Chat.DID.String()+"#bsky_chat", nil)
	require.Equal(t, http.StatusOK, chat.status, "a signed-in caller's header-named service: %s", chat.body)
	prof := te.call(t, "app.bsky.actor.getProfile", "", "", url.Values{"actor": {u.did.String()}})
	require.Equal(t, http.StatusOK, prof.status, "the app view, anonymously: %s", prof.body)
}

// 150 trickling proxied answers from one address: the address gets
// --proxy-max-per-client of them in flight and 429 for the rest, those in
// flight hold only the anonymous callers' pool, and an anonymous getRepo,
// a signed-in caller's chat and the app view are answered meanwhile.
// Before pools and the per-client cap, 140 such answers filled a 16 MiB
// budget and getRepo waited behind them for as long as they trickled.
func TestProxyTrickleFromOneAddress(t *testing.T) {
	t.Parallel()
	te := newTrickleEnv(t, false)
	u := te.createUser(t)
	for range 150 {
		te.trickle(t, "203.0.113.7")
	}
	te.await(t, http.StatusTooManyRequests, 150-config.DefaultProxyMaxPerClient)
	// The anonymous pool is a 32nd of the budget: four fixed shares.
	te.await(t, 0, (16<<20)/anonymousHeaderShare/proxyReserve)
	te.stillServes(t, u)

	// An IPv6 /64 is one address.
	for i := range config.DefaultProxyMaxPerClient + 1 {
		te.trickle(t, fmt.Sprintf("2001:db8:1:2::%x", i+1))
	}
	te.await(t, http.StatusTooManyRequests, 1)
}

// The same from 150 addresses: no address is over its cap, but together
// they hold no more than the anonymous callers' pool, and wait for it
// holding nothing; the server's own reads and signed-in callers' proxied
// requests go on.
func TestProxyTrickleFromManyAddresses(t *testing.T) {
	t.Parallel()
	te := newTrickleEnv(t, false)
	u := te.createUser(t)
	for i := range 150 {
		a := netip.AddrFrom4([4]byte{198, 51, byte(100 + i/200), byte(1 + i%200)})
		te.trickle(t, a.String())
	}
	te.await(t, 0, (16<<20)/anonymousHeaderShare/proxyReserve)
	t0 := time.Now()
	te.stillServes(t, u)
	t.Logf("stillServes took %s; started so far %d", time.Since(t0), len(te.started))
	answered := 0
	for len(te.status) > 0 {
		require.Equal(t, http.StatusOK, <-te.status, "those over the pool wait; nobody is refused")
		answered++
	}
	require.LessOrEqual(t, answered, (16<<20)/anonymousHeaderShare/proxyReserve, "only those in the pool have their answers")
}

// An app view that is slow to answer what anonymous callers ask, asked
// from 150 addresses: their requests hold only their share of the app
// view's pool, a signed-in caller's still reach it, and the server's own
// reads go on.
func TestProxySlowAppView(t *testing.T) {
	t.Parallel()
	te := newTrickleEnv(t, true)
	u := te.createUser(t)
	for i := range 150 {
		te.trickleAs(t, netip.AddrFrom4([4]byte{198, 51, byte(100 + i/200), byte(1 + i%200)}).String(), "", "")
	}
	te.await(t, 0, (16<<20)/anonymousConfiguredShare/proxyReserve)
	te.trickleAs(t, "203.0.113.9", u.access, "")
	te.awaitSigned(t, 0, 1, true)
	ctx, cancel := context.WithTimeout(context.Background(), admissionWait)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, te.url+"/xrpc/com.atproto.sync.getRepo?did="+url.QueryEscape(u.did.String()), nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err, "an anonymous getRepo is answered")
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
}
